// The CUDA MLA ops (ops/attention/mla_cuda.h) against their CPU twins (mla_cpu.cpp) on fresh
// random data. Shapes: tiny (H 4, Dl 32, Dr 16), DeepSeek-V3 (H 128, Dl 512, Dr 64, nope 128,
// v 128), GLM-5 (H 64, nope 192, v 256), an odd one (H 3, Dl 48, Dr 8, nope 16, v 24) and rows of
// 38 (Dr 6: no 16-byte rows, the attention's CUDA-core 4-byte path); both RoPE pairings.
// Absorb q and up v: T 1 .. 64 (the tensor-core GEMV kernels: 1, 2 and 4 token tiles, two token
// groups at 64), 65 and 130 (the cuBLAS GEMMs), 130 captured in a graph (the GEMV kernels
// again). Attention: step-slot prefills (one sequence up to 150 tokens, and lengths 1, 5, 17, 40
// in one launch), paged caches (block size 16, shuffled block ids) continuing odd-length
// prefixes, and decode (one token per sequence, lengths 1 .. 4000: key splits, many of them
// without keys), with the split workspace and without it; a q pointer only 4-byte aligned (the
// CUDA-core kernel); a workspace too small. Cache write: some negative slots, whose rows (and
// every row not written) must keep their bits. A layer step (all four ops, key splits included)
// captured in a CUDA graph and replayed as the sequences grow. The host checks refuse bad
// shapes. Sums run in other orders on the GPU (and attention rounds its softmax weights to bf16
// for the tensor cores), so outputs agree to ~1 bf16 ulp: NMSE <= 1e-5 and max |diff| <=
// max |ref| / 64 (both sides nontrivial). Outputs are poisoned (NaN) before the launch and
// guarded by bytes that must survive.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/half.h"
#include "guarded_device_array.h"
#include "scattered_slots.h"
#include "ops/attention/mla.h"
#include "ops/attention/mla_cuda.h"
#include "ops/rope/rope.h"

namespace tetra {
namespace {

using ops::MlaKeys;
using ops::MlaShape;
using ops::RopeStyle;
using test::GuardedDeviceArray;

struct Dims {
  const char* name;
  int H, Dl, Dr, nope, v;
};

constexpr Dims kTiny{"tiny", 4, 32, 16, 32, 32};
constexpr Dims kDeepSeekV3{"deepseek-v3", 128, 512, 64, 128, 128};
constexpr Dims kGlm5{"glm-5", 64, 512, 64, 192, 256};
constexpr Dims kOdd{"odd", 3, 48, 8, 16, 24};
constexpr Dims kRow38{"row 38", 2, 32, 6, 16, 16};
constexpr Dims kAllDims[] = {kTiny, kDeepSeekV3, kGlm5, kOdd, kRow38};
// Tokens for absorb q / up v: the GEMV kernels' token tiles (1 to 8, 9 to 16, groups of 32 up
// to 64) and the cuBLAS GEMMs above 64.
constexpr int kGemmTokens[] = {1, 2, 7, 8, 9, 16, 17, 33, 64, 65, 130};

MlaShape shape_of(const Dims& d, RopeStyle style = RopeStyle::GptJ) {
  MlaShape s;
  s.n_heads = d.H;
  s.kv_lora = d.Dl;
  s.rope_dim = d.Dr;
  s.nope_dim = d.nope;
  s.v_dim = d.v;
  s.scale = 1.0f / std::sqrt(float(d.nope + d.Dr));
  s.style = style;
  return s;
}

std::string label(const Dims& d, RopeStyle style, int T) {
  return std::string(d.name) + (style == RopeStyle::NeoX ? " neox" : " gptj") + " T " +
         std::to_string(T);
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float a) {
  std::uniform_real_distribution<float> u(-a, a);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}

std::vector<int32_t> random_positions(int T, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> u(0, 1 << 17);  // angles up to ~1e5 rad
  std::vector<int32_t> p(static_cast<size_t>(T));
  for (auto& x : p) x = u(rng);
  if (T > 1) p[1] = 0;
  return p;
}

// got vs want: all finite, both mostly nonzero, NMSE <= 1e-5, max |diff| <= max |want| / 64.
void expect_close(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_FALSE(want.empty()) << what;
  double err = 0, ref = 0, max_diff = 0, max_ref = 0;
  size_t got_nonzero = 0, want_nonzero = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double a = bf16_to_float(got[i]), b = bf16_to_float(want[i]);
    ASSERT_TRUE(std::isfinite(a)) << what << ": element " << i << " not written";
    ASSERT_TRUE(std::isfinite(b)) << what << ": reference element " << i;
    err += (a - b) * (a - b);
    ref += b * b;
    max_diff = std::max(max_diff, std::fabs(a - b));
    max_ref = std::max(max_ref, std::fabs(b));
    got_nonzero += a != 0;
    want_nonzero += b != 0;
  }
  ASSERT_GT(want_nonzero, want.size() / 2) << what << ": the reference is mostly zero";
  EXPECT_GT(got_nonzero, got.size() / 2) << what << ": the output is mostly zero";
  EXPECT_LE(err / ref, 1e-5) << what;
  EXPECT_LE(max_diff, max_ref / 64) << what << " (max |ref| " << max_ref << ")";
}

// Runs launch(stream) and waits: eagerly on the default stream, or (captured) captured into a
// CUDA graph on a stream of its own and replayed once (a captured op keeps off cuBLAS).
void run_op(bool captured, const std::function<void(cudaStream_t)>& launch) {
  if (!captured) {
    launch(nullptr);
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
    return;
  }
  cudaStream_t stream;
  TETRA_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TETRA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  launch(stream);
  TETRA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TETRA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  TETRA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
  TETRA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TETRA_CUDA_CHECK(cudaGraphDestroy(graph));
  TETRA_CUDA_CHECK(cudaStreamDestroy(stream));
}

// ---- mla_cache_write ----------------------------------------------------------------------

void run_cache_write(const Dims& d, RopeStyle style, int T, std::mt19937& rng) {
  const std::string what = "cache write " + label(d, style, T);
  const MlaShape s = shape_of(d, style);
  const size_t row = size_t(s.row());
  const int64_t num_slots = T + 9;
  const float eps = 1e-6f;
  const std::vector<uint16_t> kv_a = random_bf16(size_t(T) * row, rng, 2.0f);  // [T, Dl + Dr]
  const std::vector<uint16_t> norm_w = random_bf16(size_t(d.Dl), rng, 1.5f);   // [Dl]
  const std::vector<int32_t> pos = random_positions(T, rng);
  const std::vector<float> inv_freq = ops::rope_inv_freq(10000.0, d.Dr);  // [Dr / 2]
  const std::vector<int64_t> slots = test::scattered_slots(T, num_slots, rng);  // [T]
  // [num_slots, Dl + Dr]: random rows, the ones to be written poisoned (NaN).
  std::vector<uint16_t> init = random_bf16(size_t(num_slots) * row, rng, 1.0f);
  const std::vector<bool> written = test::poison_written_rows(slots, row, init);
  std::vector<uint16_t> want = init;
  ops::mla_cache_write_cpu(kv_a.data(), norm_w.data(), eps, pos.data(), slots.data(), T,
                           inv_freq.data(), s, num_slots, want.data());

  GuardedDeviceArray<uint16_t> dkv(kv_a), dw(norm_w), dcache(init);
  GuardedDeviceArray<int32_t> dpos(pos);
  GuardedDeviceArray<int64_t> dslots(slots);
  GuardedDeviceArray<float> dfreq(inv_freq);
  TETRA_CUDA_CHECK(ops::cuda::mla_cache_write(dkv.ptr(), dw.ptr(), eps, dpos.ptr(), dslots.ptr(),
                                              T, dfreq.ptr(), s, num_slots, dcache.ptr(), nullptr));
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = dcache.download();
  EXPECT_TRUE(dcache.guards_intact()) << what;
  std::vector<uint16_t> got_w, want_w;  // the written rows
  size_t kept_changed = 0;
  for (int64_t sl = 0; sl < num_slots; ++sl) {
    const auto g = got.cbegin() + sl * int64_t(row), w = want.cbegin() + sl * int64_t(row);
    if (written[size_t(sl)]) {
      got_w.insert(got_w.end(), g, g + int64_t(row));
      want_w.insert(want_w.end(), w, w + int64_t(row));
    } else {
      kept_changed += !std::equal(g, g + int64_t(row), init.begin() + sl * int64_t(row));
    }
  }
  EXPECT_EQ(kept_changed, 0u) << what << ": rows not written changed";
  expect_close(got_w, want_w, what);
}

TEST(MlaCuda, CacheWriteMatchesCpuTwin) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(101);
  for (const Dims& d : kAllDims)
    for (RopeStyle style : {RopeStyle::GptJ, RopeStyle::NeoX})
      for (int T : {1, 7, 33}) run_cache_write(d, style, T, rng);
}

// ---- mla_absorb_q -------------------------------------------------------------------------

void run_absorb_q(const Dims& d, RopeStyle style, int T, std::mt19937& rng, bool captured = false) {
  const std::string what = "absorb q " + label(d, style, T) + (captured ? " captured" : "");
  const MlaShape s = shape_of(d, style);
  const std::vector<uint16_t> q = random_bf16(size_t(T) * d.H * s.q_head(), rng, 2.0f);
  const std::vector<uint16_t> kv_b =  // [H * (nope + v), Dl]
      random_bf16(size_t(d.H) * s.kv_b_rows_per_head() * d.Dl, rng, 0.25f);
  const std::vector<int32_t> pos = random_positions(T, rng);
  const std::vector<float> inv_freq = ops::rope_inv_freq(10000.0, d.Dr);
  std::vector<uint16_t> want(size_t(T) * d.H * s.row());  // [T, H, Dl + Dr]
  ops::mla_absorb_q_cpu(q.data(), kv_b.data(), pos.data(), T, inv_freq.data(), s, want.data());

  GuardedDeviceArray<uint16_t> dq(q), dkvb(kv_b), dout(want.size());
  GuardedDeviceArray<int32_t> dpos(pos);
  GuardedDeviceArray<float> dfreq(inv_freq);
  dout.poison();
  run_op(captured, [&](cudaStream_t st) {
    TETRA_CUDA_CHECK(ops::cuda::mla_absorb_q(dq.ptr(), dkvb.ptr(), dpos.ptr(), T, dfreq.ptr(), s,
                                             dout.ptr(), st));
  });
  const std::vector<uint16_t> got = dout.download();
  EXPECT_TRUE(dout.guards_intact()) << what;
  EXPECT_EQ(dq.download(), q) << what << ": q changed";
  // The latent and rotary parts differ in scale: compared apart.
  std::vector<uint16_t> got_lat, want_lat, got_pe, want_pe;
  for (size_t th = 0; th < size_t(T) * d.H; ++th) {
    const size_t o = th * s.row();
    got_lat.insert(got_lat.end(), got.begin() + o, got.begin() + o + d.Dl);
    want_lat.insert(want_lat.end(), want.begin() + o, want.begin() + o + d.Dl);
    got_pe.insert(got_pe.end(), got.begin() + o + d.Dl, got.begin() + o + s.row());
    want_pe.insert(want_pe.end(), want.begin() + o + d.Dl, want.begin() + o + s.row());
  }
  expect_close(got_lat, want_lat, what + " latent");
  expect_close(got_pe, want_pe, what + " rope");
}

TEST(MlaCuda, AbsorbQMatchesCpuTwin) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(202);
  for (const Dims& d : kAllDims)
    for (RopeStyle style : {RopeStyle::GptJ, RopeStyle::NeoX})
      for (int T : kGemmTokens) run_absorb_q(d, style, T, rng);
  // A large batch bucket in a decode graph: the GEMV kernels, not cuBLAS, past 64 tokens.
  for (const Dims& d : {kGlm5, kDeepSeekV3, kOdd}) run_absorb_q(d, RopeStyle::GptJ, 130, rng, true);
}

// ---- mla_attention ------------------------------------------------------------------------

struct Seq {
  int prefix = 0;  // keys already cached (paged mode only)
  int chunk = 0;   // this step's tokens
};

// Attention over random cache rows. Step-slot mode: each sequence's keys are its own tokens,
// at shuffled slots. Paged mode: block size 16, shuffled block ids. q_offset > 0 shifts q_abs
// by that many elements (an only 4-byte aligned q). split: pass the key-split workspace
// (mla_attention_workspace_bytes for T tokens), else none (no splits).
// topk > 0: a DSA selection, each token reading a random ascending subset of
// min(topk, position + 1) of its keys (MlaKeys::selected).
void run_attention(const Dims& d, const std::vector<Seq>& seqs, bool paged, std::mt19937& rng,
                   int q_offset = 0, bool split = true, int topk = 0) {
  const MlaShape s = shape_of(d);
  const int S = int(seqs.size()), row = s.row(), bs = 16;
  std::vector<int32_t> cu = {0}, pos;  // [S + 1], [T]
  int max_len = 0;
  for (const Seq& sq : seqs) {
    ASSERT_TRUE(paged || sq.prefix == 0);
    for (int i = 0; i < sq.chunk; ++i) pos.push_back(sq.prefix + i);
    cu.push_back(cu.back() + sq.chunk);
    max_len = std::max(max_len, sq.prefix + sq.chunk);
  }
  const int T = cu.back();
  std::string what = std::string("attention ") + d.name + (paged ? " paged" : " step slots") +
                     " T " + std::to_string(T) + " seqs";
  for (const Seq& sq : seqs) what += " " + std::to_string(sq.prefix) + "+" + std::to_string(sq.chunk);
  if (q_offset) what += " q offset " + std::to_string(q_offset);
  if (!split) what += " no workspace";
  if (topk) what += " selecting " + std::to_string(topk);
  std::vector<int32_t> selected(size_t(T) * std::max(topk, 1), -1);  // [T, topk]
  for (int t = 0; topk && t < T; ++t) {
    std::vector<int32_t> all(size_t(pos[size_t(t)]) + 1);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    const size_t k = std::min(all.size(), size_t(topk));
    std::sort(all.begin(), all.begin() + k);
    std::copy_n(all.begin(), k, selected.begin() + size_t(t) * topk);
  }

  std::vector<int64_t> step_slots;  // [T]
  std::vector<int32_t> tables;      // [S, mb]
  int mb = 0;
  int64_t num_slots = 0;
  if (paged) {
    mb = (max_len + bs - 1) / bs + 1;
    const int num_blocks = S * mb + 5;
    std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    tables.assign(size_t(S) * mb, -1);
    size_t next = 0;
    for (int b = 0; b < S; ++b)
      for (int k = 0; k < (seqs[size_t(b)].prefix + seqs[size_t(b)].chunk + bs - 1) / bs; ++k)
        tables[size_t(b) * mb + k] = ids[next++];
    num_slots = int64_t(num_blocks) * bs;
  } else {
    num_slots = T + 13;
    std::vector<int64_t> perm(static_cast<size_t>(num_slots));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    step_slots.assign(perm.begin(), perm.begin() + T);
  }
  const std::vector<uint16_t> cache = random_bf16(size_t(num_slots) * row, rng, 1.0f);
  const std::vector<uint16_t> q_abs = random_bf16(size_t(T) * d.H * row, rng, 4.0f);
  std::vector<uint16_t> want(size_t(T) * d.H * d.Dl);  // [T, H, Dl]
  MlaKeys keys;
  if (paged) {
    keys.block_tables = tables.data();
    keys.max_blocks_per_seq = mb;
    keys.block_size = bs;
  } else {
    keys.step_slots = step_slots.data();
  }
  if (topk) {
    keys.selected = selected.data();
    keys.selected_stride = topk;
  }
  ops::mla_attention_cpu(q_abs.data(), cache.data(), num_slots, cu.data(), S, pos.data(), keys, s,
                         want.data());

  std::vector<uint16_t> q_padded(size_t(q_offset), 0);
  q_padded.insert(q_padded.end(), q_abs.begin(), q_abs.end());
  GuardedDeviceArray<uint16_t> dq(q_padded), dcache(cache), dout(want.size());
  GuardedDeviceArray<int32_t> dcu(cu), dpos(pos), dtab(paged ? tables : std::vector<int32_t>{0});
  GuardedDeviceArray<int64_t> dslots(paged ? std::vector<int64_t>{0} : step_slots);
  GuardedDeviceArray<int32_t> dsel(selected);
  MlaKeys dkeys = keys;
  if (paged) dkeys.block_tables = dtab.ptr(); else dkeys.step_slots = dslots.ptr();
  if (topk) dkeys.selected = dsel.ptr();
  const size_t ws_bytes = split ? ops::cuda::mla_attention_workspace_bytes(s, T) : 0;
  GuardedDeviceArray<float> dws(std::max<size_t>(ws_bytes / 4, 1));
  dws.poison();  // partials a split did not write must not be read
  dout.poison();
  const auto launch = [&] {
    TETRA_CUDA_CHECK(ops::cuda::mla_attention(dq.ptr() + q_offset, dcache.ptr(), num_slots,
                                              dcu.ptr(), S, T, dpos.ptr(), dkeys, s, dout.ptr(),
                                              split ? dws.ptr() : nullptr, ws_bytes, nullptr));
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  };
  launch();
  const std::vector<uint16_t> got = dout.download();
  EXPECT_TRUE(dout.guards_intact()) << what;
  EXPECT_TRUE(dws.guards_intact()) << what << ": workspace";
  expect_close(got, want, what);
  dout.poison();
  launch();
  EXPECT_EQ(dout.download(), got) << what << ": a second launch gave other bits";
}

TEST(MlaCuda, AttentionStepSlotsMatchesCpuTwin) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(303);
  for (const Dims& d : kAllDims) {
    for (int T : {1, 7, 33, 150}) run_attention(d, {{0, T}}, false, rng);
    run_attention(d, {{0, 1}, {0, 5}, {0, 17}, {0, 40}}, false, rng);
    run_attention(d, {{0, 1}, {0, 5}, {0, 17}, {0, 40}}, false, rng, 0, false);
  }
}

TEST(MlaCuda, AttentionPagedMatchesCpuTwin) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(404);
  for (const Dims& d : kAllDims) {
    for (int T : {1, 7, 33}) run_attention(d, {{0, T}}, true, rng);
    run_attention(d, {{13, 5}, {0, 1}, {31, 33}, {1, 7}}, true, rng);           // odd prefixes
    run_attention(d, {{0, 1}, {16, 1}, {299, 1}, {1099, 1}}, true, rng);       // decode
    run_attention(d, {{0, 1}, {16, 1}, {299, 1}, {1099, 1}}, true, rng, 0, false);
    run_attention(d, {{300, 100}}, true, rng);  // a prefill continuing a cached prefix
  }
  // Decode with key splits: one long sequence (every split has keys, the last one partly), and
  // 8 sequences of 1 .. 2049 keys (the short ones leave most splits without keys).
  for (const Dims& d : {kGlm5, kDeepSeekV3, kTiny, kOdd}) {
    run_attention(d, {{3999, 1}}, true, rng);
    run_attention(d, {{0, 1}, {1, 1}, {16, 1}, {63, 1}, {64, 1}, {299, 1}, {1099, 1}, {2048, 1}},
                  true, rng);
  }
  // A q_abs only 4-byte aligned takes the 4-byte path at the real shapes too.
  run_attention(kGlm5, {{0, 1}, {16, 1}, {299, 1}, {1099, 1}}, true, rng, 2);
  run_attention(kDeepSeekV3, {{5, 9}, {100, 3}}, true, rng, 2);
}

// DSA: attention over a selection of each token's keys (fewer, more and exactly topk keys than
// the token has; decode and prefill; with and without key splits).
TEST(MlaCuda, AttentionOverASelectionMatchesCpuTwin) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(505);
  for (const Dims& d : {kGlm5, kDeepSeekV3, kTiny, kOdd}) {
    run_attention(d, {{0, 1}, {16, 1}, {299, 1}, {2047, 1}, {2048, 1}, {3000, 1}}, true, rng, 0,
                  true, 2048);
    run_attention(d, {{0, 1}, {5, 1}, {40, 1}}, true, rng, 0, false, 16);
    run_attention(d, {{0, 40}, {0, 7}}, false, rng, 0, true, 16);
    run_attention(d, {{30, 20}}, true, rng, 0, true, 16);
  }
}

// ---- mla_up_v -----------------------------------------------------------------------------

void run_up_v(const Dims& d, int T, std::mt19937& rng, bool captured = false) {
  const std::string what = "up v " + label(d, RopeStyle::GptJ, T) + (captured ? " captured" : "");
  const MlaShape s = shape_of(d);
  const std::vector<uint16_t> lat = random_bf16(size_t(T) * d.H * d.Dl, rng, 1.0f);  // [T, H, Dl]
  const std::vector<uint16_t> kv_b =
      random_bf16(size_t(d.H) * s.kv_b_rows_per_head() * d.Dl, rng, 0.25f);
  std::vector<uint16_t> want(size_t(T) * d.H * d.v);  // [T, H, v]
  ops::mla_up_v_cpu(lat.data(), kv_b.data(), T, s, want.data());

  GuardedDeviceArray<uint16_t> dlat(lat), dkvb(kv_b), dout(want.size());
  dout.poison();
  run_op(captured, [&](cudaStream_t st) {
    TETRA_CUDA_CHECK(ops::cuda::mla_up_v(dlat.ptr(), dkvb.ptr(), T, s, dout.ptr(), st));
  });
  EXPECT_TRUE(dout.guards_intact()) << what;
  expect_close(dout.download(), want, what);
}

TEST(MlaCuda, UpVMatchesCpuTwin) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(505);
  for (const Dims& d : kAllDims)
    for (int T : kGemmTokens) run_up_v(d, T, rng);
  for (const Dims& d : {kGlm5, kDeepSeekV3, kOdd}) run_up_v(d, 130, rng, true);
}

// ---- a layer step in a CUDA graph ---------------------------------------------------------

// cache write -> absorb q -> attention -> up v for 3 decoding sequences (GLM-5 shape, paged),
// captured once; each replay reads new positions, slots, kv_a and q from the same buffers, and
// attends to more keys than the step before (the grid does not depend on the key counts).
TEST(MlaCuda, LayerStepReplaysFromAGraph) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(606);
  const Dims d = kGlm5;
  const MlaShape s = shape_of(d, RopeStyle::GptJ);
  const int S = 3, T = 3, bs = 16, mb = 80, row = s.row();
  const int num_blocks = S * mb + 3;
  const int64_t num_slots = int64_t(num_blocks) * bs;
  const float eps = 1e-6f;
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const std::vector<int32_t> tables(ids.begin(), ids.begin() + S * mb);  // [S, mb]
  const std::vector<int32_t> cu = {0, 1, 2, 3};
  const std::vector<uint16_t> norm_w = random_bf16(size_t(d.Dl), rng, 1.5f);
  const std::vector<uint16_t> kv_b =
      random_bf16(size_t(d.H) * s.kv_b_rows_per_head() * d.Dl, rng, 0.1f);
  const std::vector<float> inv_freq = ops::rope_inv_freq(10000.0, d.Dr);
  std::vector<uint16_t> cache = random_bf16(size_t(num_slots) * row, rng, 1.0f);  // the prefixes

  GuardedDeviceArray<uint16_t> dkv(size_t(T) * row), dq(size_t(T) * d.H * s.q_head()),
      dqabs(size_t(T) * d.H * row), dlat(size_t(T) * d.H * d.Dl), dout(size_t(T) * d.H * d.v),
      dw(norm_w), dkvb(kv_b), dcache(cache);
  GuardedDeviceArray<int32_t> dpos(static_cast<size_t>(T)), dcu(cu), dtab(tables);
  GuardedDeviceArray<int64_t> dslots(static_cast<size_t>(T));
  GuardedDeviceArray<float> dfreq(inv_freq);
  const size_t ws_bytes = ops::cuda::mla_attention_workspace_bytes(s, T);
  GuardedDeviceArray<float> dws(std::max<size_t>(ws_bytes / 4, 1));
  const MlaKeys dkeys{nullptr, dtab.ptr(), mb, bs};
  cudaStream_t stream;
  TETRA_CUDA_CHECK(cudaStreamCreate(&stream));
  const auto step = [&] {
    TETRA_CUDA_CHECK(ops::cuda::mla_cache_write(dkv.ptr(), dw.ptr(), eps, dpos.ptr(), dslots.ptr(),
                                                T, dfreq.ptr(), s, num_slots, dcache.ptr(), stream));
    TETRA_CUDA_CHECK(ops::cuda::mla_absorb_q(dq.ptr(), dkvb.ptr(), dpos.ptr(), T, dfreq.ptr(), s,
                                             dqabs.ptr(), stream));
    TETRA_CUDA_CHECK(ops::cuda::mla_attention(dqabs.ptr(), dcache.ptr(), num_slots, dcu.ptr(), S, T,
                                              dpos.ptr(), dkeys, s, dlat.ptr(), dws.ptr(), ws_bytes,
                                              stream));
    TETRA_CUDA_CHECK(ops::cuda::mla_up_v(dlat.ptr(), dkvb.ptr(), T, s, dout.ptr(), stream));
  };
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TETRA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  step();
  TETRA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TETRA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  const MlaKeys keys{nullptr, tables.data(), mb, bs};
  for (const std::vector<int32_t>& lens : {std::vector<int32_t>{1, 40, 700},
                                           std::vector<int32_t>{2, 41, 1201}}) {
    std::vector<int32_t> pos(static_cast<size_t>(T));
    std::vector<int64_t> slots(static_cast<size_t>(T));
    for (int b = 0; b < S; ++b) {
      const int p = lens[size_t(b)] - 1;
      pos[size_t(b)] = p;
      slots[size_t(b)] = int64_t(tables[size_t(b) * mb + p / bs]) * bs + p % bs;
    }
    const std::vector<uint16_t> kv_a = random_bf16(size_t(T) * row, rng, 2.0f);
    const std::vector<uint16_t> q = random_bf16(size_t(T) * d.H * s.q_head(), rng, 2.0f);
    std::vector<uint16_t> q_abs(dqabs.size()), lat(dlat.size()), want(dout.size());
    ops::mla_cache_write_cpu(kv_a.data(), norm_w.data(), eps, pos.data(), slots.data(), T,
                             inv_freq.data(), s, num_slots, cache.data());
    ops::mla_absorb_q_cpu(q.data(), kv_b.data(), pos.data(), T, inv_freq.data(), s, q_abs.data());
    ops::mla_attention_cpu(q_abs.data(), cache.data(), num_slots, cu.data(), S, pos.data(), keys,
                           s, lat.data());
    ops::mla_up_v_cpu(lat.data(), kv_b.data(), T, s, want.data());

    dpos.upload(pos);
    dslots.upload(slots);
    dkv.upload(kv_a);
    dq.upload(q);
    dout.poison();
    dlat.poison();
    TETRA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::string what = "graph step, last position " + std::to_string(lens[2] - 1);
    expect_close(dout.download(), want, what + " out");
    expect_close(dlat.download(), lat, what + " out_lat");
    expect_close(dcache.download(), cache, what + " cache");
    for (auto* a : {&dkv, &dq, &dqabs, &dlat, &dout, &dcache})
      EXPECT_TRUE(a->guards_intact()) << what;
    EXPECT_TRUE(dws.guards_intact()) << what << ": workspace";
  }
  TETRA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TETRA_CUDA_CHECK(cudaGraphDestroy(graph));
  TETRA_CUDA_CHECK(cudaStreamDestroy(stream));
}

// The key-split workspace: sized for the shapes that split (none for 4-byte rows, which run the
// CUDA-core kernel), and refused when too small (checked before any launch).
TEST(MlaCuda, AttentionWorkspaceIsSizedAndChecked) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const MlaShape glm = shape_of(kGlm5);
  const size_t one = ops::cuda::mla_attention_workspace_bytes(glm, 1);
  EXPECT_GT(one, 0u);
  EXPECT_GE(ops::cuda::mla_attention_workspace_bytes(glm, 64), one);
  EXPECT_EQ(ops::cuda::mla_attention_workspace_bytes(glm, 0), 0u);
  EXPECT_EQ(ops::cuda::mla_attention_workspace_bytes(shape_of(kRow38), 64), 0u);
  const MlaKeys k{reinterpret_cast<const int64_t*>(16), nullptr, 0, 0};
  EXPECT_THROW(ops::cuda::mla_attention(nullptr, nullptr, 1, nullptr, 1, 1, nullptr, k, glm, nullptr,
                                        reinterpret_cast<void*>(256), one - 16, nullptr),
               Error)
      << "workspace too small";
}

// ---- host checks (no device needed: they throw before any launch) --------------------------

TEST(MlaCuda, HostChecksRefuseBadShapes) {
  namespace oc = ops::cuda;
  const MlaShape good = shape_of(kGlm5);
  const MlaKeys keys{nullptr, nullptr, 0, 0};  // neither step slots nor block tables
  const auto all_refuse = [&](const MlaShape& s, const char* why) {
    const MlaKeys k{reinterpret_cast<const int64_t*>(16), nullptr, 0, 0};
    EXPECT_THROW(oc::mla_cache_write(nullptr, nullptr, 1e-6f, nullptr, nullptr, 1, nullptr, s, 1,
                                     nullptr, nullptr),
                 Error)
        << why;
    EXPECT_THROW(oc::mla_absorb_q(nullptr, nullptr, nullptr, 1, nullptr, s, nullptr, nullptr),
                 Error)
        << why;
    EXPECT_THROW(oc::mla_attention(nullptr, nullptr, 1, nullptr, 1, 1, nullptr, k, s, nullptr,
                                   nullptr, 0, nullptr),
                 Error)
        << why;
    EXPECT_THROW(oc::mla_up_v(nullptr, nullptr, 1, s, nullptr, nullptr), Error) << why;
  };
  MlaShape s = good;
  s.kv_lora = 40;
  all_refuse(s, "kv_lora not a multiple of 16");
  s = good;
  s.rope_dim = 7;
  all_refuse(s, "odd rope dim");
  s = good;
  s.kv_lora = 1024;
  all_refuse(s, "row of 1088");
  s = good;
  s.n_heads = 0;
  all_refuse(s, "no heads");
  s = good;
  s.scale = 0;
  all_refuse(s, "zero scale");
  s = good;
  s.nope_dim = 2048;
  EXPECT_THROW(oc::mla_absorb_q(nullptr, nullptr, nullptr, 1, nullptr, s, nullptr, nullptr), Error);
  EXPECT_THROW(oc::mla_attention(nullptr, nullptr, 1, nullptr, 1, 1, nullptr, keys, good, nullptr,
                                 nullptr, 0, nullptr),
               Error)
      << "no key source";
  EXPECT_THROW(oc::mla_attention(nullptr, nullptr, 1, nullptr, 0, 1, nullptr,
                                 MlaKeys{reinterpret_cast<const int64_t*>(16), nullptr, 0, 0}, good,
                                 nullptr, nullptr, 0, nullptr),
               Error)
      << "tokens without sequences";
  EXPECT_THROW(oc::mla_cache_write(nullptr, nullptr, 0.0f, nullptr, nullptr, 1, nullptr, good, 1,
                                   nullptr, nullptr),
               Error)
      << "eps 0";
  EXPECT_THROW(oc::mla_up_v(reinterpret_cast<const uint16_t*>(8), nullptr, 1, good, nullptr,
                            nullptr),
               Error)
      << "out_lat not 16-byte aligned";
  EXPECT_THROW(oc::mla_absorb_q(nullptr, reinterpret_cast<const uint16_t*>(8), nullptr, 1, nullptr,
                                good, nullptr, nullptr),
               Error)
      << "kv_b not 16-byte aligned";
  // Zero tokens: nothing to launch, nothing touched.
  EXPECT_EQ(oc::mla_up_v(nullptr, nullptr, 0, good, nullptr, nullptr), cudaSuccess);
  EXPECT_EQ(oc::mla_absorb_q(nullptr, nullptr, nullptr, 0, nullptr, good, nullptr, nullptr),
            cudaSuccess);
}

}  // namespace
}  // namespace tetra
