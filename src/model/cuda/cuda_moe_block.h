// One layer's MoE block for the cuda model backend: the MoE layer runner (moe/moe_layer.h) built
// from the layer's weight views, or, for benchmarks, a full-size runner with random NVFP4 weights
// generated on the GPU (the weights then only give shapes and routing parameters).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "model/model_weights.h"
#include "moe/moe_layer.h"

namespace tetra::model::cuda {

struct CudaMoeBlockSpec {
  int layer = 0;           // for error messages
  int hidden = 0;          // H
  int max_tokens = 0;      // largest T one forward takes (the backend chunks prefill)
  std::string backend;     // MoE backend name ("auto", "cuda-w4a16", ...)
  bool random = false;     // random NVFP4 weights instead of the views' data
  uint64_t* seed = nullptr;  // random only: advanced by each random layer
};

struct CudaMoeBlock {
  std::unique_ptr<moe::MoeLayerRunner> runner;
  size_t weight_bytes = 0;  // device bytes of the experts (routed + shared), 0 when on the host
};

// Throws tetra::Error naming the layer (no experts, backend refused, ...).
CudaMoeBlock make_cuda_moe_block(const MoeWeights& mw, const CudaMoeBlockSpec& spec);

}  // namespace tetra::model::cuda
