// The CUDA DSA indexer ops (ops/attention/dsa_cuda.h) against their CPU twins (dsa_cpu.cpp) on
// fresh random data, both RoPE pairings.
// Index keys: shapes tiny (D 32, Dr 16), GLM-5 (D 128, Dr 64), odd (D 40, Dr 8), wide (D 256);
// T 1, 7, 33; some negative slots, whose rows (and every row not written) must keep their bits.
// The normed key matches the CPU's bits (mean and variance in double on both); sincosf may
// differ from the CPU's double cos/sin by a float ulp, so elements agree within 1 bf16 ulp.
// Select: tiny shapes (Hi 4, D 32, Dr 16, topk 6 and 16), an odd one (Hi 3, D 40, Dr 8,
// topk 5) and GLM-5's (Hi 32, D 128, Dr 64, topk 2048) over step-slot prefills (sequences of
// 1, 17, 300, 3000 tokens), decode over paged caches (block size 16, shuffled blocks; contexts
// 1, 2047, 2048, 2049, 5000) and a paged prefill continuing cached prefixes. Every row: min(topk, n) positions, ascending, all < n, the rest of
// the row untouched. The set equals the CPU's, or every key where they differ has a CPU score
// within 1e-5 of the row's largest |score| of the boundary (the k-th best CPU score): the GPU
// sums dot products in another order, so keys within float rounding of the boundary may swap.
// Some key rows are copies of earlier ones (exact ties, which must go to the lower position on
// both sides), and the test is not vacuous: most sparse rows agree exactly and are neither the
// first nor the last k keys. Exact-tie cases (all keys equal; keys of three values) must agree
// exactly. A select captured in a CUDA graph replays correctly as its sequences grow. Outputs
// are guarded by bytes that must survive.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/half.h"
#include "guarded_device_array.h"
#include "scattered_slots.h"
#include "ops/attention/dsa.h"
#include "ops/attention/dsa_cuda.h"
#include "ops/attention/mla.h"
#include "ops/rope/rope.h"

namespace tetra {
namespace {

using ops::DsaShape;
using ops::MlaKeys;
using ops::RopeStyle;
using test::GuardedDeviceArray;

struct Dims {
  const char* name;
  int Hi, D, Dr, topk;
};

constexpr Dims kTiny6{"tiny topk 6", 4, 32, 16, 6};
constexpr Dims kTiny16{"tiny topk 16", 4, 32, 16, 16};
constexpr Dims kGlm5{"glm-5", 32, 128, 64, 2048};
constexpr Dims kOdd{"odd", 3, 40, 8, 5};  // 5 chunks of 8 dims: lanes without a chunk

DsaShape shape_of(const Dims& d, RopeStyle style) {
  DsaShape s;
  s.n_heads = d.Hi;
  s.head_dim = d.D;
  s.rope_dim = d.Dr;
  s.topk = d.topk;
  s.style = style;
  return s;
}

const char* style_name(RopeStyle style) { return style == RopeStyle::NeoX ? " neox" : " gptj"; }

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}

// bf16 bits -> an integer whose differences count ulps (-0 and +0 both 0).
int bf16_ordinal(uint16_t b) { return (b & 0x8000) ? -int(b & 0x7fff) : int(b); }

// ---- dsa_index_keys -----------------------------------------------------------------------

void run_index_keys(const Dims& d, RopeStyle style, int T, std::mt19937& rng) {
  const std::string what =
      std::string("index keys ") + d.name + style_name(style) + " T " + std::to_string(T);
  const DsaShape s = shape_of(d, style);
  const size_t D = size_t(d.D);
  const int64_t num_slots = T + 9;
  const float eps = 1e-6f;
  const std::vector<uint16_t> wk = random_bf16(size_t(T) * D, rng, -2.5f, 3.5f);  // [T, D]
  const std::vector<uint16_t> ln_w = random_bf16(D, rng, -1.5f, 1.5f);           // [D]
  const std::vector<uint16_t> ln_b = random_bf16(D, rng, -0.5f, 0.5f);           // [D]
  std::uniform_int_distribution<int32_t> upos(0, 1 << 17);  // angles up to ~1e5 rad
  std::vector<int32_t> pos(static_cast<size_t>(T));         // [T]
  for (auto& p : pos) p = upos(rng);
  if (T > 1) pos[1] = 0;
  const std::vector<float> inv_freq = ops::rope_inv_freq(10000.0, d.Dr);  // [Dr / 2]
  const std::vector<int64_t> slots = test::scattered_slots(T, num_slots, rng);  // [T]
  // [num_slots, D]: random rows, the ones to be written poisoned (NaN).
  std::vector<uint16_t> init = random_bf16(size_t(num_slots) * D, rng, -1.0f, 1.0f);
  const std::vector<bool> written = test::poison_written_rows(slots, D, init);
  std::vector<uint16_t> want = init;
  ops::dsa_index_keys_cpu(wk.data(), ln_w.data(), ln_b.data(), eps, pos.data(), slots.data(), T,
                          inv_freq.data(), s, num_slots, want.data());

  GuardedDeviceArray<uint16_t> dwk(wk), dw(ln_w), db(ln_b), dcache(init);
  GuardedDeviceArray<int32_t> dpos(pos);
  GuardedDeviceArray<int64_t> dslots(slots);
  GuardedDeviceArray<float> dfreq(inv_freq);
  TETRA_CUDA_CHECK(ops::cuda::dsa_index_keys(dwk.ptr(), dw.ptr(), db.ptr(), eps, dpos.ptr(),
                                             dslots.ptr(), T, dfreq.ptr(), s, num_slots,
                                             dcache.ptr(), nullptr));
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = dcache.download();
  EXPECT_TRUE(dcache.guards_intact()) << what;
  size_t kept_changed = 0, compared = 0, differing = 0, nonzero = 0;
  int max_ulps = 0;
  double err = 0, ref = 0;
  for (int64_t sl = 0; sl < num_slots; ++sl) {
    const size_t o = size_t(sl) * D;
    if (!written[size_t(sl)]) {
      kept_changed += !std::equal(got.begin() + int64_t(o), got.begin() + int64_t(o + D),
                                  init.begin() + int64_t(o));
      continue;
    }
    for (size_t i = o; i < o + D; ++i) {
      const float a = bf16_to_float(got[i]), b = bf16_to_float(want[i]);
      ASSERT_TRUE(std::isfinite(a)) << what << ": slot " << sl << " dim " << i - o << " not written";
      ASSERT_TRUE(std::isfinite(b)) << what << ": reference slot " << sl;
      max_ulps = std::max(max_ulps, std::abs(bf16_ordinal(got[i]) - bf16_ordinal(want[i])));
      differing += got[i] != want[i];
      nonzero += b != 0.0f;
      err += double(a - b) * double(a - b);
      ref += double(b) * double(b);
      ++compared;
    }
  }
  EXPECT_EQ(kept_changed, 0u) << what << ": rows not written changed";
  ASSERT_GT(compared, 0u) << what;
  ASSERT_GT(nonzero, compared / 2) << what << ": the reference is mostly zero";
  EXPECT_LE(max_ulps, 1) << what;
  EXPECT_LE(differing, compared / 20) << what << ": more than 5% of elements off by an ulp";
  EXPECT_LE(err / ref, 1e-5) << what;
}

TEST(DsaCuda, IndexKeysMatchCpuTwin) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  const Dims shapes[] = {{"tiny", 4, 32, 16, 6},
                         {"glm-5", 32, 128, 64, 2048},
                         {"odd", 2, 40, 8, 4},
                         {"wide", 1, 256, 64, 8}};
  for (const Dims& d : shapes)
    for (RopeStyle style : {RopeStyle::NeoX, RopeStyle::GptJ})
      for (int T : {1, 7, 33}) run_index_keys(d, style, T, rng);
}

// ---- dsa_select ---------------------------------------------------------------------------

struct Seq {
  int prefix = 0;  // keys already cached (paged mode only)
  int chunk = 0;   // this step's tokens
};

// Where a step's keys live. Step-slot mode: a sequence's keys are its own tokens, at shuffled
// slots. Paged mode: block size 16, shuffled block ids, a spare block per sequence.
struct KeyLayout {
  bool paged = false;
  std::vector<int32_t> cu = {0}, pos;  // [S + 1], [T]
  std::vector<int64_t> step_slots;     // [T]
  std::vector<int32_t> tables;         // [S, mb]
  int mb = 0, bs = 16, max_len = 0;
  int64_t num_slots = 0;

  KeyLayout(const std::vector<Seq>& seqs, bool paged_, std::mt19937& rng) : paged(paged_) {
    for (const Seq& sq : seqs) {
      for (int i = 0; i < sq.chunk; ++i) pos.push_back(sq.prefix + i);
      cu.push_back(cu.back() + sq.chunk);
      max_len = std::max(max_len, sq.prefix + sq.chunk);
    }
    if (paged) {
      mb = (max_len + bs - 1) / bs + 1;
      const int num_blocks = S() * mb + 5;
      std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      tables.assign(ids.begin(), ids.begin() + S() * mb);
      num_slots = int64_t(num_blocks) * bs;
    } else {
      num_slots = T() + 13;
      std::vector<int64_t> perm(static_cast<size_t>(num_slots));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      step_slots.assign(perm.begin(), perm.begin() + T());
    }
  }
  int T() const { return cu.back(); }
  int S() const { return int(cu.size()) - 1; }
  int seq_of(int t) const {
    int b = 0;
    while (cu[size_t(b) + 1] <= t) ++b;
    return b;
  }
  MlaKeys host_keys() const {
    MlaKeys k;
    if (paged) {
      k.block_tables = tables.data();
      k.max_blocks_per_seq = mb;
      k.block_size = bs;
    } else {
      k.step_slots = step_slots.data();
    }
    return k;
  }
  // Sequence b's key count: its prefix and chunk.
  int keys_of(int b) const { return pos[size_t(cu[size_t(b) + 1]) - 1] + 1; }
  int64_t slot(int b, int j) const {
    const MlaKeys k = host_keys();
    return ops::mla_key_slot(k, cu.data(), b, j);
  }
};

// The indexer's inputs for a layout. `key_rows` > 0: every key row is one of that many random
// rows (key j gets row j % key_rows: exact ties); otherwise random rows, every 7th key a copy of
// the key 3 before it (exact ties among otherwise distinct scores).
struct SelectInputs {
  std::vector<uint16_t> q, weights, cache;  // [T, Hi, D], [T, Hi], [num_slots, D]
  std::vector<float> inv_freq;              // [Dr / 2]
  SelectInputs(const KeyLayout& L, const DsaShape& s, std::mt19937& rng, int key_rows = 0) {
    const size_t D = size_t(s.head_dim);
    q = random_bf16(size_t(L.T()) * s.n_heads * D, rng, -1.0f, 1.0f);
    weights = random_bf16(size_t(L.T()) * s.n_heads, rng, -1.0f, 1.0f);
    cache = random_bf16(size_t(L.num_slots) * D, rng, -2.0f, 2.0f);
    inv_freq = ops::rope_inv_freq(10000.0, s.rope_dim);
    for (int b = 0; b < L.S(); ++b)
      for (int j = 0; j < L.keys_of(b); ++j) {
        const int src = key_rows > 0 ? j % key_rows : (j % 7 == 6 ? j - 3 : j);
        if (src != j)
          std::copy_n(cache.begin() + L.slot(b, src) * int64_t(D), D,
                      cache.begin() + L.slot(b, j) * int64_t(D));
      }
  }
};

// Token t's scores as dsa_select_cpu computes them (float, the same steps and order).
std::vector<float> cpu_scores(const KeyLayout& L, const SelectInputs& in, const DsaShape& s,
                              int t) {
  const int Hi = s.n_heads, D = s.head_dim, n = L.pos[size_t(t)] + 1, b = L.seq_of(t);
  const float scale = float(1.0 / std::sqrt(double(D)));
  const float head_weight = float(1.0 / std::sqrt(double(Hi)));
  std::vector<float> qt(size_t(Hi) * D), w(static_cast<size_t>(Hi));  // [Hi, D], [Hi]
  for (int h = 0; h < Hi; ++h) {
    float* qh = &qt[size_t(h) * D];
    for (int i = 0; i < D; ++i) qh[i] = bf16_to_float(in.q[(size_t(t) * Hi + h) * D + i]);
    ops::rope_rotate_f32(qh, s.rope_dim, float(L.pos[size_t(t)]), in.inv_freq.data(), s.style);
    for (int i = 0; i < D; ++i) qh[i] = bf16_to_float(float_to_bf16(qh[i]));
    w[size_t(h)] = bf16_to_float(in.weights[size_t(t) * Hi + h]) * head_weight;
  }
  std::vector<float> score(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    const uint16_t* k = &in.cache[size_t(L.slot(b, j)) * D];
    float sum = 0.0f;
    for (int h = 0; h < Hi; ++h) {
      float dot = 0.0f;
      for (int i = 0; i < D; ++i) dot += qt[size_t(h) * D + i] * bf16_to_float(k[i]);
      sum += std::max(dot * scale, 0.0f) * w[size_t(h)];
    }
    score[size_t(j)] = sum;
  }
  return score;
}

struct SelectStats {
  int rows = 0, sparse_rows = 0, exact_sparse_rows = 0, nontrivial_rows = 0, differing_keys = 0;
};

constexpr int32_t kUnset = -7;  // selected entries past a row's count must keep it

// got vs want ([T, topk] each), row by row; see the file comment. exact: no near-tie allowance.
SelectStats compare_selection(const KeyLayout& L, const SelectInputs& in, const DsaShape& s,
                              const std::vector<int32_t>& got, const std::vector<int32_t>& want,
                              const std::string& what, bool exact = false) {
  SelectStats st;
  const int K = s.topk;
  for (int t = 0; t < L.T(); ++t) {
    ++st.rows;
    const int n = L.pos[size_t(t)] + 1, k = std::min(K, n);
    const int32_t* g = &got[size_t(t) * K];
    const int32_t* w = &want[size_t(t) * K];
    const std::string row = what + ": token " + std::to_string(t) + " (" + std::to_string(n) +
                            " keys)";
    bool well_formed = true;
    for (int i = 0; i < k && well_formed; ++i) {
      well_formed = g[i] >= 0 && g[i] < n && (i == 0 || g[i - 1] < g[i]);
      EXPECT_TRUE(well_formed) << row << ": entry " << i << " is " << g[i]
                               << " (positions must be < n, ascending, distinct)";
    }
    for (int i = k; i < K && well_formed; ++i) {
      well_formed = g[i] == kUnset;
      EXPECT_TRUE(well_formed) << row << ": entry " << i << " past the count written";
    }
    if (!well_formed) return st;
    const bool same = std::equal(g, g + k, w);
    if (n > K) {
      ++st.sparse_rows;
      st.exact_sparse_rows += same;
      bool first_k = true, last_k = true;
      for (int i = 0; i < k; ++i) {
        first_k = first_k && g[i] == i;
        last_k = last_k && g[i] == n - k + i;
      }
      st.nontrivial_rows += !first_k && !last_k;
    }
    if (same) continue;
    EXPECT_FALSE(exact) << row << ": differs from the CPU selection";
    if (n <= K) {
      ADD_FAILURE() << row << ": a dense row differs";
      continue;
    }
    // Where the sets differ, every differing key must be a near-tie of the CPU's boundary.
    const std::vector<float> score = cpu_scores(L, in, s, t);
    std::vector<char> in_got(static_cast<size_t>(n), 0), in_want(static_cast<size_t>(n), 0);
    float boundary = INFINITY, largest = 0.0f;
    for (int i = 0; i < k; ++i) {
      in_got[size_t(g[i])] = 1;
      in_want[size_t(w[i])] = 1;
      boundary = std::min(boundary, score[size_t(w[i])]);
    }
    for (float x : score) largest = std::max(largest, std::fabs(x));
    const double tol = 1e-5 * largest;
    for (int j = 0; j < n; ++j) {
      if (in_got[size_t(j)] == in_want[size_t(j)]) continue;
      ++st.differing_keys;
      EXPECT_LE(std::fabs(double(score[size_t(j)]) - boundary), tol)
          << row << ": key " << j << (in_got[size_t(j)] ? " taken" : " dropped") << " with score "
          << score[size_t(j)] << ", boundary " << boundary << ", largest |score| " << largest;
    }
  }
  return st;
}

// Runs dsa_select on the device and on the CPU for the layout and compares. max_keys_extra
// widens the workspace rows past the longest context; ws_rows > 0 gives the workspace only that
// many score rows (the tokens then go in passes).
SelectStats run_select(const Dims& d, RopeStyle style, const std::vector<Seq>& seqs, bool paged,
                       std::mt19937& rng, int key_rows = 0, int max_keys_extra = 0,
                       int ws_rows = 0) {
  const DsaShape s = shape_of(d, style);
  const KeyLayout L(seqs, paged, rng);
  const SelectInputs in(L, s, rng, key_rows);
  std::string what = std::string("select ") + d.name + style_name(style) +
                     (paged ? " paged" : " step slots") + " seqs";
  for (const Seq& sq : seqs)
    what += " " + (paged ? std::to_string(sq.prefix) + "+" : std::string()) + std::to_string(sq.chunk);
  if (key_rows) what += ", keys of " + std::to_string(key_rows) + " values";
  if (ws_rows) what += ", workspace of " + std::to_string(ws_rows) + " rows";
  const int T = L.T(), max_keys = L.max_len + max_keys_extra;

  std::vector<int32_t> want(size_t(T) * s.topk, kUnset);  // [T, topk]
  ops::dsa_select_cpu(in.q.data(), in.weights.data(), in.cache.data(), L.num_slots, L.cu.data(),
                      L.S(), L.pos.data(), L.host_keys(), in.inv_freq.data(), s, want.data());

  GuardedDeviceArray<uint16_t> dq(in.q), dw(in.weights), dcache(in.cache);
  GuardedDeviceArray<int32_t> dcu(L.cu), dpos(L.pos), dsel(want.size());
  GuardedDeviceArray<int32_t> dtab(paged ? L.tables : std::vector<int32_t>{0});
  GuardedDeviceArray<int64_t> dslots(paged ? std::vector<int64_t>{0} : L.step_slots);
  GuardedDeviceArray<float> dfreq(in.inv_freq);
  const size_t ws_bytes = ws_rows > 0 ? size_t(ws_rows) * max_keys * sizeof(float)
                                      : ops::cuda::dsa_select_workspace_bytes(T, max_keys);
  GuardedDeviceArray<float> dws(ws_bytes / sizeof(float));
  MlaKeys dkeys;
  if (paged) {
    dkeys.block_tables = dtab.ptr();
    dkeys.max_blocks_per_seq = L.mb;
    dkeys.block_size = L.bs;
  } else {
    dkeys.step_slots = dslots.ptr();
  }
  dsel.upload(std::vector<int32_t>(want.size(), kUnset));
  TETRA_CUDA_CHECK(ops::cuda::dsa_select(dq.ptr(), dw.ptr(), dcache.ptr(), L.num_slots, dcu.ptr(),
                                         L.S(), dpos.ptr(), dkeys, dfreq.ptr(), s, dsel.ptr(), T,
                                         max_keys, dws.ptr(), ws_bytes, nullptr));
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<int32_t> got = dsel.download();
  EXPECT_TRUE(dsel.guards_intact()) << what << ": selected";
  EXPECT_TRUE(dws.guards_intact()) << what << ": workspace";
  EXPECT_EQ(dq.download(), in.q) << what << ": q changed";
  const SelectStats st = compare_selection(L, in, s, got, want, what, key_rows > 0);
  // Not vacuous: most sparse rows agree exactly and pick neither the first nor the last keys.
  if (st.sparse_rows > 0) {
    EXPECT_GE(st.exact_sparse_rows, st.sparse_rows - std::max(1, st.sparse_rows / 10))
        << what << ": " << st.sparse_rows - st.exact_sparse_rows << " of " << st.sparse_rows
        << " sparse rows differ from the CPU (" << st.differing_keys << " keys)";
    if (key_rows == 0) {
      EXPECT_GE(2 * st.nontrivial_rows, st.sparse_rows)
          << what << ": most sparse rows select the first or the last keys";
    }
  }
  if (st.differing_keys > 0)
    std::printf("%s: %d of %d sparse rows differ by near-ties (%d keys)\n", what.c_str(),
                st.sparse_rows - st.exact_sparse_rows, st.sparse_rows, st.differing_keys);
  return st;
}

TEST(DsaCuda, SelectStepSlotsMatchesCpuTwin) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(21);
  const std::vector<Seq> prefill = {{0, 1}, {0, 17}, {0, 300}, {0, 3000}};
  for (RopeStyle style : {RopeStyle::NeoX, RopeStyle::GptJ}) {
    for (const Dims& d : {kTiny6, kTiny16}) {
      const SelectStats st = run_select(d, style, prefill, false, rng);
      EXPECT_GT(2 * st.sparse_rows, st.rows) << d.name << ": most rows should be sparse";
      run_select(d, style, {{0, 40}}, false, rng, 0, 77);  // workspace rows wider than needed
    }
    run_select(kOdd, style, {{0, 1}, {0, 17}, {0, 300}}, false, rng);
    const SelectStats st = run_select(kGlm5, style, prefill, false, rng);
    EXPECT_EQ(st.sparse_rows, 3000 - 2048) << "glm-5: the rows past topk";
    // A workspace of 1 or 7 score rows: the tokens go in passes, the last one short.
    for (int ws_rows : {1, 7})
      run_select(kTiny16, style, {{0, 17}, {0, 300}, {0, 40}}, false, rng, 0, 0, ws_rows);
    run_select(kGlm5, style, {{0, 2100}, {0, 5}}, false, rng, 0, 0, 1000);
  }
}

TEST(DsaCuda, SelectPagedMatchesCpuTwin) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(31);
  const std::vector<Seq> decode = {{0, 1}, {2046, 1}, {2047, 1}, {2048, 1}, {4999, 1}};
  const std::vector<Seq> extend = {{13, 5}, {0, 1}, {100, 40}, {2040, 20}, {31, 33}};
  for (RopeStyle style : {RopeStyle::NeoX, RopeStyle::GptJ}) {
    const SelectStats st = run_select(kGlm5, style, decode, true, rng);
    EXPECT_EQ(st.sparse_rows, 2) << "glm-5 decode: contexts 2049 and 5000 are sparse";
    run_select(kGlm5, style, decode, true, rng, 0, 0, 2);  // passes of 2 sequences
    run_select(kGlm5, style, extend, true, rng);
    for (const Dims& d : {kTiny6, kTiny16}) {
      const SelectStats sd = run_select(d, style, decode, true, rng);
      EXPECT_EQ(sd.sparse_rows, 4) << d.name;
      run_select(d, style, extend, true, rng);
    }
  }
}

// Exact ties: with every key equal, the first topk positions; with keys of three values, the
// best value's keys from the lowest position on (then the next value's). Both sides compute
// equal scores for equal keys, so the selections must agree exactly, across the select
// kernel's tiles of 512 keys too.
TEST(DsaCuda, SelectTiesGoToTheLowerPosition) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(41);
  for (int key_rows : {1, 3}) {
    run_select(kGlm5, RopeStyle::NeoX, {{0, 1}, {2048, 1}, {4999, 1}}, true, rng, key_rows);
    run_select(kTiny16, RopeStyle::GptJ, {{0, 300}, {0, 17}}, false, rng, key_rows);
  }
}

// ---- graph capture ------------------------------------------------------------------------

// dsa_select for 3 decoding sequences (GLM-5 shape, paged), captured once with a workspace for
// the cache's capacity; each replay reads new positions, q and weights from the same buffers and
// ranks more keys than the step before (the grids do not depend on the key counts).
TEST(DsaCuda, SelectReplaysFromAGraph) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(51);
  const DsaShape s = shape_of(kGlm5, RopeStyle::GptJ);
  const int T = 3, max_keys = 6000;
  // Paged caches holding max_keys keys per sequence; the steps decode at shorter lengths.
  const KeyLayout full({{max_keys - 1, 1}, {max_keys - 1, 1}, {max_keys - 1, 1}}, true, rng);
  const SelectInputs in(full, s, rng);
  const size_t ws_bytes = ops::cuda::dsa_select_workspace_bytes(T, max_keys);

  GuardedDeviceArray<uint16_t> dq(in.q.size()), dw(in.weights.size()), dcache(in.cache);
  GuardedDeviceArray<int32_t> dcu(full.cu), dpos(static_cast<size_t>(T)), dtab(full.tables);
  GuardedDeviceArray<int32_t> dsel(size_t(T) * s.topk);
  GuardedDeviceArray<float> dfreq(in.inv_freq), dws(ws_bytes / sizeof(float));
  MlaKeys dkeys;
  dkeys.block_tables = dtab.ptr();
  dkeys.max_blocks_per_seq = full.mb;
  dkeys.block_size = full.bs;
  cudaStream_t stream;
  TETRA_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TETRA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  TETRA_CUDA_CHECK(ops::cuda::dsa_select(dq.ptr(), dw.ptr(), dcache.ptr(), full.num_slots,
                                         dcu.ptr(), T, dpos.ptr(), dkeys, dfreq.ptr(), s,
                                         dsel.ptr(), T, max_keys, dws.ptr(), ws_bytes, stream));
  TETRA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TETRA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  int sparse_rows = 0;
  for (const std::vector<int32_t>& lens : {std::vector<int32_t>{1, 40, 2100},
                                           std::vector<int32_t>{2, 2049, 4000},
                                           std::vector<int32_t>{3, 3000, 6000}}) {
    KeyLayout step = full;  // the same caches and tables, new positions
    for (int b = 0; b < T; ++b) step.pos[size_t(b)] = lens[size_t(b)] - 1;
    SelectInputs fresh = in;  // the same keys, new q and weights
    fresh.q = random_bf16(in.q.size(), rng, -1.0f, 1.0f);
    fresh.weights = random_bf16(in.weights.size(), rng, -1.0f, 1.0f);
    std::vector<int32_t> want(size_t(T) * s.topk, kUnset);
    ops::dsa_select_cpu(fresh.q.data(), fresh.weights.data(), fresh.cache.data(), step.num_slots,
                        step.cu.data(), T, step.pos.data(), step.host_keys(),
                        fresh.inv_freq.data(), s, want.data());
    dpos.upload(step.pos);
    dq.upload(fresh.q);
    dw.upload(fresh.weights);
    dsel.upload(std::vector<int32_t>(want.size(), kUnset));
    TETRA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::string what = "graph select, lengths " + std::to_string(lens[0]) + " " +
                             std::to_string(lens[1]) + " " + std::to_string(lens[2]);
    const SelectStats st = compare_selection(step, fresh, s, dsel.download(), want, what);
    sparse_rows += st.sparse_rows;
    EXPECT_TRUE(dsel.guards_intact()) << what;
    EXPECT_TRUE(dws.guards_intact()) << what;
  }
  EXPECT_EQ(sparse_rows, 1 + 2 + 2) << "rows past topk over the three replays";
  TETRA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TETRA_CUDA_CHECK(cudaGraphDestroy(graph));
  TETRA_CUDA_CHECK(cudaStreamDestroy(stream));
}

// ---- host checks (no device needed: they throw before any launch) --------------------------

TEST(DsaCuda, HostChecksRefuseBadShapes) {
  namespace oc = ops::cuda;
  const DsaShape good = shape_of(kGlm5, RopeStyle::NeoX);
  EXPECT_EQ(oc::dsa_unsupported_reason(good), "");
  EXPECT_EQ(oc::dsa_unsupported_reason(shape_of({"v3.2", 64, 128, 64, 4096}, RopeStyle::GptJ)), "");
  const MlaKeys steps{reinterpret_cast<const int64_t*>(16), nullptr, 0, 0};
  const auto both_refuse = [&](const DsaShape& s, const char* why) {
    EXPECT_THROW(oc::dsa_index_keys(nullptr, nullptr, nullptr, 1e-6f, nullptr, nullptr, 1, nullptr,
                                    s, 1, nullptr, nullptr),
                 Error)
        << why;
    EXPECT_THROW(oc::dsa_select(nullptr, nullptr, nullptr, 1, nullptr, 1, nullptr, steps, nullptr,
                                s, nullptr, 1, 8, nullptr, 1 << 20, nullptr),
                 Error)
        << why;
  };
  DsaShape s = good;
  s.head_dim = 36;
  s.rope_dim = 16;
  EXPECT_NE(oc::dsa_unsupported_reason(s), "");
  both_refuse(s, "head_dim not a multiple of 8");
  s = good;
  s.head_dim = 264;
  EXPECT_NE(oc::dsa_unsupported_reason(s), "");
  both_refuse(s, "head_dim past 256");
  s = good;
  s.n_heads = 128;
  EXPECT_NE(oc::dsa_unsupported_reason(s), "");
  both_refuse(s, "Hi x D past 8192");
  s = good;
  s.topk = (1 << 20) + 1;
  EXPECT_NE(oc::dsa_unsupported_reason(s), "");
  both_refuse(s, "topk past 2^20");
  s = good;
  s.rope_dim = 63;
  both_refuse(s, "odd rope dim");
  const auto select = [&](const MlaKeys& k, int max_keys, size_t ws_bytes, const void* cache) {
    return oc::dsa_select(nullptr, nullptr, static_cast<const uint16_t*>(cache), 1, nullptr, 1,
                          nullptr, k, nullptr, good, nullptr, 1, max_keys, nullptr, ws_bytes,
                          nullptr);
  };
  EXPECT_THROW(select(MlaKeys{}, 8, 1 << 20, nullptr), Error) << "no key source";
  EXPECT_THROW(select(steps, 0, 1 << 20, nullptr), Error) << "max_keys 0";
  EXPECT_THROW(select(steps, 8, 31, nullptr), Error) << "workspace of 31 bytes for 8 keys";
  EXPECT_THROW(select(steps, 8, 1 << 20, reinterpret_cast<const void*>(8)), Error)
      << "key_cache not 16-byte aligned";
  EXPECT_EQ(oc::dsa_select_workspace_bytes(3, 1000), size_t(3) * 1000 * sizeof(float));
  // Long contexts x many tokens: as many rows as fit the budget, at least one.
  const size_t row = size_t(1) << 19;  // 2^17 keys
  EXPECT_EQ(oc::dsa_select_workspace_bytes(1 << 16, 1 << 17),
            oc::kDsaScoreWorkspaceBudget / row * row);
  EXPECT_EQ(oc::dsa_select_workspace_bytes(5, 1 << 30), size_t(1) << 32) << "one row at least";
  EXPECT_EQ(oc::dsa_select_workspace_bytes(0, 1000), size_t(0));
  EXPECT_THROW(oc::dsa_index_keys(nullptr, nullptr, nullptr, 0.0f, nullptr, nullptr, 1, nullptr,
                                  good, 1, nullptr, nullptr),
               Error)
      << "eps 0";
  // Zero tokens: nothing to launch, nothing touched.
  EXPECT_EQ(oc::dsa_index_keys(nullptr, nullptr, nullptr, 1e-6f, nullptr, nullptr, 0, nullptr,
                               good, 1, nullptr, nullptr),
            cudaSuccess);
  EXPECT_EQ(oc::dsa_select(nullptr, nullptr, nullptr, 1, nullptr, 0, nullptr, steps, nullptr, good,
                           nullptr, 0, 8, nullptr, 0, nullptr),
            cudaSuccess);
}

}  // namespace
}  // namespace tetra
