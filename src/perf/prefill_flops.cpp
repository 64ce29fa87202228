#include "perf/prefill_flops.h"

#include <algorithm>

#include "core/error.h"
#include "format/model_size.h"

namespace tetra {
namespace {

int64_t active_params(const ModelSize& s, ModuleKind kind) {
  const auto it = s.active.find(kind);
  return it == s.active.end() ? 0 : it->second.params;
}

// Causal (query, key) pairs of T tokens where query t (1-based) sees min(t, keep) keys.
double kept_pairs(int64_t T, int64_t keep) {
  const double t = double(T), k = double(std::min(T, keep));
  return k * (k + 1) / 2 + (t - k) * k;
}

}  // namespace

PrefillFlops prefill_flops(const ModelConfig& c, const QuantConfig& quant, int64_t tokens,
                           int64_t logit_rows) {
  if (tokens < 1) TETRA_FAIL("a prefill needs at least one token (got ", tokens, ")");
  if (logit_rows < 0 || logit_rows > tokens)
    TETRA_FAIL("logit rows must be within [0, ", tokens, "] (got ", logit_rows, ")");
  // Per-token weights from model_size (the count the decode floor uses; its "active" already
  // holds top_k of the routed experts). The DSA indexer runs only when the prompt is longer than
  // the keys it keeps, as the decode roofline counts it.
  const ModelSize size = model_size(c, quant);
  const bool indexer_runs = c.index_n_heads > 0 && c.index_topk > 0 && tokens > c.index_topk;
  double per_token = indexer_runs ? double(active_params(size, ModuleKind::Indexer)) : 0.0;
  for (ModuleKind k : {ModuleKind::Attention, ModuleKind::DenseMlp, ModuleKind::SharedExpert,
                       ModuleKind::RoutedExpert, ModuleKind::Router})
    per_token += double(active_params(size, k));
  // A tied table is the lm_head: model_size counts it whole as the active embedding.
  const double lm_head = double(active_params(
      size, c.tie_word_embeddings ? ModuleKind::Embedding : ModuleKind::LmHead));
  PrefillFlops f;
  f.linear = 2.0 * double(tokens) * per_token + 2.0 * double(logit_rows) * lm_head;

  const bool mla = c.attention == AttentionKind::MLA;
  const double d_qk = mla ? double(c.qk_nope_head_dim + c.qk_rope_head_dim) : double(c.head_dim);
  const double d_v = mla ? double(c.v_head_dim) : double(c.head_dim);
  const double full = kept_pairs(tokens, tokens);
  const double kept = c.index_topk > 0 ? kept_pairs(tokens, c.index_topk) : full;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    f.attention += 2.0 * kept * double(c.num_attention_heads) * (d_qk + d_v);
    if (indexer_runs && c.layer_has_indexer(layer))
      f.attention += 2.0 * full * double(c.index_n_heads) * double(c.index_head_dim);
  }
  return f;
}

}  // namespace tetra
