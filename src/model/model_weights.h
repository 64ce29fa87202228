// A checkpoint's tensors organised the way the forward pass reads them: per layer, as borrowed
// views into the memory-mapped Checkpoint (zero copy). Loading checks every tensor the GQA
// architectures (Glm4Moe, Qwen3Moe) need, names the missing or malformed one, and refuses NaN
// block scales, non-finite global scales and Inf/NaN in any high-precision tensor (one read of
// each; NVFP4 codes cannot be non-finite). MLA models (GLM-5, DeepSeek-V3) load their latent
// attention projections and GLM-5's sparse-attention (DSA) indexer.
//
// Lifetime: every view points into the Checkpoint passed to load(); keep it alive (Model does).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "format/checkpoint.h"
#include "format/model_config.h"
#include "format/tensor_view.h"
#include "moe/router.h"

namespace tetra::model {

// One linear layer y[M, N] = x[M, K] . W^T (+ b), either ModelOpt NVFP4 or high precision.
struct LinearWeight {
  std::string module;  // HF module name, e.g. "model.layers.3.self_attn.q_proj"
  int64_t out_features = 0;  // N
  int64_t in_features = 0;   // K
  bool quantized = false;
  TensorView weight;  // NVFP4: [N, K/2] U8 e2m1 pairs, low nibble = even k; else [N, K] BF16/F16/F32
  std::optional<TensorView> weight_scale;  // NVFP4 only: [N, K/16] F8_E4M3 block scales, row-major
  float weight_scale_2 = 1.0f;             // NVFP4 only: per-tensor global scale (finite, > 0)
  std::optional<float> input_scale;        // NVFP4 (W4A4) only: activation global scale
  std::optional<TensorView> bias;          // [N] BF16/F16/F32
};

// silu(gate(x)) * up(x) -> down. gate/up [I, H], down [H, I].
struct MlpWeights {
  LinearWeight gate, up, down;
  int64_t inter() const { return gate.out_features; }  // I
};

// GLM-5's DSA indexer of one layer (ops/attention/dsa.h).
struct IndexerWeights {
  LinearWeight wq_b;          // [index_n_heads * index_head_dim, q_lora]
  LinearWeight wk;            // [index_head_dim, H]
  TensorView k_norm_weight;   // [index_head_dim] LayerNorm
  TensorView k_norm_bias;     // [index_head_dim]
  LinearWeight weights_proj;  // [index_n_heads, H]
};

// MLA's latent projections (ops/attention/mla.h): q = q_b(rmsnorm(q_a(x))) (or q_proj(x)),
// [latent | k_pe] = kv_a(x), per head [k_nope | v] = kv_b(rmsnorm(latent)).
struct MlaWeights {
  std::optional<LinearWeight> q_a;    // [q_lora, H] q_a_proj; none when q_lora_rank is 0
  std::optional<TensorView> q_a_norm; // [q_lora] q_a_layernorm.weight
  LinearWeight kv_a;                  // [kv_lora + rope, H] kv_a_proj_with_mqa
  TensorView kv_a_norm;               // [kv_lora] kv_a_layernorm.weight
  LinearWeight kv_b;                  // [n_heads * (nope + v), kv_lora] kv_b_proj
  // GLM-5 layers whose indexer_types entry is "full"; "shared" layers reuse the selection of
  // the layer before them.
  std::optional<IndexerWeights> indexer;
};

struct AttentionWeights {
  LinearWeight q;  // GQA [n_heads * head_dim, H]; MLA q_b_proj [n_heads * (nope + rope), q_lora] or q_proj
  LinearWeight k;  // [n_kv_heads * head_dim, H] (GQA only)
  LinearWeight v;  // [n_kv_heads * head_dim, H] (GQA only)
  LinearWeight o;  // [H, n_heads * head_dim] (MLA: [H, n_heads * v_head_dim])
  std::optional<TensorView> q_norm;  // [head_dim] per-head RMSNorm weight (use_qk_norm / Qwen3)
  std::optional<TensorView> k_norm;  // [head_dim]
  std::optional<MlaWeights> mla;     // MLA models
};

struct MoeWeights {
  TensorView router;                          // [E, H] BF16/F16/F32 (mlp.gate.weight)
  std::optional<TensorView> correction_bias;  // [E] F32 e_score_correction_bias (choice only)
  moe::RouterParams router_params;            // from the config's routing fields
  std::vector<MlpWeights> experts;            // [E] routed experts, gate/up [I, H], down [H, I]
  // Expert parallel: experts[i] is global expert expert_begin + i of global_experts (the router
  // and correction bias keep all global_experts rows; moe::MoeLayerWeights::expert_begin). 0 / 0:
  // the layer holds every expert.
  int expert_begin = 0, global_experts = 0;
  std::optional<MlpWeights> shared;           // shared expert(s), fused width n_shared * I
};

struct LayerWeights {
  int index = 0;
  TensorView input_norm;           // [H] input_layernorm.weight
  TensorView post_attention_norm;  // [H] post_attention_layernorm.weight
  AttentionWeights attn;
  bool is_moe = false;
  std::optional<MlpWeights> dense;  // dense layers
  std::optional<MoeWeights> moe;    // MoE layers
};

struct ModelWeights {
  ModelConfig config;
  TensorView embedding;  // [vocab, H] model.embed_tokens.weight
  std::vector<LayerWeights> layers;  // [num_layers]
  TensorView final_norm;  // [H] model.norm.weight
  // [vocab, H]; with tie_word_embeddings it views the embedding (module "model.embed_tokens").
  LinearWeight lm_head;

  // Builds the views from a Checkpoint (which must outlive the result). Throws tetra::Error
  // naming the checkpoint directory and tensor for: an unsupported configuration, a missing tensor, a
  // wrong dtype or shape, a NaN block scale, a non-finite or non-positive global scale, an
  // Inf/NaN element in a high-precision tensor.
  // Runs Checkpoint::validate() first, so shape/dtype errors come as one list.
  static ModelWeights load(const Checkpoint& ckpt);
};

// Why the model runtime (generate, serve, bench decode) cannot run this configuration on any
// backend (RoPE scaling, head counts); empty when it can.
std::vector<std::string> runtime_unsupported_reasons(const ModelConfig& config);
// Refuses architectures the model runtime cannot run with the first of those reasons, prefixed by
// source_label.
void check_runtime_supports(const ModelConfig& config, const std::string& source_label);

}  // namespace tetra::model
