#include "moe/token_layout.h"

#include <cstdint>

#include "core/error.h"

namespace tetra::moe {

namespace {

void check_sizes(const char* what, int T, int top_k, int E) {
  if (T < 0 || top_k < 1 || E < 1)
    TETRA_FAIL(what, ": bad sizes T=", T, " top_k=", top_k, " E=", E);
  if (int64_t(T) * top_k > INT32_MAX)  // rows are int32
    TETRA_FAIL(what, ": T*top_k = ", int64_t(T) * top_k, " rows do not fit int32");
}

// Pairs per expert, validating every id.
std::vector<int32_t> count_pairs(const char* what, const int32_t* ids, int T, int top_k, int E) {
  std::vector<int32_t> counts(E, 0);  // [E]
  const int64_t S = int64_t(T) * top_k;
  for (int64_t p = 0; p < S; ++p) {
    const int32_t e = ids[p];
    if (e < 0 || e >= E)
      TETRA_FAIL(what, ": expert id ", e, " of token ", p / top_k, " (slot ", p % top_k,
                 ") is outside [0, ", E, ")");
    ++counts[e];
  }
  return counts;
}

}  // namespace

std::vector<RowRange> ContiguousLayout::expert_rows() const {
  std::vector<RowRange> r(num_experts);
  for (int e = 0; e < num_experts; ++e)
    r[e] = {expert_offsets[e], expert_offsets[e + 1] - expert_offsets[e]};
  return r;
}

std::vector<RowRange> MaskedLayout::expert_rows() const {
  std::vector<RowRange> r(num_experts);
  for (int e = 0; e < num_experts; ++e) r[e] = {e * max_m, masked_m[e]};
  return r;
}

ContiguousLayout build_contiguous_cpu(const int32_t* ids, int T, int top_k, int E) {
  check_sizes("contiguous layout", T, top_k, E);
  const std::vector<int32_t> counts = count_pairs("contiguous layout", ids, T, top_k, E);
  ContiguousLayout L;
  L.num_tokens = T;
  L.top_k = top_k;
  L.num_experts = E;
  L.expert_offsets.assign(E + 1, 0);
  for (int e = 0; e < E; ++e) L.expert_offsets[e + 1] = L.expert_offsets[e] + counts[e];
  const int64_t S = int64_t(T) * top_k;
  L.slot_token.assign(S, -1);
  L.slot_of.assign(S, -1);
  std::vector<int32_t> cursor(L.expert_offsets.begin(), L.expert_offsets.end() - 1);  // [E]
  for (int64_t p = 0; p < S; ++p) {  // ascending pair order makes the sort stable
    const int32_t row = cursor[ids[p]]++;
    L.slot_of[p] = row;
    L.slot_token[row] = int32_t(p / top_k);
  }
  return L;
}

MaskedLayout build_masked_cpu(const int32_t* ids, int T, int top_k, int E, int max_m) {
  check_sizes("masked layout", T, top_k, E);
  if (max_m < 1) TETRA_FAIL("masked layout: max_m must be >= 1, got ", max_m);
  if (int64_t(E) * max_m > INT32_MAX)
    TETRA_FAIL("masked layout: E*max_m = ", int64_t(E) * max_m, " rows do not fit int32");
  const std::vector<int32_t> counts = count_pairs("masked layout", ids, T, top_k, E);
  for (int e = 0; e < E; ++e)
    if (counts[e] > max_m)
      TETRA_FAIL("masked layout: expert ", e, " receives ", counts[e],
                 " tokens, more than max_m = ", max_m);
  MaskedLayout L;
  L.num_tokens = T;
  L.top_k = top_k;
  L.num_experts = E;
  L.max_m = max_m;
  L.masked_m = counts;
  L.row_token.assign(size_t(E) * max_m, -1);
  const int64_t S = int64_t(T) * top_k;
  L.slot_of.assign(S, -1);
  std::vector<int32_t> used(E, 0);  // [E] rows filled so far
  for (int64_t p = 0; p < S; ++p) {
    const int32_t e = ids[p];
    const int32_t row = e * max_m + used[e]++;
    L.slot_of[p] = row;
    L.row_token[row] = int32_t(p / top_k);
  }
  return L;
}

}  // namespace tetra::moe
