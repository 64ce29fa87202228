// Every tensor a Hugging Face checkpoint of a ModelConfig holds, by its exact name, shape and
// dtype — before (model_layout) and after (expected_tensors) choosing how it is quantized.
// The loader checks a checkpoint against this list; the size model and the tiny-checkpoint
// writer are built on it, so all three agree on what a model is.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "format/model_config.h"
#include "format/quant_config.h"

namespace tetra {

enum class ModuleKind {
  Embedding,     // model.embed_tokens
  Attention,     // self_attn projections and their biases (GQA or MLA)
  Indexer,       // GLM-5 DSA indexer (self_attn.indexer.*)
  DenseMlp,      // mlp.{gate,up,down}_proj of dense layers
  SharedExpert,  // mlp.shared_experts.*
  RoutedExpert,  // mlp.experts.E.*
  Router,        // mlp.gate (+ e_score_correction_bias)
  Norm,          // RMSNorm weights (layer norms, q/k norms, MLA latent norms, final norm)
  LmHead,        // lm_head
};
std::string_view module_kind_name(ModuleKind);  // "embedding", "attention", ...

// One linear layer y = W x (+ b), W [out_features, in_features]. `module` is the HF module
// name ("model.layers.3.self_attn.q_a_proj"); tensors are module + ".weight" etc.
// `fuse_group` names the ModelOpt s2-sharing group (NVFP4.md "Layers that share one global
// scale"): ModelOpt unifies weight_scale_2 over every quantized linear that reads the same
// input tensor — q/k/v; gate/up of each dense MLP, shared expert and routed expert; in MLA
// q_a_proj/kv_a_proj_with_mqa (plus GLM-5's indexer.wk, which reads the same normed hidden
// state) and q_b_proj with indexer.wq_b (both read the normed q latent). Empty when alone.
// Only members that are actually quantized share the scale.
// `quantizable`: attention, indexer projections, dense MLP, shared and routed experts; never
// the router, lm_head, or the indexer's weights_proj (kept high precision by the reference).
struct LinearSpec {
  std::string module;
  ModuleKind kind;
  int layer;   // -1 for lm_head
  int expert;  // routed expert index, -1 otherwise
  int64_t out_features, in_features;
  bool bias;  // has module.bias (listed in ModelLayout::others)
  std::string fuse_group;
  bool quantizable;
};

// Any tensor. For a quantized linear P (ModelOpt export):
//   P.weight          U8       [N, K/2]   two E2M1 codes per byte, low nibble = even k
//   P.weight_scale    F8_E4M3  [N, K/16]  block scales, plain row-major
//   P.weight_scale_2  F32      []         weight global scale (checkpoints may store [1])
//   P.input_scale     F32      []         activation global scale; NVFP4 only, not W4A16_NVFP4
// In ModelLayout::others, dtype BF16 stands for "the model's high-precision dtype" (replaced
// by expected_tensors' high_precision); F32 entries (router correction bias) stay F32.
struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  ModuleKind kind;
  int layer;   // -1 for embedding, final norm, lm_head
  int expert;  // routed expert index, -1 otherwise
};

struct ModelLayout {
  std::vector<LinearSpec> linears;  // every linear layer, router and lm_head included
  std::vector<TensorSpec> others;   // norms, embeddings, biases, router correction bias
};

// Main layers only: MTP/NextN layers (index >= num_layers) are not part of it. Tensor names
// are exactly those of the HF checkpoints (model.layers.L.self_attn.q_proj.weight, ...).
ModelLayout model_layout(const ModelConfig&);

// The tensors of one linear when quantized with `algo` (None: one high-precision weight).
// Error naming the module when algo is FP8 (not loadable) or in_features % 16 != 0.
std::vector<TensorSpec> linear_tensors(const LinearSpec&, QuantAlgo algo, DType high_precision);
// The algorithm a linear actually gets: quant.algo_for(module) when quantizable, else None.
QuantAlgo linear_algo(const LinearSpec&, const QuantConfig&);

// Every tensor the checkpoint must hold: linears (quantized per `quant`) then `others`.
// KV-cache scale tensors (k_scale/v_scale, present when kv_cache_quant_algo is set) are
// optional and not listed.
std::vector<TensorSpec> expected_tensors(const ModelLayout&, const QuantConfig&,
                                         DType high_precision = DType::BF16);

}  // namespace tetra
