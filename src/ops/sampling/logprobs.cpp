#include "ops/sampling/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace tetra::ops {

PositionLogprobs position_logprobs(const float* logits, int64_t vocab, int32_t token, int top) {
  TETRA_CHECK(token >= 0 && token < vocab, "logprobs: token ", token, " outside vocab ", vocab);
  TETRA_CHECK(top >= 0 && top <= kMaxTopLogprobs, "logprobs: top ", top, " outside [0, ", kMaxTopLogprobs, "]");
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  auto value = [&](int64_t i) { return std::isnan(logits[i]) ? kNegInf : logits[i]; };
  float peak = kNegInf;
  for (int64_t i = 0; i < vocab; ++i) peak = std::max(peak, value(i));
  // log(sum exp(x)) = peak + log(sum exp(x - peak)), summed in double: 150K terms in float
  // would round the small ones away.
  // +inf logits share all the mass: as if they were equal finite values far above the rest.
  const bool infinite = peak == std::numeric_limits<float>::infinity();
  double lse = kNegInf;
  if (std::isfinite(peak) || infinite) {
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i)
      sum += infinite ? double(value(i) == peak) : std::exp(double(value(i)) - double(peak));
    lse = (infinite ? 0.0 : double(peak)) + std::log(sum);
  }
  auto logprob = [&](int64_t i) {
    if (infinite) return value(i) == peak ? float(-lse) : kNegInf;
    if (std::isinf(lse)) return kNegInf;  // nothing finite
    return float(double(value(i)) - lse);
  };

  PositionLogprobs out;
  out.logprob = logprob(token);
  // The `top` best, kept sorted (highest first, lowest id among equals) by insertion: top <= 20,
  // and after the first few hundred ids almost every candidate fails the first comparison.
  std::vector<int64_t> best;
  best.reserve(size_t(top) + 1);
  auto better = [&](int64_t a, int64_t b) { return value(a) > value(b) || (value(a) == value(b) && a < b); };
  for (int64_t i = 0; i < vocab && top > 0; ++i) {
    if (int(best.size()) == top && !better(i, best.back())) continue;
    size_t at = best.size();
    while (at > 0 && better(i, best[at - 1])) --at;
    best.insert(best.begin() + int64_t(at), i);
    if (int(best.size()) > top) best.pop_back();
  }
  for (int64_t i : best) out.top.push_back({int32_t(i), logprob(i)});
  return out;
}

void check_logprob_query(const LogprobQuery& q, int rows, int64_t vocab) {
  TETRA_CHECK(q.row >= 0 && q.row < rows, "logprobs: logit row ", q.row, " outside [0, ", rows, ")");
  TETRA_CHECK(q.token >= 0 && q.token < vocab, "logprobs: token ", q.token, " outside vocab ", vocab);
  TETRA_CHECK(q.top >= 0 && q.top <= kMaxTopLogprobs, "logprobs: top ", q.top, " outside [0, ",
              kMaxTopLogprobs, "]");
}

}  // namespace tetra::ops
