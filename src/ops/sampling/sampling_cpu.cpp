// CPU sampling: the steps of sampling.h written out with sorts, one row at a time.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/sampling/sampling.h"
#include "ops/sampling/sampling_math.h"

namespace tetra::ops {

namespace sm = sampling_math;

void check_sampling_params(const SamplingParams& p, int row) {
  if (!(p.temperature == p.temperature))
    TETRA_FAIL("sampling row ", row, ": temperature is NaN");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    TETRA_FAIL("sampling row ", row, ": top_p ", p.top_p, " must be in (0, 1]");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
    TETRA_FAIL("sampling row ", row, ": min_p ", p.min_p, " must be in [0, 1]");
  if (!(p.repetition_penalty > 0.0f && std::isfinite(p.repetition_penalty)))
    TETRA_FAIL("sampling row ", row, ": repetition_penalty ", p.repetition_penalty, " must be > 0");
  if (!std::isfinite(p.frequency_penalty) || !std::isfinite(p.presence_penalty))
    TETRA_FAIL("sampling row ", row, ": frequency/presence penalties must be finite");
}

void check_sampling_inputs(const SamplingParams* params, int rows, int vocab,
                           const TokenHistory& h, const LogitBias& bias) {
  for (int r = 0; r < rows; ++r) check_sampling_params(params[r], r);
  auto check = [&](const int32_t* tokens, const int32_t* offsets, int row) {
    if (tokens == nullptr || offsets == nullptr) return;
    for (int32_t i = offsets[row]; i < offsets[row + 1]; ++i)
      if (tokens[i] < 0 || tokens[i] >= vocab)
        TETRA_FAIL("sampling row ", row, ": history token ", tokens[i], " outside vocab ", vocab);
  };
  for (int r = 0; r < rows; ++r) {
    check(h.prompt_tokens, h.prompt_offsets, r);
    check(h.output_tokens, h.output_offsets, r);
  }
  for (int r = 0; r < rows; ++r) {
    if (!has_logit_bias(bias, r)) continue;
    std::vector<int32_t> ids(bias.tokens + bias.offsets[r], bias.tokens + bias.offsets[r + 1]);
    for (int32_t i = bias.offsets[r]; i < bias.offsets[r + 1]; ++i) {
      if (bias.tokens[i] < 0 || bias.tokens[i] >= vocab)
        TETRA_FAIL("sampling row ", r, ": logit bias token ", bias.tokens[i], " outside vocab ", vocab);
      if (std::isnan(bias.values[i]) || bias.values[i] == INFINITY)
        TETRA_FAIL("sampling row ", r, ": logit bias ", bias.values[i], " for token ", bias.tokens[i],
                   " (NaN and +inf are refused)");
    }
    std::sort(ids.begin(), ids.end());
    const auto dup = std::adjacent_find(ids.begin(), ids.end());
    if (dup != ids.end()) TETRA_FAIL("sampling row ", r, ": logit bias token ", *dup, " given twice");
  }
}

namespace {

// Biased, then penalised logits of one row: x [V] (ids checked by check_sampling_inputs).
std::vector<float> penalised_row(const float* logits, int V, const SamplingParams& p,
                                 const TokenHistory& h, const LogitBias& bias, int row) {
  std::vector<float> raw(logits, logits + V);  // [V]
  if (has_logit_bias(bias, row))
    for (int32_t i = bias.offsets[row]; i < bias.offsets[row + 1]; ++i)
      raw[size_t(bias.tokens[i])] = sm::biased(raw[size_t(bias.tokens[i])], bias.values[i]);
  std::vector<int> count(V, 0);   // [V] occurrences in the output
  std::vector<char> seen(V, 0);   // [V] in prompt or output
  auto walk = [&](const int32_t* tokens, const int32_t* offsets, bool is_output) {
    if (tokens == nullptr || offsets == nullptr) return;
    for (int32_t i = offsets[row]; i < offsets[row + 1]; ++i) {
      const int32_t t = tokens[i];
      seen[t] = 1;
      if (is_output) ++count[t];
    }
  };
  walk(h.prompt_tokens, h.prompt_offsets, false);
  walk(h.output_tokens, h.output_offsets, true);
  std::vector<float> x(V);
  for (int v = 0; v < V; ++v)
    x[v] = sm::penalised(raw[size_t(v)], seen[v] != 0, count[v], p.repetition_penalty,
                         p.frequency_penalty, p.presence_penalty) + 0.0f;  // -0 -> +0
  return x;
}

// Keys of the kept tokens, best first.
std::vector<int> kept_by_key_desc(const std::vector<float>& x, const std::vector<char>& keep) {
  std::vector<int> ids;
  for (int v = 0; v < int(x.size()); ++v)
    if (keep[v]) ids.push_back(v);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int a, int b) { return sm::order_key(x[a]) > sm::order_key(x[b]); });
  return ids;
}

int32_t sample_row(const float* logits, int V, const SamplingParams& p, const TokenHistory& h,
                   const LogitBias& bias, int row) {
  std::vector<float> x = penalised_row(logits, V, p, h, bias, row);
  if (p.temperature <= 0.0f) {
    int32_t best = -1;
    for (int v = 0; v < V; ++v)
      if (sm::order_key(x[v]) != 0 && (best < 0 || x[v] > x[best])) best = v;
    return best;
  }
  for (auto& xv : x) xv = xv / p.temperature;
  std::vector<char> keep(V);  // [V]
  float x_max = -INFINITY;
  for (int v = 0; v < V; ++v) {
    keep[v] = sm::order_key(x[v]) != 0;
    if (keep[v]) x_max = std::max(x_max, x[v]);
  }
  if (x_max == -INFINITY) return -1;
  if (p.min_p > 0.0f)
    for (int v = 0; v < V; ++v) keep[v] = keep[v] && sm::min_p_keeps(x[v], x_max, p.min_p);
  if (p.top_k > 0 && p.top_k < V) {
    const std::vector<int> ids = kept_by_key_desc(x, keep);
    if (int(ids.size()) > p.top_k) {
      const uint32_t cut = sm::order_key(x[ids[p.top_k - 1]]);
      for (int v = 0; v < V; ++v) keep[v] = keep[v] && sm::order_key(x[v]) >= cut;
    }
  }
  if (p.top_p < 1.0f) {
    const std::vector<int> ids = kept_by_key_desc(x, keep);
    uint64_t total = 0;
    for (int v : ids) total += sm::top_p_weight(x[v], x_max);
    const uint64_t target = sm::top_p_target(p.top_p, total);
    uint64_t mass = 0;
    for (int v : ids) {
      mass += sm::top_p_weight(x[v], x_max);
      if (mass >= target) {
        const uint32_t cut = sm::order_key(x[v]);
        for (int u = 0; u < V; ++u) keep[u] = keep[u] && sm::order_key(x[u]) >= cut;
        break;
      }
    }
  }
  int32_t best = -1;
  double best_score = -INFINITY;
  for (int v = 0; v < V; ++v) {
    if (!keep[v]) continue;
    const double score = double(x[v]) + sm::gumbel(p.seed, p.step, uint32_t(v));
    if (best < 0 || score > best_score) best = v, best_score = score;
  }
  return best;
}

}  // namespace

void sample_cpu(const float* logits, int rows, int vocab, const SamplingParams* params,
                const TokenHistory& history, int32_t* tokens, const LogitBias& bias) {
  TETRA_CHECK(rows >= 0 && vocab > 0, "sampling: rows=", rows, " vocab=", vocab);
  check_sampling_inputs(params, rows, vocab, history, bias);
  for (int r = 0; r < rows; ++r)
    tokens[r] = sample_row(logits + size_t(r) * vocab, vocab, params[r], history, bias, r);
}

}  // namespace tetra::ops
