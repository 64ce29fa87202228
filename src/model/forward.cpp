// The decoder forward pass, written once against ModelOps (MODELS.md "Decoder block"):
//   x = embed(tokens)
//   per layer L: a = RMSNorm_in(x); h = x + o_proj(Attn(a)); m = RMSNorm_post(h);
//                x = h + (dense MLP or MoE)(m)
//   logits = lm_head(RMSNorm_final(x)) at the step's logit rows
// The residual stream lives in Buf::Residual; each block's output (Buf::Out) joins it in the
// next fused add+norm, so every addition rounds to bf16 once, as the bf16 reference does.
#include "core/error.h"
#include "model/model.h"

namespace tetra::model {
namespace {

void attention(ModelOps& ops, const LayerWeights& lw, const StepBatch& step) {
  const int L = lw.index;
  ops.qkv(L, Buf::Normed, Buf::Q, Buf::K, Buf::V);
  // GLM-4.x use_qk_norm and Qwen3: per-head RMSNorm before RoPE.
  if (lw.attn.q_norm) ops.head_norm(NormId::QHead, L, Buf::Q);
  if (lw.attn.k_norm) ops.head_norm(NormId::KHead, L, Buf::K);
  ops.rope_write_kv(L, Buf::Q, Buf::K, Buf::V);
  if (step.has_cached_prefix())  // chunked prefill: the chunk reads the earlier chunks' cache
    ops.extend_attention(L, Buf::Q, Buf::Attn);
  else if (step.kind == StepKind::Prefill)
    ops.prefill_attention(Buf::Q, Buf::K, Buf::V, Buf::Attn);
  else
    ops.decode_attention(L, Buf::Q, Buf::Attn);
  ops.linear(LinearId::O, L, Buf::Attn, Buf::Out);
  ops.all_reduce(Buf::Out);  // o_proj is split by input columns under tensor parallelism
}

void mlp(ModelOps& ops, const LayerWeights& lw) {
  const int L = lw.index;
  if (lw.moe) {
    ops.moe(L, Buf::Normed, Buf::Out);
    return;
  }
  TETRA_CHECK(lw.dense.has_value(), "layer ", L, " has neither a dense MLP nor a MoE block");
  ops.dense_gate_up(L, Buf::Normed, Buf::Gate, Buf::Up, lw.dense->inter());
  ops.linear(LinearId::DenseDown, L, Buf::Gate, Buf::Out);
}

}  // namespace

void run_forward(ModelOps& ops, const ModelWeights& w, const StepBatch& step) {
  ops.begin_step(step);
  ops.embed(Buf::Residual);
  for (const LayerWeights& lw : w.layers) {
    if (lw.index == 0)
      ops.rms_norm(NormId::Input, 0, Buf::Residual, Buf::Normed);
    else
      ops.add_rms_norm(NormId::Input, lw.index, Buf::Out, Buf::Residual, Buf::Normed);
    attention(ops, lw, step);
    ops.add_rms_norm(NormId::PostAttention, lw.index, Buf::Out, Buf::Residual, Buf::Normed);
    mlp(ops, lw);
    ops.all_reduce(Buf::Out);  // down projections (dense, experts, shared) hold partial sums
  }
  ops.add_rms_norm(NormId::Final, -1, Buf::Out, Buf::Residual, Buf::Normed);
  if (step.num_logit_rows() > 0) ops.logits(Buf::Normed);
}

}  // namespace tetra::model
