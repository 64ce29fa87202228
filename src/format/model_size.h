// Parameter counts and bytes of a model as stored in its checkpoint, in total and per decoded
// token: the numbers behind memory planning and the decode floor (MODELS.md "Per-token bytes").
#pragma once
#include <cstdint>
#include <map>

#include "core/dtype.h"
#include "format/model_config.h"
#include "format/model_layout.h"
#include "format/quant_config.h"

namespace tetra {

struct SizeBreakdown {
  int64_t params = 0;  // logical weights (N*K per linear, biases, norms, embeddings)
  double bytes = 0;    // as stored: packed FP4 + block scales + global scales, or dtype bytes
};

struct ModelSize {
  std::map<ModuleKind, SizeBreakdown> total, active;
  SizeBreakdown total_all, active_all;
};

// Main layers only (no MTP). `active` = what one decoded token at batch 1 reads: everything
// except routed experts, plus top_k routed experts per MoE layer (the layer's expert total
// * top_k / n_experts), all of lm_head, and one row of the embedding table (all of it when
// lm_head is tied to it). Router correction biases are buffers: bytes, not params.
ModelSize model_size(const ModelConfig&, const QuantConfig&, DType high_precision = DType::BF16);

}  // namespace tetra
