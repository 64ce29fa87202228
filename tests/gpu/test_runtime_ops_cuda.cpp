// Every CUDA runtime op against its CPU twin on fresh random data and awkward sizes: RMSNorm
// (plain, fused residual, per head), RoPE (NeoX partial, full, GPT-J), KV cache write, causal
// varlen prefill attention, paged split decode attention, sampling. Outputs are poisoned (NaN
// bytes) before each launch and surrounded by guard bytes that must survive; numeric outputs must
// be finite and within NMSE 1e-5 of the CPU; sampling must pick the very same token ids.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/cuda_check.h"
#include "core/half.h"
#include "guarded_device_array.h"
#include "ops/attention/attention.h"
#include "ops/attention/attention_cuda.h"
#include "ops/norm/rms_norm.h"
#include "ops/norm/rms_norm_cuda.h"
#include "ops/rope/rope.h"
#include "ops/rope/rope_cuda.h"
#include "ops/rope/rope_kv_cuda.h"
#include "ops/sampling/sampling.h"
#include "ops/sampling/logprobs_cuda.h"
#include "ops/sampling/sampling_cuda.h"

namespace tetra::ops {
namespace {

template <typename T>
using Dev = test::GuardedDeviceArray<T>;

void sync_ok(cudaError_t launch) {
  TETRA_CUDA_CHECK(launch);
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float a = 1.0f) {
  std::uniform_real_distribution<float> u(-a, a);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}

// NMSE of got vs want (bf16) and no NaN/Inf in got.
void expect_close_bf16(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want,
                       const std::string& what, double max_nmse = 1e-5) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double err = 0, ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = bf16_to_float(got[i]), w = bf16_to_float(want[i]);
    ASSERT_TRUE(std::isfinite(g)) << what << ": element " << i << " is " << g;
    err += (g - w) * (g - w);
    ref += w * w;
  }
  const double nmse = ref > 0 ? err / ref : err;
  EXPECT_LE(nmse, max_nmse) << what;
}

class RuntimeOpsCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

const int kTokenCounts[] = {1, 3, 19, 99, 989};

// ---------------------------------------------------------------- norms
TEST_F(RuntimeOpsCuda, RmsNormAndFusedAdd) {
  std::mt19937 rng(101);
  for (int T : kTokenCounts)
    for (int H : {64, 333, 2048, 4096, 5120, 7168, 8200}) {
      const std::string what = "T=" + std::to_string(T) + " H=" + std::to_string(H);
      auto x = random_bf16(size_t(T) * H, rng, 3.0f), res = random_bf16(x.size(), rng, 3.0f);
      auto w = random_bf16(H, rng, 1.5f);
      std::vector<uint16_t> want(x.size());
      rms_norm_cpu(x.data(), w.data(), T, H, 1e-5f, want.data());
      Dev<uint16_t> dx(x), dw(w), dout(x.size()), dres(res);
      dout.poison();
      sync_ok(cuda::rms_norm(dx.ptr(), dw.ptr(), T, H, 1e-5f, dout.ptr(), nullptr));
      expect_close_bf16(dout.download(), want, "rms_norm " + what);
      EXPECT_TRUE(dout.guards_intact()) << what;

      auto res_cpu = res;
      fused_add_rms_norm_cpu(x.data(), res_cpu.data(), w.data(), T, H, 1e-6f, want.data());
      dout.poison();
      sync_ok(cuda::fused_add_rms_norm(dx.ptr(), dres.ptr(), dw.ptr(), T, H, 1e-6f, dout.ptr(), nullptr));
      EXPECT_EQ(dres.download(), res_cpu) << "residual sum is one bf16 rounding: exact, " << what;
      expect_close_bf16(dout.download(), want, "fused_add_rms_norm " + what);
      EXPECT_TRUE(dout.guards_intact() && dres.guards_intact()) << what;
    }
}

TEST_F(RuntimeOpsCuda, HeadRmsNormInAStridedBuffer) {
  std::mt19937 rng(102);
  for (int T : kTokenCounts)
    for (int D : {64, 128}) {
      const int heads = 12, stride = (heads + 4) * D;  // q heads inside a wider qkv row
      auto buf = random_bf16(size_t(T) * stride, rng, 2.0f);
      auto w = random_bf16(D, rng, 1.5f);
      auto want = buf;
      head_rms_norm_cpu(want.data(), T, heads, D, stride, w.data(), 1e-6f);
      Dev<uint16_t> dbuf(buf), dw(w);
      sync_ok(cuda::head_rms_norm(dbuf.ptr(), T, heads, D, stride, dw.ptr(), 1e-6f, nullptr));
      const auto got = dbuf.download();
      for (int t = 0; t < T; ++t)  // untouched tail of each row must be bit-identical
        for (int i = heads * D; i < stride; ++i)
          ASSERT_EQ(got[size_t(t) * stride + i], buf[size_t(t) * stride + i]);
      expect_close_bf16(got, want, "head_rms_norm T=" + std::to_string(T) + " D=" + std::to_string(D));
      EXPECT_TRUE(dbuf.guards_intact());
    }
}

// q's and k's head norms in one launch: bit-identical to two head_rms_norm launches (the same
// arithmetic per row), close to the CPU twin, gaps between a token's heads untouched.
TEST_F(RuntimeOpsCuda, HeadRmsNormQkEqualsTwoLaunches) {
  std::mt19937 rng(107);
  for (int T : kTokenCounts)
    for (int D : {64, 128, 256}) {
      const int qh = 12, kh = 3;
      const int64_t q_stride = int64_t(qh + 2) * D, k_stride = int64_t(kh) * D;
      auto q = random_bf16(size_t(T) * q_stride, rng, 2.0f);
      auto k = random_bf16(size_t(T) * k_stride, rng, 3.0f);
      auto wq = random_bf16(D, rng, 1.5f), wk = random_bf16(D, rng, 1.5f);
      const std::string what = "T=" + std::to_string(T) + " D=" + std::to_string(D);
      Dev<uint16_t> dq(q), dk(k), dq2(q), dk2(k), dwq(wq), dwk(wk);
      sync_ok(cuda::head_rms_norm_qk(dq.ptr(), q_stride, qh, dwq.ptr(), dk.ptr(), k_stride, kh,
                                     dwk.ptr(), T, D, 1e-6f, nullptr));
      sync_ok(cuda::head_rms_norm(dq2.ptr(), T, qh, D, q_stride, dwq.ptr(), 1e-6f, nullptr));
      sync_ok(cuda::head_rms_norm(dk2.ptr(), T, kh, D, k_stride, dwk.ptr(), 1e-6f, nullptr));
      const auto got_q = dq.download(), got_k = dk.download();
      EXPECT_EQ(got_q, dq2.download()) << what;
      EXPECT_EQ(got_k, dk2.download()) << what;
      auto want_q = q, want_k = k;
      head_rms_norm_cpu(want_q.data(), T, qh, D, q_stride, wq.data(), 1e-6f);
      head_rms_norm_cpu(want_k.data(), T, kh, D, k_stride, wk.data(), 1e-6f);
      for (int t = 0; t < T; ++t)
        for (int64_t i = int64_t(qh) * D; i < q_stride; ++i)
          ASSERT_EQ(got_q[size_t(t * q_stride + i)], q[size_t(t * q_stride + i)]) << what;
      expect_close_bf16(got_q, want_q, "head_rms_norm_qk q " + what);
      expect_close_bf16(got_k, want_k, "head_rms_norm_qk k " + what);
      EXPECT_TRUE(dq.guards_intact() && dk.guards_intact()) << what;
    }
  uint16_t* none = nullptr;
  EXPECT_THROW(cuda::head_rms_norm_qk(none, 512, 1, none, none, 512, 1, none, 1, 512, 1e-6f,
                                      nullptr),
               Error);  // head_dim over 256
}

// ---------------------------------------------------------------- rope
TEST_F(RuntimeOpsCuda, RopeAllStyles) {
  std::mt19937 rng(103);
  struct Case { int D, R; RopeStyle style; double theta; };
  const Case cases[] = {{128, 64, RopeStyle::NeoX, 1e6}, {128, 128, RopeStyle::NeoX, 1e6},
                        {64, 64, RopeStyle::GptJ, 1e4}, {128, 64, RopeStyle::GptJ, 1e4}};
  for (const Case& c : cases)
    for (int T : kTokenCounts) {
      const int hq = 12, hk = 4;
      RopeShape s{c.D, c.R, hq, hk, int64_t(hq + 2 * hk) * c.D, int64_t(hq + 2 * hk) * c.D, c.style};
      auto qkv = random_bf16(size_t(T) * s.q_stride, rng, 2.0f);
      std::vector<int32_t> pos(T);
      for (auto& p : pos) p = int32_t(rng() % 8192);
      const auto inv = rope_inv_freq(c.theta, c.R);
      auto want = qkv;
      apply_rope_cpu(want.data(), want.data() + hq * c.D, pos.data(), T, inv.data(), s);
      Dev<uint16_t> d(qkv);
      Dev<int32_t> dpos(pos);
      Dev<float> dinv(inv);
      sync_ok(cuda::apply_rope(d.ptr(), d.ptr() + hq * c.D, dpos.ptr(), T, dinv.ptr(), s, nullptr));
      const auto got = d.download();
      for (int t = 0; t < T; ++t)  // v heads are not touched
        for (int i = (hq + hk) * c.D; i < s.q_stride; ++i)
          ASSERT_EQ(got[size_t(t) * s.q_stride + i], qkv[size_t(t) * s.q_stride + i]);
      expect_close_bf16(got, want, "rope D=" + std::to_string(c.D) + " R=" + std::to_string(c.R) +
                                       " T=" + std::to_string(T));
      EXPECT_TRUE(d.guards_intact());
    }
}

// Fused RoPE + KV write: bit-identical to apply_rope then write_kv_cache (both on the GPU), and
// close to the CPU RoPE. Slots include padding (-1) and one past the cache; strides with an odd
// element count (pad) leave rows unaligned.
TEST_F(RuntimeOpsCuda, RopeAndKvWriteFusedMatchesTheTwoOps) {
  std::mt19937 rng(104);
  struct Case { int D, R, hq, hk, pad; RopeStyle style; };
  // (Rotary dims above 128 give a lane more than the 2 pairs whose angle the kernel computes
  // before its PDL wait: 256 and 192 take the later loop too.)
  const Case cases[] = {{128, 64, 12, 4, 0, RopeStyle::NeoX}, {64, 64, 6, 3, 1, RopeStyle::GptJ},
                        {128, 128, 8, 1, 8, RopeStyle::NeoX}, {64, 32, 5, 5, 3, RopeStyle::NeoX},
                        {256, 256, 4, 2, 0, RopeStyle::NeoX}, {256, 192, 3, 1, 2, RopeStyle::GptJ}};
  for (const Case& c : cases)
    for (int T : {1, 3, 19}) {
      const std::string what = "D=" + std::to_string(c.D) + " R=" + std::to_string(c.R) +
                               " hk=" + std::to_string(c.hk) + " pad=" + std::to_string(c.pad) +
                               " T=" + std::to_string(T);
      const int64_t qs = int64_t(c.hq) * c.D + c.pad, ks = int64_t(c.hk) * c.D + c.pad;
      const int64_t row = int64_t(c.hk) * c.D;
      RopeShape s{c.D, c.R, c.hq, c.hk, qs, ks, c.style};
      auto q = random_bf16(size_t(T) * qs, rng, 2.0f), k = random_bf16(size_t(T) * ks, rng, 2.0f);
      auto v = random_bf16(size_t(T) * ks, rng, 2.0f);
      const int num_slots = 2 * T + 4;
      std::vector<int32_t> pos(T);
      std::vector<int64_t> slots(T);
      for (int t = 0; t < T; ++t) {
        pos[t] = int32_t(rng() % 9000);
        slots[t] = t == 1 ? -1 : t == 2 ? num_slots : 2 * t + 1;  // padding, out of range, valid
      }
      const auto inv = rope_inv_freq(1e4 + 77.0 * c.R, c.R);
      Dev<int32_t> dpos(pos);
      Dev<int64_t> dslots(slots);
      Dev<float> dinv(inv);
      // Reference: the two separate GPU ops.
      Dev<uint16_t> rq(q), rk(k), rv(v), rkc(size_t(num_slots) * row), rvc(size_t(num_slots) * row);
      TETRA_CUDA_CHECK(cudaMemset(rkc.ptr(), 0x3c, rkc.size() * 2));
      TETRA_CUDA_CHECK(cudaMemset(rvc.ptr(), 0x3c, rvc.size() * 2));
      sync_ok(cuda::apply_rope(rq.ptr(), rk.ptr(), dpos.ptr(), T, dinv.ptr(), s, nullptr));
      AttentionShape as;
      as.n_heads = c.hq;
      as.n_kv_heads = c.hk;
      as.head_dim = c.D;
      as.kv_stride = ks;
      sync_ok(cuda::write_kv_cache(rk.ptr(), rv.ptr(), dslots.ptr(), T, as, num_slots, 1,
                                   rkc.ptr(), rvc.ptr(), nullptr));
      // Fused.
      Dev<uint16_t> fq(q), fk(k), fv(v), fkc(size_t(num_slots) * row), fvc(size_t(num_slots) * row);
      TETRA_CUDA_CHECK(cudaMemset(fkc.ptr(), 0x3c, fkc.size() * 2));
      TETRA_CUDA_CHECK(cudaMemset(fvc.ptr(), 0x3c, fvc.size() * 2));
      sync_ok(cuda::rope_and_write_kv(fq.ptr(), fk.ptr(), fv.ptr(), ks, dpos.ptr(), dslots.ptr(), T,
                                      dinv.ptr(), s, num_slots, fkc.ptr(), fvc.ptr(), nullptr));
      EXPECT_EQ(fq.download(), rq.download()) << what;
      EXPECT_EQ(fk.download(), rk.download()) << what;
      EXPECT_EQ(fv.download(), v) << what << ": v is read only";
      EXPECT_EQ(fkc.download(), rkc.download()) << what;
      EXPECT_EQ(fvc.download(), rvc.download()) << what;
      // And the rotation is the CPU's (within the sincosf tolerance of the rope test).
      auto wq = q, wk = k;
      apply_rope_cpu(wq.data(), wk.data(), pos.data(), T, inv.data(), s);
      expect_close_bf16(fq.download(), wq, "fused rope q " + what);
      expect_close_bf16(fk.download(), wk, "fused rope k " + what);
      const auto kc = fkc.download(), kr = fk.download();
      for (int t = 0; t < T; ++t)
        if (slots[t] >= 0 && slots[t] < num_slots)
          for (int64_t i = 0; i < row; ++i)
            ASSERT_EQ(kc[size_t(slots[t] * row + i)], kr[size_t(t * ks + i)]) << what;
      EXPECT_TRUE(fq.guards_intact() && fk.guards_intact() && fkc.guards_intact() &&
                  fvc.guards_intact())
          << what;
    }
}

// ---------------------------------------------------------------- prefill attention
struct GqaCase { int hq, hk; };
const GqaCase kGqa[] = {{4, 4}, {8, 2}, {12, 1}};  // ratios 1, 4, 12

void run_prefill_case(const std::vector<int>& lens, int D, GqaCase g, bool fused, std::mt19937& rng) {
  std::vector<int32_t> cu = {0};
  for (int L : lens) cu.push_back(cu.back() + L);
  const int T = cu.back(), B = int(lens.size());
  const int max_len = *std::max_element(lens.begin(), lens.end());
  AttentionShape s{g.hq, g.hk, D, 1.0f / std::sqrt(float(D)), 0, 0};
  const int W = (g.hq + 2 * g.hk) * D;
  if (fused) s.q_stride = s.kv_stride = W;
  // One [T, W] qkv buffer either way; packed mode reads three separate slices.
  auto qkv = random_bf16(size_t(T) * W, rng, 2.0f);
  std::vector<uint16_t> q, k, v;
  const uint16_t *qp, *kp, *vp;
  if (fused) {
    qp = qkv.data(), kp = qkv.data() + g.hq * D, vp = qkv.data() + (g.hq + g.hk) * D;
  } else {
    q = random_bf16(size_t(T) * g.hq * D, rng, 2.0f);
    k = random_bf16(size_t(T) * g.hk * D, rng, 2.0f);
    v = random_bf16(size_t(T) * g.hk * D, rng);
    qp = q.data(), kp = k.data(), vp = v.data();
  }
  std::vector<uint16_t> want(size_t(T) * g.hq * D);
  prefill_attention_cpu(qp, kp, vp, cu.data(), B, s, want.data());

  Dev<uint16_t> dqkv(fused ? qkv : std::vector<uint16_t>(1)), dq(fused ? std::vector<uint16_t>(1) : q),
      dk(fused ? std::vector<uint16_t>(1) : k), dv(fused ? std::vector<uint16_t>(1) : v);
  Dev<int32_t> dcu(cu);
  Dev<uint16_t> dout(want.size());
  dout.poison();
  const uint16_t* gq = fused ? dqkv.ptr() : dq.ptr();
  const uint16_t* gk = fused ? dqkv.ptr() + g.hq * D : dk.ptr();
  const uint16_t* gv = fused ? dqkv.ptr() + (g.hq + g.hk) * D : dv.ptr();
  sync_ok(cuda::prefill_attention(gq, gk, gv, dcu.ptr(), B, max_len, s, dout.ptr(), nullptr));
  std::string what = "prefill D=" + std::to_string(D) + " hq=" + std::to_string(g.hq) +
                     " hk=" + std::to_string(g.hk) + (fused ? " fused" : "") + " lens";
  for (int L : lens) what += " " + std::to_string(L);
  expect_close_bf16(dout.download(), want, what);
  EXPECT_TRUE(dout.guards_intact()) << what;
}

TEST_F(RuntimeOpsCuda, PrefillAttentionSingleSequences) {
  std::mt19937 rng(104);
  for (int D : {64, 128})
    for (GqaCase g : kGqa)
      for (int L : kTokenCounts) run_prefill_case({L}, D, g, false, rng);
}

TEST_F(RuntimeOpsCuda, PrefillAttentionVarlenBatchAndFusedQkv) {
  std::mt19937 rng(105);
  for (int D : {64, 128})
    for (GqaCase g : kGqa) {
      run_prefill_case({19, 1, 989, 3, 99}, D, g, false, rng);
      run_prefill_case({99, 19, 3}, D, g, true, rng);
    }
}

// Lengths around the kernel's 64-key and 128-query tiles (one short of, one past), a length
// crossing several query tiles, and GQA groups 1, 8 and 12 at both head dims.
TEST_F(RuntimeOpsCuda, PrefillAttentionTileEdgesAndGroups) {
  std::mt19937 rng(106);
  const GqaCase groups[] = {{2, 2}, {8, 1}, {12, 1}};
  for (int D : {64, 128})
    for (GqaCase g : groups)
      for (int L : {1, 63, 64, 65, 127, 128, 129, 1000}) run_prefill_case({L}, D, g, false, rng);
}

// Varlen batches with empty and one-token sequences between long ones, packed and fused qkv:
// blocks of the short sequences leave early while neighbours run every tile.
TEST_F(RuntimeOpsCuda, PrefillAttentionVarlenWithEmptySequences) {
  std::mt19937 rng(107);
  for (int D : {64, 128})
    for (GqaCase g : {GqaCase{8, 1}, GqaCase{12, 1}}) {
      run_prefill_case({0, 129, 1, 0, 257, 2, 64}, D, g, false, rng);
      run_prefill_case({1, 0, 300, 0, 65}, D, g, true, rng);
    }
}

// ---------------------------------------------------------------- paged cache + decode
void run_decode_case(const std::vector<int>& ctx, int D, GqaCase g, int block_size, std::mt19937& rng) {
  const int S = int(ctx.size());
  const AttentionShape s{g.hq, g.hk, D, 1.0f / std::sqrt(float(D)), 0, 0};
  const int max_ctx = *std::max_element(ctx.begin(), ctx.end());
  const int max_blocks = (max_ctx + block_size - 1) / block_size + 1;  // one spare column
  int total_blocks = 0;
  for (int L : ctx) total_blocks += (L + block_size - 1) / block_size;
  const int num_blocks = total_blocks + 7;  // some blocks belong to nobody
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> tables(size_t(S) * max_blocks, -1), lens(ctx.begin(), ctx.end());
  int next = 0;
  for (int b = 0; b < S; ++b)
    for (int j = 0; j < (ctx[b] + block_size - 1) / block_size; ++j) tables[b * max_blocks + j] = ids[next++];

  // Fill the cache through the cache-write op, on both sides, from per-token k/v.
  int T = 0;
  for (int L : ctx) T += L;
  auto k = random_bf16(size_t(T) * g.hk * D, rng, 2.0f), v = random_bf16(size_t(T) * g.hk * D, rng);
  std::vector<int64_t> slots(T);
  for (int b = 0, t = 0; b < S; ++b)
    for (int j = 0; j < ctx[b]; ++j, ++t)
      slots[t] = int64_t(tables[b * max_blocks + j / block_size]) * block_size + j % block_size;
  slots[0] = -1;  // a padding token: skipped on both sides
  const size_t cache_elems = size_t(num_blocks) * block_size * g.hk * D;
  std::vector<uint16_t> kc(cache_elems), vc(cache_elems);
  {
    std::mt19937 fill(7);  // unowned slots hold finite junk, identical on both sides
    for (auto& x : kc) x = float_to_bf16(float(int(fill() % 17) - 8));
    vc = kc;
  }
  Dev<uint16_t> dkc(kc), dvc(vc), dk(k), dv(v);
  Dev<int64_t> dslots(slots);
  write_kv_cache_cpu(k.data(), v.data(), slots.data(), T, s, num_blocks, block_size, kc.data(), vc.data());
  sync_ok(cuda::write_kv_cache(dk.ptr(), dv.ptr(), dslots.ptr(), T, s, num_blocks, block_size,
                               dkc.ptr(), dvc.ptr(), nullptr));
  ASSERT_EQ(dkc.download(), kc) << "k cache after write";
  ASSERT_EQ(dvc.download(), vc) << "v cache after write";
  EXPECT_TRUE(dkc.guards_intact() && dvc.guards_intact());

  auto q = random_bf16(size_t(S) * g.hq * D, rng, 2.0f);
  PagedKv kv{kc.data(), vc.data(), tables.data(), lens.data(), num_blocks, block_size, max_blocks};
  std::vector<uint16_t> want(q.size());
  paged_decode_attention_cpu(q.data(), kv, S, s, want.data());

  Dev<uint16_t> dq(q), dout(want.size());
  Dev<int32_t> dtables(tables), dlens(lens);
  PagedKv dkv{dkc.ptr(), dvc.ptr(), dtables.ptr(), dlens.ptr(), num_blocks, block_size, max_blocks};
  const size_t ws_bytes = cuda::paged_decode_workspace_bytes(S, s, dkv);
  Dev<unsigned char> ws(std::max<size_t>(ws_bytes, 1));
  dout.poison();
  sync_ok(cuda::paged_decode_attention(dq.ptr(), dkv, S, s, ws.ptr(), ws_bytes, dout.ptr(), nullptr));
  std::string what = "decode D=" + std::to_string(D) + " hq=" + std::to_string(g.hq) +
                     " hk=" + std::to_string(g.hk) + " bs=" + std::to_string(block_size) + " ctx";
  for (int L : ctx) what += " " + std::to_string(L);
  expect_close_bf16(dout.download(), want, what);
  EXPECT_TRUE(dout.guards_intact() && ws.guards_intact()) << what;
}

TEST_F(RuntimeOpsCuda, PagedDecodeShortContextsOneSplit) {
  std::mt19937 rng(106);
  for (int D : {64, 128})
    for (GqaCase g : kGqa) run_decode_case({1, 3, 19, 99, 300}, D, g, 16, rng);
}

TEST_F(RuntimeOpsCuda, PagedDecodeLongContextsSplitAndMerged) {
  std::mt19937 rng(107);
  for (int D : {64, 128})
    for (GqaCase g : kGqa) {
      run_decode_case({8192, 1, 989, 4097, 19, 513}, D, g, 16, rng);
      run_decode_case({3, 2000, 8192}, D, g, 32, rng);
    }
}

TEST_F(RuntimeOpsCuda, KvBlockCopies) {
  std::mt19937 rng(109);
  const int num_blocks = 40;
  for (int64_t block_elems : {int64_t(16 * 8 * 128), int64_t(3 * 5)}) {  // aligned and odd
    auto kc = random_bf16(num_blocks * block_elems, rng), vc = random_bf16(kc.size(), rng);
    const std::vector<int32_t> pairs = {3, 30, 0, 31, 17, 5, 39, 6};
    Dev<uint16_t> dk(kc), dv(vc);
    Dev<int32_t> dp(pairs);
    copy_kv_blocks_cpu(kc.data(), vc.data(), pairs.data(), 4, num_blocks, block_elems);
    sync_ok(cuda::copy_kv_blocks(dk.ptr(), dv.ptr(), dp.ptr(), 4, num_blocks, block_elems, nullptr));
    EXPECT_EQ(dk.download(), kc);
    EXPECT_EQ(dv.download(), vc);
    EXPECT_TRUE(dk.guards_intact() && dv.guards_intact());
  }
}

// ---------------------------------------------------------------- sampling
// A vocabulary that is a multiple of 4 (the kernel's first pass reads float4) and an odd one.
class SamplingVocab : public RuntimeOpsCuda, public ::testing::WithParamInterface<int> {};

TEST_P(SamplingVocab, SamplingPicksTheSameTokensAsTheCpu) {
  std::mt19937 rng(108);
  const int V = GetParam();
  std::vector<SamplingParams> params;
  auto add = [&](float temp, int k, float p, float minp, float rep, float freq, float pres) {
    SamplingParams sp;
    sp.temperature = temp, sp.top_k = k, sp.top_p = p, sp.min_p = minp;
    sp.repetition_penalty = rep, sp.frequency_penalty = freq, sp.presence_penalty = pres;
    sp.seed = rng();
    sp.step = rng() % 1000;
    params.push_back(sp);
  };
  add(0.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);    // greedy
  add(0.0f, 0, 1.0f, 0.0f, 1.3f, 0.4f, 0.2f);    // greedy with penalties
  add(1.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);    // plain sampling
  add(0.7f, 50, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);   // top-k
  add(0.8f, 0, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f);    // top-p
  add(1.2f, 0, 1.0f, 0.05f, 1.0f, 0.0f, 0.0f);   // min-p
  add(0.9f, 40, 0.8f, 0.02f, 1.1f, 0.5f, 0.5f);  // everything
  add(1.0f, 1, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);    // top-k 1
  add(2.0f, 1000, 0.5f, 0.0f, 1.0f, -0.3f, 0.0f);
  const int rows = int(params.size());
  // Logits: a few peaked rows, a few flat ones, some ties and masked (-inf) entries.
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> logits(size_t(rows) * V);
  for (int r = 0; r < rows; ++r)
    for (int v = 0; v < V; ++v) {
      float x = n01(rng) * (r % 2 ? 1.0f : 4.0f);
      if (v % 977 == 0) x = -INFINITY;
      if (v % 1013 == 0) x = 3.0f;  // ties
      logits[size_t(r) * V + v] = x;
    }
  // Histories: prompt and output tokens per row.
  std::vector<int32_t> pt, po = {0}, ot, oo = {0};
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < 200; ++i) pt.push_back(int32_t(rng() % V));
    for (int i = 0; i < 300; ++i) ot.push_back(int32_t(rng() % 64));  // repeats
    po.push_back(int32_t(pt.size()));
    oo.push_back(int32_t(ot.size()));
  }
  // Logit biases on every third row: the row's argmax banned, a random token pushed up by 100
  // (the greedy rows then draw it), a few other biases; distinct ids per row.
  std::vector<int32_t> bt, bo = {0};
  std::vector<float> bv;
  for (int r = 0; r < rows; ++r) {
    if (r % 3 == 0) {
      const float* row = logits.data() + size_t(r) * V;
      const int top = int(std::max_element(row, row + V) - row);
      std::vector<int32_t> ids = {top};
      while (ids.size() < 6) {
        const int32_t t = int32_t(rng() % V);
        if (std::find(ids.begin(), ids.end(), t) == ids.end()) ids.push_back(t);
      }
      const float values[6] = {-INFINITY, 100.0f, -0.5f, 0.25f, -100.0f, 3.0f};
      for (int i = 0; i < 6; ++i) bt.push_back(ids[size_t(i)]), bv.push_back(values[i]);
    }
    bo.push_back(int32_t(bt.size()));
  }
  Dev<float> dlogits(logits), dbv(bv);
  Dev<int32_t> dpt(pt), dpo(po), dot(ot), doo(oo), dtok(rows), dbt(bt);
  const TokenHistory host_hist{pt.data(), po.data(), ot.data(), oo.data()};
  const TokenHistory dev_hist{dpt.ptr(), dpo.ptr(), dot.ptr(), doo.ptr()};
  const LogitBias host_bias{bt.data(), bv.data(), bo.data()};
  const LogitBias dev_bias{dbt.ptr(), dbv.ptr(), bo.data()};  // offsets stay on the host
  Dev<unsigned char> ws(std::vector<unsigned char>(cuda::sampling_workspace_bytes(rows, V), 0));
  int mismatches = 0;
  for (int round = 0; round < 8; ++round) {  // new steps: new draws
    for (auto& p : params) ++p.step;
    std::vector<int32_t> want(rows);
    sample_cpu(logits.data(), rows, V, params.data(), host_hist, want.data(), host_bias);
    dtok.poison();
    sync_ok(cuda::sample(dlogits.ptr(), rows, V, params.data(), dev_hist, dev_bias, ws.ptr(),
                         ws.size(), dtok.ptr(), nullptr));
    const auto got = dtok.download();
    for (int r = 0; r < rows; ++r) {
      EXPECT_EQ(got[r], want[r]) << "round " << round << " row " << r;
      mismatches += got[r] != want[r];
      EXPECT_GE(want[r], 0);
    }
    EXPECT_TRUE(dtok.guards_intact() && ws.guards_intact());
  }
  EXPECT_EQ(mismatches, 0);
  // The bias moved draws: row 0 (greedy) takes its +100 token instead of its banned argmax.
  std::vector<int32_t> unbiased(rows);
  sample_cpu(logits.data(), rows, V, params.data(), host_hist, unbiased.data());
  std::vector<int32_t> biased(rows);
  sample_cpu(logits.data(), rows, V, params.data(), host_hist, biased.data(), host_bias);
  EXPECT_EQ(biased[0], bt[1]);
  EXPECT_NE(unbiased[0], biased[0]);
}

// Plain greedy rows only: the argmax kernel alone, with the workspace of no scratch rows. Rows of
// 1..70, so the blocks per row go from 256 to 8 and 70 rows take two launches; ties at the row's
// maximum go to the lowest index; -0 equals +0; a row of NaN and -inf has nothing to draw (-1).
TEST_P(SamplingVocab, GreedyRowsTakeTheArgmaxKernel) {
  std::mt19937 rng(110);
  const int V = GetParam();
  std::normal_distribution<float> n01(0.0f, 1.0f);
  for (int rows : {1, 3, 40, 70}) {
    std::vector<float> logits(size_t(rows) * V);
    for (float& x : logits) x = n01(rng);
    float* first = logits.data();
    std::fill(first, first + V, -INFINITY);
    for (int v = 1; v < V; v += 3) first[v] = NAN;
    if (rows > 1) {
      float* tied = logits.data() + V;
      tied[V - 1] = tied[V / 2] = tied[7] = 9.0f;  // the lowest index wins
      if (rows > 2) {
        float* zero = logits.data() + 2 * size_t(V);
        std::fill_n(zero, V, -1.0f);
        zero[V - 2] = -0.0f;
      }
    }
    std::vector<SamplingParams> params(rows);
    for (SamplingParams& p : params) p.temperature = 0.0f;
    Dev<unsigned char> ws(std::vector<unsigned char>(cuda::sampling_workspace_bytes(0, V), 0));
    ASSERT_FALSE(cuda::sampling_needs_scratch(params.data(), rows));
    std::vector<int32_t> want(rows);
    sample_cpu(logits.data(), rows, V, params.data(), TokenHistory{}, want.data());
    Dev<float> dlogits(logits);
    Dev<int32_t> dtok(rows);
    dtok.poison();
    sync_ok(cuda::sample(dlogits.ptr(), rows, V, params.data(), TokenHistory{}, LogitBias{},
                         ws.ptr(), ws.size(), dtok.ptr(), nullptr));
    EXPECT_EQ(dtok.download(), want) << rows << " rows";
    // The kernel left its keys and counters zero for the next call: the same tokens again.
    dtok.poison();
    sync_ok(cuda::sample(dlogits.ptr(), rows, V, params.data(), TokenHistory{}, LogitBias{},
                         ws.ptr(), ws.size(), dtok.ptr(), nullptr));
    EXPECT_EQ(dtok.download(), want) << rows << " rows, second call";
    EXPECT_EQ(ws.download(), std::vector<unsigned char>(ws.size(), 0)) << "argmax state not reset";
    EXPECT_EQ(want[0], -1);
    if (rows > 1) EXPECT_EQ(want[1], 7);
    if (rows > 2) EXPECT_EQ(want[2], V - 2);
    EXPECT_TRUE(dtok.guards_intact());
  }
}

// ---------------------------------------------------------------- logprobs
// The device logprobs against position_logprobs on fresh random rows: peaked and flat rows, ties
// at the top (lowest id first), -0 against +0, NaN and -inf entries, a row of nothing finite, a row
// with +inf entries, tops 0..20, queries in any order and the same row asked twice.
TEST_P(SamplingVocab, LogprobsMatchTheCpu) {
  std::mt19937 rng(112);
  const int V = GetParam(), rows = 9;
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> logits(size_t(rows) * V);
  for (int r = 0; r < rows; ++r)
    for (int v = 0; v < V; ++v) logits[size_t(r) * V + v] = n01(rng) * (r % 2 ? 1.0f : 6.0f);
  float* tied = logits.data() + size_t(2) * V;
  tied[V - 1] = tied[V / 3] = tied[11] = 40.0f;  // three-way tie at the top
  tied[5] = -0.0f, tied[6] = 0.0f;
  float* holes = logits.data() + size_t(3) * V;
  for (int v = 0; v < V; v += 7) holes[v] = (v / 7) % 2 ? NAN : -INFINITY;
  float* none = logits.data() + size_t(4) * V;
  for (int v = 0; v < V; ++v) none[v] = v % 2 ? NAN : -INFINITY;
  float* inf = logits.data() + size_t(5) * V;
  inf[17] = inf[V - 3] = INFINITY;
  float* flat = logits.data() + size_t(6) * V;
  std::fill_n(flat, V, 1.5f);
  std::vector<LogprobQuery> queries;
  for (int r = rows - 1; r >= 0; --r)
    queries.push_back({r, int32_t(rng() % V), r == 0 ? 0 : (r * 7) % (kMaxTopLogprobs + 1)});
  queries.push_back({2, 11, kMaxTopLogprobs});
  queries.push_back({5, 17, 3});
  queries.push_back({1, V - 1, 1});
  // One query (256 parts of its row), all of them (many parts each), and 600 (one part each).
  for (int i = 0; queries.size() < 600; ++i) queries.push_back(queries[size_t(i) % 12]);
  Dev<float> dlogits(logits);
  for (const int n : {1, 12, 600}) {
    const std::vector<LogprobQuery> asked(queries.begin(), queries.begin() + n);
    Dev<LogprobQuery> dq(asked);
    Dev<cuda::PositionLogprobsOut> dout(n);
    Dev<unsigned char> ws(std::vector<unsigned char>(cuda::logprobs_workspace_bytes(n, V), 0));
    for (int call = 0; call < 2; ++call)  // the second call finds the counters zero again
      sync_ok(cuda::position_logprobs(dlogits.ptr(), V, dq.ptr(), n, ws.ptr(), ws.size(), dout.ptr(), nullptr));
    const auto got = dout.download();
    for (int i = 0; i < n; ++i) {
      const LogprobQuery& q = queries[size_t(i)];
      const PositionLogprobs want =
          position_logprobs(logits.data() + size_t(q.row) * V, V, q.token, q.top);
      const PositionLogprobs have = cuda::to_position_logprobs(got[size_t(i)]);
      auto near = [](float a, float b) {
        return (std::isinf(a) && a == b) || std::fabs(a - b) <= 1e-6f * std::max(1.0f, std::fabs(b));
      };
      EXPECT_TRUE(near(have.logprob, want.logprob)) << "query " << i << ": " << have.logprob << " vs " << want.logprob;
      ASSERT_EQ(have.top.size(), want.top.size()) << "query " << i;
      for (size_t j = 0; j < want.top.size(); ++j) {
        EXPECT_EQ(have.top[j].token, want.top[j].token) << "query " << i << " rank " << j;
        EXPECT_TRUE(near(have.top[j].logprob, want.top[j].logprob)) << "query " << i << " rank " << j;
      }
    }
    EXPECT_TRUE(dout.guards_intact() && ws.guards_intact()) << n << " queries";
    const auto counters = ws.download();
    EXPECT_TRUE(std::all_of(counters.begin(), counters.begin() + 4 * n, [](unsigned char b) { return b == 0; }))
        << "counters not reset, " << n << " queries";

    // The tokens read on the device (position_logprobs' `sampled`): query i's token field is an
    // index into them, in reverse order; the same answers as the queries that name the tokens,
    // and a drawn token outside the vocabulary (-1, V) gets -inf with its top list intact.
    std::vector<int32_t> drawn(size_t(n) + 2);
    std::vector<LogprobQuery> by_index(asked);
    for (int i = 0; i < n; ++i) {
      drawn[size_t(n - 1 - i)] = asked[size_t(i)].token;
      by_index[size_t(i)].token = n - 1 - i;
    }
    drawn[size_t(n)] = -1, drawn[size_t(n) + 1] = V;
    by_index[0].token = n, by_index[size_t(n) - 1].token = n + 1;
    Dev<int32_t> ddrawn(drawn);
    Dev<LogprobQuery> dq2(by_index);
    sync_ok(cuda::position_logprobs(dlogits.ptr(), V, dq2.ptr(), n, ws.ptr(), ws.size(), dout.ptr(),
                                    nullptr, ddrawn.ptr()));
    const auto got2 = dout.download();
    for (int i = 0; i < n; ++i) {
      const bool outside = i == 0 || i == n - 1;
      if (outside)
        EXPECT_EQ(got2[size_t(i)].logprob, -INFINITY) << "query " << i;
      else
        EXPECT_EQ(got2[size_t(i)].logprob, got[size_t(i)].logprob) << "query " << i;
      ASSERT_EQ(got2[size_t(i)].top_count, got[size_t(i)].top_count) << "query " << i;
      for (int j = 0; j < got[size_t(i)].top_count; ++j) {
        EXPECT_EQ(got2[size_t(i)].top_ids[j], got[size_t(i)].top_ids[j]) << "query " << i;
        EXPECT_EQ(got2[size_t(i)].top_logprobs[j], got[size_t(i)].top_logprobs[j]) << "query " << i;
      }
    }
    EXPECT_TRUE(ddrawn.guards_intact());
  }
}

INSTANTIATE_TEST_SUITE_P(Vocab, SamplingVocab, ::testing::Values(151936, 32003));

}  // namespace
}  // namespace tetra::ops
