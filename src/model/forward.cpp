// The decoder forward pass, written once against ModelOps (MODELS.md "Decoder block"):
//   x = embed(tokens)
//   per layer L: a = RMSNorm_in(x); h = x + o_proj(Attn(a)); m = RMSNorm_post(h);
//                x = h + (dense MLP or MoE)(m)
//   logits = lm_head(RMSNorm_final(x)) at the step's logit rows
// The residual stream lives in Buf::Residual; each block's output (Buf::Out) joins it in the
// next fused add+norm, so every addition rounds to bf16 once, as the bf16 reference does. The
// norm after a layer's MLP is the next layer's input norm (or the final one): a MoE backend may
// run it inside its last launch (ModelOps::moe_add_rms_norm), and fold the post-attention norm
// into o_proj's epilogue and its own first launch (ModelOps::o_proj_folded_norm_moe).
#include "core/error.h"
#include "model/model.h"

namespace tetra::model {
namespace {

// MLA (DeepSeek-V3, GLM-5): the latent projections, then the backend's absorbed attention
// (ops/attention/mla.h), up to Buf::Attn [T, n_heads * v].
void mla_attention(ModelOps& ops, const LayerWeights& lw) {
  const int L = lw.index;
  if (lw.attn.mla->q_a) {  // q = q_b(rmsnorm(q_a(x)))
    ops.linear(LinearId::QA, L, Buf::Normed, Buf::QLatent);
    ops.rms_norm(NormId::QLatent, L, Buf::QLatent, Buf::QLatent);
    ops.linear(LinearId::Q, L, Buf::QLatent, Buf::Q);
  } else {
    ops.linear(LinearId::Q, L, Buf::Normed, Buf::Q);
  }
  ops.linear(LinearId::KvA, L, Buf::Normed, Buf::KvA);
  if (lw.attn.mla->indexer) {  // GLM-5's DSA: which keys this and the "shared" layers read
    ops.linear(LinearId::IdxQ, L, Buf::QLatent, Buf::IdxQ);
    ops.linear(LinearId::IdxK, L, Buf::Normed, Buf::IdxK);
    ops.linear(LinearId::IdxW, L, Buf::Normed, Buf::IdxW);
    ops.dsa_select(L, Buf::IdxQ, Buf::IdxK, Buf::IdxW);
  }
  ops.mla_attention(L, Buf::Q, Buf::KvA, Buf::Attn);
}

// Up to the attention output (Buf::Attn); o_proj follows in run_forward.
void attention(ModelOps& ops, const LayerWeights& lw, const StepBatch& step) {
  const int L = lw.index;
  if (lw.attn.mla) return mla_attention(ops, lw);
  ops.qkv(L, Buf::Normed, Buf::Q, Buf::K, Buf::V);
  // GLM-4.x use_qk_norm and Qwen3: per-head RMSNorm before RoPE.
  if (lw.attn.q_norm && lw.attn.k_norm) {
    ops.qk_head_norm(L, Buf::Q, Buf::K);
  } else {
    if (lw.attn.q_norm) ops.head_norm(NormId::QHead, L, Buf::Q);
    if (lw.attn.k_norm) ops.head_norm(NormId::KHead, L, Buf::K);
  }
  if (step.kind != StepKind::Prefill && !step.has_cached_prefix()) {
    ops.rope_decode_attention(L, Buf::Q, Buf::K, Buf::V, Buf::Attn);
  } else {
    ops.rope_write_kv(L, Buf::Q, Buf::K, Buf::V);
    if (step.has_cached_prefix())  // chunked prefill: the chunk reads the earlier chunks' cache
      ops.extend_attention(L, Buf::Q, Buf::Attn);
    else
      ops.prefill_attention(Buf::Q, Buf::K, Buf::V, Buf::Attn);
  }
}

// The layer's MLP, the all-reduce of its partial sums, and the add + RMSNorm that follows it
// (norm `which` of `norm_layer`: the next layer's input norm or the final one); a MoE block may
// run that norm in its own last launch.
void mlp_add_rms_norm(ModelOps& ops, const LayerWeights& lw, NormId which, int norm_layer) {
  const int L = lw.index;
  if (lw.moe) {
    ops.moe_add_rms_norm(L, Buf::Normed, Buf::Out, which, norm_layer, Buf::Residual, Buf::Normed);
    return;
  }
  TETRA_CHECK(lw.dense.has_value(), "layer ", L, " has neither a dense MLP nor a MoE block");
  ops.dense_gate_up(L, Buf::Normed, Buf::Gate, Buf::Up, lw.dense->inter());
  ops.linear(LinearId::DenseDown, L, Buf::Gate, Buf::Out);
  ops.all_reduce(Buf::Out);  // down projections hold partial sums under tensor parallelism
  ops.add_rms_norm(which, norm_layer, Buf::Out, Buf::Residual, Buf::Normed);
}

}  // namespace

void run_forward(ModelOps& ops, const ModelWeights& w, const StepBatch& step) {
  ops.begin_step(step);
  ops.embed(Buf::Residual);
  if (w.layers.empty())
    ops.rms_norm(NormId::Final, -1, Buf::Residual, Buf::Normed);
  else
    ops.rms_norm(NormId::Input, w.layers.front().index, Buf::Residual, Buf::Normed);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& lw = w.layers[i];
    attention(ops, lw, step);
    // Then the next layer's input norm, or after the last layer the final norm.
    const bool last = i + 1 == w.layers.size();
    const NormId next = last ? NormId::Final : NormId::Input;
    const int next_layer = last ? -1 : w.layers[i + 1].index;
    if (lw.moe && ops.o_proj_folded_norm_moe(lw.index, next, next_layer)) continue;
    ops.linear(LinearId::O, lw.index, Buf::Attn, Buf::Out);
    ops.all_reduce(Buf::Out);  // o_proj is split by input columns under tensor parallelism
    ops.add_rms_norm(NormId::PostAttention, lw.index, Buf::Out, Buf::Residual, Buf::Normed);
    mlp_add_rms_norm(ops, lw, next, next_layer);
  }
  if (step.num_logit_rows() > 0) ops.logits(Buf::Normed);
}

}  // namespace tetra::model
