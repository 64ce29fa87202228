// The backend of the model runtime. The forward pass (model/forward.cpp) is written once
// against this interface; each backend (CPU reference here: model/cpu_model_ops.*, CUDA in
// model/cuda/) owns
//   - its prepared weights (prepare(): the CPU dequantizes to float32, CUDA packs/uploads),
//   - its activation buffers, one per Buf, each [limits.max_tokens, buf_width(buf)] bf16,
//   - its paged KV cache storage: per layer k/v [kv_num_blocks, kv_block_size, n_kv, head_dim]
//     bf16, or for MLA one latent cache [kv_num_blocks, kv_block_size, kv_lora + rope] bf16
//     (runtime/kv_cache.h does the block bookkeeping on the host),
//   - the logits of the current step, f32 [R, vocab] for the step's logit_rows.
// Every op works on the first T = step.num_tokens() rows of its buffers (decode: T = S).
// Ops may run asynchronously (one stream); read_logits, sample and logprobs return host data and
// so synchronise. Ops never allocate after prepare() (CUDA graph capture of decode steps).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "model/model_weights.h"
#include "model/step_batch.h"
#include "ops/sampling/logprobs.h"
#include "ops/sampling/sampling.h"
#include "runtime/kv_cache.h"

namespace tetra::model {

// One step's draws (ops/sampling/sampling.h): token i from logit row logit_rows[i] (null: row i)
// with params[i] and row i of the histories and biases, all on the host.
// With logprob_top, the draws' logprobs in the same call (one round trip on a device backend):
// row i with logprob_top[i] >= 0 and a token >= 0 gets its token's logprob under the raw logit
// row and its logprob_top[i] most likely alternatives in logprobs[i] (ops/sampling/logprobs.h);
// the other rows' entries are left empty.
struct SampleBatch {
  int rows = 0;
  const int32_t* logit_rows = nullptr;          // [rows] or null
  const ops::SamplingParams* params = nullptr;  // [rows]
  ops::TokenHistory history;
  ops::LogitBias bias;
  const int32_t* logprob_top = nullptr;         // [rows] or null; -1: no logprobs for the row
  ops::PositionLogprobs* logprobs = nullptr;    // [rows], written where logprob_top is set
};

// A backend's logprobs of the tokens it sampled (SampleBatch::logprob_top) through its
// logprobs(): the queries of the asking rows, then their answers into batch.logprobs.
class ModelOps;
void logprobs_of_sampled(ModelOps& ops, const SampleBatch& batch, const int32_t* tokens);

// Named activation buffers, bf16 row-major [max_tokens, width]:
enum class Buf : int {
  Residual,  // [T, H] residual stream
  Normed,    // [T, H] RMSNorm output: attention / MLP input, final hidden state
  Q,         // [T, n_heads * head_dim] (MLA: head_dim = nope + rope)
  K,         // [T, n_kv_heads * head_dim] (GQA only)
  V,         // [T, n_kv_heads * head_dim] (GQA only)
  Attn,      // [T, n_heads * head_dim] attention output, o_proj input (MLA: n_heads * v_head_dim)
  Gate,      // [T, intermediate_size] dense MLP gate, then silu(gate) * up
  Up,        // [T, intermediate_size] dense MLP up
  Out,       // [T, H] block output (o_proj, MLP, MoE) before it joins the residual
  // MLA only (width 0 for GQA models), ops/attention/mla.h:
  QLatent,     // [T, q_lora_rank] q_a_proj output, normed in place
  KvA,         // [T, kv_lora + rope] kv_a_proj_with_mqa output
  QAbsorbed,   // [T, n_heads * (kv_lora + rope)] queries in the latent space
  AttnLatent,  // [T, n_heads * kv_lora] attention output before W_uv
  // GLM-5's DSA indexer only (width 0 otherwise), ops/attention/dsa.h:
  IdxQ,  // [T, index_n_heads * index_head_dim] indexer.wq_b output
  IdxK,  // [T, index_head_dim] indexer.wk output
  IdxW,  // [T, index_n_heads] indexer.weights_proj output
  Count
};
const char* buf_name(Buf b);
// Width (elements per row) of a buffer for a model. Gate/Up: intermediate_size (dense layers).
int64_t buf_width(Buf b, const ModelConfig& c);

// Which of a layer's linears (lm_head has its own op, logits()).
// MLA: Q is q_b_proj (or q_proj without q compression), QA q_a_proj, KvA kv_a_proj_with_mqa.
// DSA: IdxQ indexer.wq_b, IdxK indexer.wk, IdxW indexer.weights_proj.
enum class LinearId { Q, K, V, O, DenseGate, DenseUp, DenseDown, QA, KvA, IdxQ, IdxK, IdxW };
const char* linear_id_name(LinearId id);
// Which RMSNorm weight: per layer Input / PostAttention / QHead / KHead / QLatent (MLA's
// q_a_layernorm, over q_lora_rank, eps kMlaLatentNormEps), or the model's Final.
enum class NormId { Input, PostAttention, QHead, KHead, Final, QLatent };
// MLA's latent norms (q_a_layernorm, kv_a_layernorm) use the reference's RMSNorm default eps,
// whatever the config's rms_norm_eps.
inline constexpr float kMlaLatentNormEps = 1e-6f;

class ModelOps {
 public:
  virtual ~ModelOps() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda"

  // Once, before any step: prepares the weights (which may be dropped afterwards: a backend
  // keeps what it needs) and sizes buffers, KV cache and logits for `limits`. Throws
  // tetra::Error when the model or limits cannot be served (e.g. MoE backend refused).
  virtual void prepare(const ModelWeights& weights, const OpsLimits& limits) = 0;

  // Starts a step: takes the step's tokens, positions, slots, cu_seqlens, block tables,
  // seq_lens and logit rows (already validated by the caller). The step stays alive and
  // unchanged until the step's last op (a backend may keep a pointer to it).
  virtual void begin_step(const StepBatch& step) = 0;

  // out [T, H] = embedding[tokens[t]].
  virtual void embed(Buf out) = 0;
  // out [T, width] = rms_norm(in) * w, w = norm `which` of `layer` (layer ignored for Final);
  // width H, or q_lora_rank for QLatent. out may be in.
  virtual void rms_norm(NormId which, int layer, Buf in, Buf out) = 0;
  // residual [T, H] <- bf16(x + residual); out [T, H] = rms_norm(residual) * w (out may be x).
  virtual void add_rms_norm(NormId which, int layer, Buf x, Buf residual, Buf out) = 0;
  // out [T, N] = in [T, K] . W^T (+ bias), W = linear `which` of `layer`, rounded to bf16.
  virtual void linear(LinearId which, int layer, Buf in, Buf out) = 0;
  // The attention's three projections of one input: q [T, n_heads*hd], k and v [T, n_kv*hd],
  // each exactly as linear() writes it. A backend may run the three as one launch.
  virtual void qkv(int layer, Buf in, Buf q, Buf k, Buf v) {
    linear(LinearId::Q, layer, in, q);
    linear(LinearId::K, layer, in, k);
    linear(LinearId::V, layer, in, v);
  }
  // A dense SwiGLU MLP's first half: gate [T, width] <- silu(in . Wg^T) * (in . Wu^T); up
  // [T, width] is scratch. A backend may fuse it (then gate and up are not rounded to bf16 before
  // the product, as the MoE experts do).
  virtual void dense_gate_up(int layer, Buf in, Buf gate, Buf up, int64_t width) {
    linear(LinearId::DenseGate, layer, in, gate);
    linear(LinearId::DenseUp, layer, in, up);
    silu_mul(gate, up, width, gate);
  }
  // In place per-head RMSNorm of x ([T, heads, head_dim]; which = QHead on Q, KHead on K).
  virtual void head_norm(NormId which, int layer, Buf x) = 0;
  // Both of a layer's head norms (q's, then k's); a backend may run them as one launch.
  virtual void qk_head_norm(int layer, Buf q, Buf k) {
    head_norm(NormId::QHead, layer, q);
    head_norm(NormId::KHead, layer, k);
  }
  // In place RoPE of q [T, n_heads, head_dim] and k [T, n_kv_heads, head_dim] at the step's
  // positions (config rope theta, partial rotary factor, NeoX or GPT-J pairing), then k and
  // v [T, n_kv_heads, head_dim] into layer's cache at the step's slots (one op: a backend may
  // fuse the two). q, k, v are distinct buffers.
  virtual void rope_write_kv(int layer, Buf q, Buf k, Buf v) = 0;
  // Prefill: causal attention of each sequence over its own tokens (cu_seqlens), GQA,
  // scale head_dim^-0.5. q [T, n_heads, hd], k/v [T, n_kv, hd] -> out [T, n_heads, hd].
  virtual void prefill_attention(Buf q, Buf k, Buf v, Buf out) = 0;
  // Decode: each sequence's one query attends to its seq_lens[s] cached tokens of `layer`
  // (block tables of the step). q [S, n_heads, hd] -> out [S, n_heads, hd].
  virtual void decode_attention(int layer, Buf q, Buf out) = 0;
  // A decode step's rope_write_kv followed by decode_attention (same arguments, same results,
  // the cache included); a backend may run both in one launch.
  virtual void rope_decode_attention(int layer, Buf q, Buf k, Buf v, Buf out) {
    rope_write_kv(layer, q, k, v);
    decode_attention(layer, q, out);
  }
  // Prefill with a cached prefix (step.has_cached_prefix(), after rope_write_kv stored this
  // step's k/v): each new token attends causally to its sequence's cache positions 0 .. its own
  // (block tables and seq_lens of the step, GQA, scale head_dim^-0.5).
  // q [T, n_heads, hd] -> out [T, n_heads, hd]. Backends without it refuse chunked prefill.
  virtual void extend_attention(int layer, Buf q, Buf out) {
    (void)layer, (void)q, (void)out;
    TETRA_FAIL("backend ", name(), " cannot prefill with a cached prefix (chunked prefill or "
               "recompute after preemption); it has no extend_attention");
  }
  // MLA attention of `layer` from its projections on (ops/attention/mla.h): q [T, n_heads,
  // nope + rope] (q_b_proj / q_proj output), kv_a [T, kv_lora + rope] (kv_a_proj_with_mqa
  // output) -> out [T, n_heads, v] (o_proj's input). Stores the step's latent rows in layer's
  // cache at the step's slots, then attends causally: a prefill over its own tokens, a prefix
  // prefill and a decode over the sequence's cached rows. Uses QAbsorbed and AttnLatent.
  virtual void mla_attention(int layer, Buf q, Buf kv_a, Buf out) {
    (void)layer, (void)q, (void)kv_a, (void)out;
    TETRA_FAIL("backend ", name(), " has no MLA attention");
  }
  // GLM-5's DSA indexer of `layer` (a layer with indexer weights): stores the step's index
  // keys (LayerNorm + RoPE of k_idx [T, index_head_dim]) in the layer's index cache, then picks
  // for every token the index_topk of its keys that q_idx [T, Hi, D] and w_idx [T, Hi] score
  // highest. The following mla_attention calls (this layer's and those of the "shared" layers
  // after it) read only those keys.
  virtual void dsa_select(int layer, Buf q_idx, Buf k_idx, Buf w_idx) {
    (void)layer, (void)q_idx, (void)k_idx, (void)w_idx;
    TETRA_FAIL("backend ", name(), " has no DSA indexer");
  }
  // out [T, width] = silu(gate) * up (out may be gate).
  virtual void silu_mul(Buf gate, Buf up, int64_t width, Buf out) = 0;
  // The whole MoE block of `layer`: route, routed experts, + shared expert.
  // in [T, H] -> out [T, H].
  virtual void moe(int layer, Buf in, Buf out) = 0;
  // The MoE block and what follows it in the decoder: out = moe(in), all_reduce(out), then
  // add_rms_norm(which, norm_layer, out, residual, normed). A backend may run the add + RMSNorm
  // inside the MoE block's last launch (normed may be in).
  virtual void moe_add_rms_norm(int layer, Buf in, Buf out, NormId which, int norm_layer,
                                Buf residual, Buf normed) {
    moe(layer, in, out);
    all_reduce(out);
    add_rms_norm(which, norm_layer, out, residual, normed);
  }
  // From the attention output on, a MoE layer with its post-attention norm folded away: o_proj
  // adding into the residual in its epilogue, the norm inside the MoE block's first launch, then
  // moe_add_rms_norm's MoE block and add + RMSNorm (which, norm_layer). Same results up to the
  // order of the norm's sum of squares. false: not at this layer and step, nothing ran (the
  // caller runs linear O, all_reduce, add_rms_norm and moe_add_rms_norm).
  virtual bool o_proj_folded_norm_moe(int layer, NormId which, int norm_layer) {
    (void)layer, (void)which, (void)norm_layer;
    return false;
  }
  // logits [R, vocab] f32 = in[logit_rows[r]] . lm_head^T, kept in the backend.
  virtual void logits(Buf in) = 0;
  // Copies the step's logits to host: out [R, vocab] f32.
  virtual void read_logits(float* out) = 0;
  // Samples batch.rows tokens from the step's logits -> tokens [batch.rows] int32 on the host,
  // and their logprobs where batch.logprob_top asks.
  virtual void sample(const SampleBatch& batch, int32_t* tokens) = 0;
  // Log-probabilities under the step's raw logits (ops/sampling/logprobs.h): queries [n] (rows
  // index the step's logit rows) -> out [n].
  virtual void logprobs(const ops::LogprobQuery* queries, int n, ops::PositionLogprobs* out) = 0;
  // Tensor parallel: b [T, H] (a row-split layer's partial sums) becomes the sum over all ranks.
  // A no-op on a backend that runs the whole model on one device.
  virtual void all_reduce(Buf b) { (void)b; }
  // Copy-on-write after a fork: every layer's block src becomes a copy into dst.
  virtual void copy_kv_blocks(const std::vector<runtime::BlockCopy>& copies) = 0;
};

// ---- backend registry: backends register themselves, the runtime creates them by name ----
using ModelOpsFactory = std::unique_ptr<ModelOps> (*)();

// In the backend's .cpp:  static const ModelOpsRegistration kReg{"cuda", &make_cuda_ops};
// NOTE: tetra_lib is a static archive: an object file nothing references is not linked in,
// so a backend that only registers itself must also be referenced from the binary (the CPU
// backend is referenced by the registry itself).
struct ModelOpsRegistration {
  ModelOpsRegistration(const char* name, ModelOpsFactory factory);
};

// "cpu", "cuda", ...: a new backend. "auto": cuda when registered and a GPU is present, else cpu.
// Unknown or unavailable names throw tetra::Error listing the registered backends.
std::unique_ptr<ModelOps> make_model_ops(std::string_view name);
std::vector<std::string> model_ops_names();  // registered backends, sorted
// The name "auto" resolves to on this machine.
std::string resolve_model_ops_name(std::string_view name);

}  // namespace tetra::model
