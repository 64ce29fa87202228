// A model layer's MoE weights (model/model_weights.h views) as the MoE layer runner takes them
// (moe/moe_layer.h MoeLayerWeights): NVFP4 experts as Nvfp4MatrixViews straight into the
// checkpoint, high-precision experts as bf16 (F16/F32 tensors converted, the copies kept here),
// the correction bias as float32. Any backend that builds a MoeLayerRunner can use it. An expert
// parallel layer (MoeWeights::expert_begin) gives the runner its block of experts and the
// whole router.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "model/model_weights.h"
#include "moe/moe_layer.h"

namespace tetra::model {

struct MoeLayerViews {
  moe::MoeLayerWeights weights;  // points into the checkpoint and into the members below
  std::vector<float> bias;                       // [E] correction bias as float32
  std::vector<uint16_t> router_bf16;             // [E, H] when the router is stored F16
  std::deque<std::vector<uint16_t>> converted;   // bf16 copies of F16/F32 expert matrices
};

// One NVFP4 linear of the checkpoint as the MoE and linear kernels take it (borrowed views; the
// input scale rides along for W4A4). Throws when the linear has no weight_scale.
Nvfp4MatrixView nvfp4_view(const LinearWeight& l);

// Throws tetra::Error naming the tensor when the routed experts mix NVFP4 and high precision.
// The result holds pointers into itself: keep it where it is (hence the unique_ptr).
std::unique_ptr<MoeLayerViews> moe_layer_views(const MoeWeights& mw, int layer, int64_t hidden);

}  // namespace tetra::model
