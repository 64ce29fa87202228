// CUDA MoE token path against its CPU twins: routing (same ids, weights within 1e-6, in practice
// bit-identical), router logits, both layouts, permute and combine (bit-exact). Every device
// output sits between guard bytes and is poisoned before the launch, so stray or missing writes
// show up as differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/half.h"
#include "moe/router.h"
#include "moe/token_layout.h"
#include "moe/token_movement.h"
#include "ops/norm/rms_norm.h"
#include "ops/moe/moe_ops_cuda.h"
#include "ops/moe/token_path.h"
#include "ops/moe/token_path_tiny.h"

using namespace tetra;
using namespace tetra::moe;

namespace {

constexpr uint8_t kPoison = 0xA5;
constexpr size_t kGuard = 512;  // bytes on each side of every device buffer

// Device array of n T's between two poisoned guard regions. `shift` elements of extra offset
// make deliberately misaligned pointers (forces the kernels' scalar paths).
template <typename T>
class DevBuf {
 public:
  explicit DevBuf(size_t n, size_t shift = 0) : n_(n), shift_(shift) {
    TETRA_CUDA_CHECK(cudaMalloc(&base_, bytes_total()));
    TETRA_CUDA_CHECK(cudaMemset(base_, kPoison, bytes_total()));
  }
  ~DevBuf() { cudaFree(base_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;

  T* get() { return reinterpret_cast<T*>(base_ + kGuard) + shift_; }
  void upload(const std::vector<T>& v) {
    TETRA_CHECK_EQ(v.size(), n_);
    TETRA_CUDA_CHECK(cudaMemcpy(get(), v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  void poison() { TETRA_CUDA_CHECK(cudaMemset(base_, kPoison, bytes_total())); }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    TETRA_CUDA_CHECK(cudaMemcpy(v.data(), reinterpret_cast<const T*>(base_ + kGuard) + shift_,
                                n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  // True when nothing outside [get(), get() + n) changed.
  bool guards_intact() const {
    std::vector<uint8_t> raw(bytes_total());
    TETRA_CUDA_CHECK(cudaMemcpy(raw.data(), base_, raw.size(), cudaMemcpyDeviceToHost));
    const size_t lo = kGuard + shift_ * sizeof(T), hi = lo + n_ * sizeof(T);
    for (size_t i = 0; i < raw.size(); ++i)
      if ((i < lo || i >= hi) && raw[i] != kPoison) return false;
    return true;
  }

 private:
  size_t bytes_total() const { return (n_ + shift_) * sizeof(T) + 2 * kGuard; }
  char* base_ = nullptr;
  size_t n_, shift_;
};

// A host vector filled with the poison pattern, the CPU twin of a freshly poisoned DevBuf.
template <typename T>
std::vector<T> poisoned(size_t n) {
  std::vector<T> v(n);
  std::memset(v.data(), kPoison, n * sizeof(T));
  return v;
}

template <typename T>
bool bytes_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

void device_sync() { TETRA_CUDA_CHECK(cudaDeviceSynchronize()); }

#define SKIP_WITHOUT_GPU() \
  if (!tetra::cuda_available()) GTEST_SKIP() << "no CUDA device"

// Logits with deliberate trouble: duplicated values (exact ties), saturating sigmoid inputs
// (distinct logits, equal float32 scores), and the odd NaN.
std::vector<float> tricky_logits(int T, int E, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::uniform_int_distribution<int> ue(0, E - 1);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  std::vector<float> l(size_t(T) * E);
  for (int t = 0; t < T; ++t) {
    float* row = l.data() + size_t(t) * E;
    for (int e = 0; e < E; ++e) row[e] = nd(rng);
    const float kind = u01(rng);
    if (kind < 0.3f) {
      for (int i = 0; i < E / 4; ++i) row[ue(rng)] = row[ue(rng)];  // exact ties
    } else if (kind < 0.4f) {
      for (int i = 0; i < 4; ++i) row[ue(rng)] = 20.0f + 10.0f * u01(rng);  // sigmoid == 1.0f
    } else if (kind < 0.45f) {
      row[ue(rng)] = NAN;
    } else if (kind < 0.5f) {
      std::fill(row, row + E, 0.75f);  // everything tied
    }
  }
  return l;
}

struct RouteCase {
  Scoring scoring;
  int E, top_k, n_group, topk_group;
  bool bias, norm;
  float scale;
};

std::string describe(const RouteCase& c, int T) {
  return str(scoring_name(c.scoring), " E=", c.E, " k=", c.top_k, " groups=", c.n_group, "/",
             c.topk_group, " bias=", c.bias, " norm=", c.norm, " T=", T);
}

const std::vector<int> kTokenCounts = {1, 3, 19, 99, 989, 4096};

}  // namespace

TEST(MoeOpsCuda, RouteMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const std::vector<RouteCase> cases = {
      {Scoring::Sigmoid, 8, 2, 2, 1, true, true, 1.0f},
      {Scoring::Softmax, 8, 2, 1, 1, false, true, 1.0f},
      {Scoring::Sigmoid, 128, 8, 1, 1, true, false, 2.5f},
      {Scoring::Softmax, 128, 8, 1, 1, false, true, 1.0f},  // Qwen3-MoE
      {Scoring::Sigmoid, 160, 8, 8, 3, true, true, 2.5f},
      {Scoring::Softmax, 160, 8, 1, 1, false, false, 1.0f},
      {Scoring::Sigmoid, 256, 8, 8, 4, true, true, 2.5f},  // DeepSeek-V3 / GLM-5
      {Scoring::Softmax, 256, 8, 8, 4, true, true, 1.0f},
      {Scoring::Sigmoid, 64, 4, 8, 2, true, true, 1.0f},     // groups narrower than a warp
      {Scoring::Softmax, 384, 8, 1, 1, false, true, 1.0f},   // > 256 experts: 32 per lane
      {Scoring::Sigmoid, 512, 8, 8, 4, true, true, 2.5f},
      {Scoring::Sigmoid, 1024, 32, 32, 8, true, false, 1.0f},  // the limits: E, top_k, groups
  };
  std::mt19937 rng(2025);
  for (const RouteCase& c : cases) {
    RouterParams p;
    p.scoring = c.scoring;
    p.num_experts = c.E;
    p.top_k = c.top_k;
    p.n_group = c.n_group;
    p.topk_group = c.topk_group;
    p.norm_topk_prob = c.norm;
    p.routed_scaling_factor = c.scale;
    std::uniform_real_distribution<float> ub(-0.1f, 0.1f);
    std::vector<float> bias(c.E);
    for (float& b : bias) b = ub(rng);
    bias[c.E - 1] = bias[0];  // a tie in the bias too
    for (int T : kTokenCounts) {
      SCOPED_TRACE(describe(c, T));
      const std::vector<float> logits = tricky_logits(T, c.E, rng);
      const size_t n = size_t(T) * c.top_k;
      std::vector<int32_t> ids_cpu(n);
      std::vector<float> w_cpu(n);
      route_cpu(logits.data(), c.bias ? bias.data() : nullptr, T, p, ids_cpu.data(), w_cpu.data());

      DevBuf<float> d_logits(logits.size()), d_bias(c.E), d_w(n);
      DevBuf<int32_t> d_ids(n);
      d_logits.upload(logits);
      d_bias.upload(bias);
      ASSERT_EQ(cuda::route(d_logits.get(), c.bias ? d_bias.get() : nullptr, T, p, d_ids.get(),
                            d_w.get(), nullptr),
                cudaSuccess);
      device_sync();
      const std::vector<int32_t> ids_gpu = d_ids.download();
      const std::vector<float> w_gpu = d_w.download();
      EXPECT_TRUE(d_ids.guards_intact());
      EXPECT_TRUE(d_w.guards_intact());
      size_t bit_exact = 0;
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(ids_gpu[i], ids_cpu[i]) << "token " << i / c.top_k << " slot " << i % c.top_k;
        if (std::isnan(w_cpu[i])) {
          EXPECT_TRUE(std::isnan(w_gpu[i])) << "token " << i / c.top_k;
          ++bit_exact;
          continue;
        }
        ASSERT_NEAR(w_gpu[i], w_cpu[i], 1e-6) << "token " << i / c.top_k << " slot " << i % c.top_k;
        bit_exact += float_to_bits(w_gpu[i]) == float_to_bits(w_cpu[i]);
      }
      EXPECT_EQ(bit_exact, n) << "weights are designed to be bit-identical";
    }
  }
}

TEST(MoeOpsCuda, RouterLogitsAreBitIdenticalToCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(31);
  std::normal_distribution<float> nd;
  for (int H : {7168, 2048, 100}) {
    for (int E : {256, 160}) {
      for (int T : {1, 19, 99}) {
        for (DType xt : {DType::BF16, DType::F32}) {
          SCOPED_TRACE(str("H=", H, " E=", E, " T=", T, " x=", dtype_name(xt)));
          std::vector<uint16_t> w(size_t(E) * H), xb(size_t(T) * H);
          std::vector<float> xf(size_t(T) * H);
          for (uint16_t& v : w) v = float_to_bf16(0.02f * nd(rng));
          for (size_t i = 0; i < xf.size(); ++i) {
            xf[i] = nd(rng);
            xb[i] = float_to_bf16(xf[i]);
          }
          std::vector<float> want(size_t(T) * E);
          if (xt == DType::BF16) {
            router_logits_cpu(xb.data(), w.data(), T, H, E, want.data());
          } else {
            router_logits_cpu(xf.data(), w.data(), T, H, E, want.data());
          }
          DevBuf<uint16_t> d_w(w.size()), d_xb(xb.size());
          DevBuf<float> d_xf(xf.size()), d_out(want.size());
          d_w.upload(w);
          d_xb.upload(xb);
          d_xf.upload(xf);
          const void* x = xt == DType::BF16 ? static_cast<const void*>(d_xb.get()) : d_xf.get();
          ASSERT_EQ(cuda::router_logits(x, xt, d_w.get(), T, H, E, d_out.get(), nullptr),
                    cudaSuccess);
          device_sync();
          EXPECT_TRUE(bytes_equal(d_out.download(), want));
          EXPECT_TRUE(d_out.guards_intact());
        }
      }
    }
  }
}

namespace {

std::vector<int32_t> random_ids(int T, int K, int E, std::mt19937& rng, bool skewed) {
  std::vector<int32_t> ids(size_t(T) * K), perm(E);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) perm[e] = e;
    for (int j = 0; j < K; ++j) {
      const double r = skewed ? std::pow(u(rng), 4.0) : u(rng);
      const int pick = j + std::min(E - j - 1, int(r * (E - j)));
      std::swap(perm[j], perm[pick]);
      ids[size_t(t) * K + j] = perm[j];
    }
  }
  return ids;
}

std::vector<int32_t> ranges_as_ints(const std::vector<RowRange>& r) {
  std::vector<int32_t> v;
  for (const RowRange& x : r) {
    v.push_back(x.start);
    v.push_back(x.count);
  }
  return v;
}

struct DevLayouts {
  DevBuf<int32_t> ids, offsets, slot_token, slot_of_c, masked_m, row_token, slot_of_m, dropped_c,
      dropped_m;
  DevBuf<RowRange> rows_c, rows_m;
  DevBuf<char> workspace;
  DevLayouts(int T, int K, int E, int max_m)
      : ids(size_t(T) * K), offsets(E + 1), slot_token(size_t(T) * K), slot_of_c(size_t(T) * K),
        masked_m(E), row_token(size_t(E) * max_m), slot_of_m(size_t(T) * K), dropped_c(1),
        dropped_m(1), rows_c(E), rows_m(E),
        workspace(std::max<size_t>(1, cuda::layout_workspace_bytes(T, K, E))) {}
  cuda::ContiguousLayoutView contiguous() {
    return {offsets.get(), slot_token.get(), slot_of_c.get(), rows_c.get(), dropped_c.get()};
  }
  cuda::MaskedLayoutView masked(int max_m) {
    return {max_m, masked_m.get(), row_token.get(), slot_of_m.get(), rows_m.get(),
            dropped_m.get()};
  }
};

}  // namespace

TEST(MoeOpsCuda, LayoutsAreIdenticalToCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(77);
  std::vector<int> token_counts = kTokenCounts;
  token_counts.push_back(2048);  // 16384 pairs: the largest one-block case
  token_counts.push_back(2049);  // first multi-block case
  for (int E : {8, 128, 160, 256}) {
    const int K = std::min(8, E / 2);
    for (int T : token_counts) {
      for (bool skewed : {false, true}) {
        SCOPED_TRACE(str("E=", E, " K=", K, " T=", T, " skewed=", skewed));
        const std::vector<int32_t> ids = random_ids(T, K, E, rng, skewed);
        const ContiguousLayout c = build_contiguous_cpu(ids.data(), T, K, E);
        int max_m = 1;
        for (int e = 0; e < E; ++e)
          max_m = std::max(max_m, c.expert_offsets[e + 1] - c.expert_offsets[e] + 1);
        const MaskedLayout m = build_masked_cpu(ids.data(), T, K, E, max_m);

        DevLayouts d(T, K, E, max_m);
        d.ids.upload(ids);
        const size_t ws = cuda::layout_workspace_bytes(T, K, E);
        ASSERT_EQ(cuda::build_contiguous(d.ids.get(), T, K, E, d.workspace.get(), ws,
                                         d.contiguous(), nullptr),
                  cudaSuccess);
        ASSERT_EQ(cuda::build_masked(d.ids.get(), T, K, E, d.workspace.get(), ws, d.masked(max_m),
                                     nullptr),
                  cudaSuccess);
        device_sync();
        EXPECT_EQ(d.offsets.download(), c.expert_offsets);
        EXPECT_EQ(d.slot_token.download(), c.slot_token);
        EXPECT_EQ(d.slot_of_c.download(), c.slot_of);
        EXPECT_EQ(ranges_as_ints(d.rows_c.download()), ranges_as_ints(c.expert_rows()));
        EXPECT_EQ(d.dropped_c.download()[0], 0);
        EXPECT_EQ(d.masked_m.download(), m.masked_m);
        EXPECT_EQ(d.row_token.download(), m.row_token);
        EXPECT_EQ(d.slot_of_m.download(), m.slot_of);
        EXPECT_EQ(ranges_as_ints(d.rows_m.download()), ranges_as_ints(m.expert_rows()));
        EXPECT_EQ(d.dropped_m.download()[0], 0);
        for (auto* b : {&d.offsets, &d.slot_token, &d.slot_of_c, &d.masked_m, &d.row_token,
                        &d.slot_of_m})
          EXPECT_TRUE(b->guards_intact());
        EXPECT_TRUE(d.rows_c.guards_intact());
        EXPECT_TRUE(d.rows_m.guards_intact());
      }
    }
  }
}

TEST(MoeOpsCuda, MaskedOverflowAndBadIdsAreDroppedAndCounted) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  for (int T : {99, 4096}) {
    const int K = 8, E = 64;
    SCOPED_TRACE(str("T=", T));
    const std::vector<int32_t> ids = random_ids(T, K, E, rng, true);
    // Expected: the layout with room for everything, minus each expert's rows past max_m.
    const MaskedLayout full = build_masked_cpu(ids.data(), T, K, E, T);
    const int max_m = std::max(1, *std::max_element(full.masked_m.begin(), full.masked_m.end()) / 2);
    std::vector<int32_t> want_slot(ids.size()), want_rows(size_t(E) * max_m, -1), want_m(E);
    int32_t want_dropped = 0;
    for (size_t p = 0; p < ids.size(); ++p) {
      const int e = ids[p], r = full.slot_of[p] - e * T;
      want_slot[p] = r < max_m ? e * max_m + r : -1;
      if (r < max_m) want_rows[size_t(e) * max_m + r] = int32_t(p / K);
      want_dropped += r >= max_m;
    }
    for (int e = 0; e < E; ++e) want_m[e] = std::min(full.masked_m[e], max_m);
    ASSERT_GT(want_dropped, 0);

    DevLayouts d(T, K, E, max_m);
    d.ids.upload(ids);
    const size_t ws = cuda::layout_workspace_bytes(T, K, E);
    ASSERT_EQ(cuda::build_masked(d.ids.get(), T, K, E, d.workspace.get(), ws, d.masked(max_m),
                                 nullptr),
              cudaSuccess);
    device_sync();
    EXPECT_EQ(d.slot_of_m.download(), want_slot);
    EXPECT_EQ(d.row_token.download(), want_rows);
    EXPECT_EQ(d.masked_m.download(), want_m);
    EXPECT_EQ(d.dropped_m.download()[0], want_dropped);
    EXPECT_TRUE(d.row_token.guards_intact());

    // Ids outside [0, E) are dropped by the contiguous builder, never written out of bounds.
    std::vector<int32_t> bad = ids;
    bad[0] = -1;
    bad[ids.size() / 2] = E;
    bad[ids.size() - 1] = 1 << 30;
    d.ids.upload(bad);
    ASSERT_EQ(cuda::build_contiguous(d.ids.get(), T, K, E, d.workspace.get(), ws, d.contiguous(),
                                     nullptr),
              cudaSuccess);
    device_sync();
    const std::vector<int32_t> slot = d.slot_of_c.download();
    EXPECT_EQ(slot[0], -1);
    EXPECT_EQ(slot[ids.size() / 2], -1);
    EXPECT_EQ(slot[ids.size() - 1], -1);
    EXPECT_EQ(d.dropped_c.download()[0], 3);
    EXPECT_EQ(d.offsets.download()[E], int32_t(ids.size()) - 3);
    EXPECT_TRUE(d.slot_token.guards_intact());
    EXPECT_TRUE(d.slot_of_c.guards_intact());
  }
}

TEST(MoeOpsCuda, PermuteIsExact) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  std::normal_distribution<float> nd;
  for (int H : {7168, 2048, 100}) {
    for (int T : {1, 19, 99, 989}) {
      for (size_t shift : {size_t(0), size_t(1)}) {  // 1: misaligned rows, scalar path
        const int K = 8, E = 64;
        SCOPED_TRACE(str("H=", H, " T=", T, " shift=", shift));
        const std::vector<int32_t> ids = random_ids(T, K, E, rng, T > 99);
        const ContiguousLayout c = build_contiguous_cpu(ids.data(), T, K, E);
        int max_m = 1;  // room for the busiest expert plus one empty row
        for (int e = 0; e < E; ++e)
          max_m = std::max(max_m, c.expert_offsets[e + 1] - c.expert_offsets[e] + 1);
        const MaskedLayout m = build_masked_cpu(ids.data(), T, K, E, max_m);
        std::vector<uint16_t> x(size_t(T) * H);
        for (uint16_t& v : x) v = float_to_bf16(nd(rng));
        DevBuf<uint16_t> d_x(x.size());
        d_x.upload(x);
        for (bool masked : {false, true}) {
          const std::vector<int32_t>& slot_of = masked ? m.slot_of : c.slot_of;
          const size_t rows = size_t(masked ? m.num_rows() : c.num_rows());
          std::vector<uint16_t> want = poisoned<uint16_t>(rows * H);
          permute_rows_cpu(x.data(), T, H, K, slot_of.data(), want.data());
          DevBuf<int32_t> d_slot(slot_of.size());
          d_slot.upload(slot_of);
          DevBuf<uint16_t> d_rows(rows * H, shift);
          ASSERT_EQ(cuda::permute_bf16(d_x.get(), T, H, K, d_slot.get(), d_rows.get(), nullptr),
                    cudaSuccess);
          device_sync();
          EXPECT_TRUE(bytes_equal(d_rows.download(), want)) << (masked ? "masked" : "contiguous");
          EXPECT_TRUE(d_rows.guards_intact());
        }
      }
    }
  }
}

TEST(MoeOpsCuda, CombineIsExact) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> uw(0.0f, 1.0f);
  for (int H : {7168, 100}) {
    for (int T : {1, 19, 99, 989}) {
      if (H == 7168 && T == 989) continue;  // the CPU twin would dominate the test's time
      const int K = 8, E = 64;
      const std::vector<int32_t> ids = random_ids(T, K, E, rng, false);
      MaskedLayout m = build_masked_cpu(ids.data(), T, K, E, T);
      m.slot_of[0] = -1;  // a dropped pair contributes nothing
      const size_t rows = size_t(m.num_rows());
      std::vector<float> rows_f(rows * H);
      std::vector<uint16_t> rows_b(rows * H), shared(size_t(T) * H), resid(size_t(T) * H);
      for (size_t i = 0; i < rows_f.size(); ++i) {
        rows_f[i] = nd(rng);
        rows_b[i] = float_to_bf16(rows_f[i]);
      }
      for (uint16_t& v : shared) v = float_to_bf16(nd(rng));
      for (uint16_t& v : resid) v = float_to_bf16(4.0f * nd(rng));
      std::vector<float> w(ids.size());
      for (float& v : w) v = 2.5f * uw(rng);
      DevBuf<float> d_rows_f(rows_f.size()), d_w(w.size());
      DevBuf<uint16_t> d_rows_b(rows_b.size()), d_shared(shared.size()), d_resid(resid.size());
      DevBuf<int32_t> d_slot(m.slot_of.size());
      d_rows_f.upload(rows_f);
      d_rows_b.upload(rows_b);
      d_shared.upload(shared);
      d_resid.upload(resid);
      d_w.upload(w);
      d_slot.upload(m.slot_of);
      for (DType rt : {DType::BF16, DType::F32}) {
        for (int variant = 0; variant < 3; ++variant) {
          for (size_t shift : {size_t(0), size_t(1)}) {
            if (shift == 1 && variant != 1) continue;  // misaligned output: scalar path once
            SCOPED_TRACE(str("H=", H, " T=", T, " rows=", dtype_name(rt), " variant=", variant,
                             " shift=", shift));
            const bool extras = variant >= 1;
            const bool weighted = variant != 2;
            const void* rows_host = rt == DType::BF16 ? static_cast<const void*>(rows_b.data())
                                                      : rows_f.data();
            std::vector<uint16_t> want(size_t(T) * H);
            combine_bf16_cpu(rows_host, rt, T, H, K, m.slot_of.data(), weighted ? w.data() : nullptr,
                             extras ? shared.data() : nullptr, extras ? resid.data() : nullptr,
                             want.data());
            const void* rows_dev = rt == DType::BF16 ? static_cast<const void*>(d_rows_b.get())
                                                     : d_rows_f.get();
            DevBuf<uint16_t> d_out(size_t(T) * H, shift);
            ASSERT_EQ(cuda::combine_bf16(rows_dev, rt, T, H, K, d_slot.get(),
                                         weighted ? d_w.get() : nullptr,
                                         extras ? d_shared.get() : nullptr,
                                         extras ? d_resid.get() : nullptr, d_out.get(), nullptr),
                      cudaSuccess);
            device_sync();
            EXPECT_TRUE(bytes_equal(d_out.download(), want));
            EXPECT_TRUE(d_out.guards_intact());
          }
        }
      }
    }
  }
}

// A combine + norm case on the host and the device: T tokens of top-8 pairs over 64 experts
// (pair 0 dropped), F32 expert rows with the shared expert's output past the routed ones, the
// residual, the norm weight, and the CPU combine's output and new residual.
struct NormCombineCase {
  static constexpr int K = 8, E = 64;
  int T, H, shared_first = 0;
  MaskedLayout m;
  std::vector<float> rows_f, w;
  std::vector<uint16_t> resid, gain, want_out, want_res;
  DevBuf<float> d_rows, d_w;
  DevBuf<int32_t> d_slot, d_first{1};
  DevBuf<uint16_t> d_gain;

  NormCombineCase(int T_, int H_, std::mt19937& rng)
      : T(T_), H(H_), m(make_layout(T_, rng)), rows_f((size_t(m.num_rows()) + T_) * H_),
        w(size_t(T_) * K), resid(size_t(T_) * H_), gain(H_), d_rows(rows_f.size()),
        d_w(w.size()), d_slot(m.slot_of.size()), d_gain(gain.size()) {
    std::normal_distribution<float> nd;
    std::uniform_real_distribution<float> uw(0.0f, 1.0f);
    shared_first = m.num_rows();
    for (float& v : rows_f) v = nd(rng);
    for (uint16_t& v : resid) v = float_to_bf16(8.0f * nd(rng));
    for (uint16_t& v : gain) v = float_to_bf16(1.0f + 0.5f * nd(rng));
    for (float& v : w) v = 2.5f * uw(rng);
    std::vector<uint16_t> shared_b(size_t(T) * H);  // the bf16 rounding of shared_first_row
    for (size_t i = 0; i < shared_b.size(); ++i)
      shared_b[i] = float_to_bf16(rows_f[(size_t(shared_first) * H) + i]);
    want_out.resize(size_t(T) * H);
    combine_bf16_cpu(rows_f.data(), DType::F32, T, H, K, m.slot_of.data(), w.data(),
                     shared_b.data(), nullptr, want_out.data());
    want_res = resid;  // the add of fused_add_rms_norm_cpu
    for (size_t i = 0; i < want_res.size(); ++i)
      want_res[i] = float_to_bf16(bf16_to_float(want_out[i]) + bf16_to_float(want_res[i]));
    d_rows.upload(rows_f);
    d_w.upload(w);
    d_slot.upload(m.slot_of);
    d_first.upload({shared_first});
    d_gain.upload(gain);
  }
  static MaskedLayout make_layout(int T, std::mt19937& rng) {
    const std::vector<int32_t> ids = random_ids(T, K, E, rng, false);
    MaskedLayout layout = build_masked_cpu(ids.data(), T, K, E, T);
    layout.slot_of[0] = -1;  // a dropped pair contributes nothing
    return layout;
  }
  cudaError_t run(uint16_t* out, const AddRmsNormStep& step, bool pdl) {
    cuda::CombineOptions co;
    co.shared_first_row = d_first.get();
    co.pdl = pdl;
    co.routing_ready = pdl;
    co.add_norm = &step;
    return cuda::combine_bf16(d_rows.get(), DType::F32, T, H, K, d_slot.get(), d_w.get(), nullptr,
                              nullptr, out, nullptr, co);
  }
};

// The combine with the decoder's add + RMSNorm fused (CombineOptions::add_norm) against its CPU
// twin, combine_bf16_cpu then fused_add_rms_norm_cpu: out and the residual bit-identical, normed
// within one bf16 step (the cluster sums the squares in another order than the CPU, so the
// rsqrt may differ in its last bits), at hidden sizes of one to eight blocks per row, T from 1.
TEST(MoeOpsCuda, CombineWithAddRmsNormMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(21);
  const float eps = 1e-5f;
  for (int H : {4096, 6144, 2052, 100}) {
    for (int T : {1, 3, 19, 70}) {
      NormCombineCase c(T, H, rng);
      // CPU: the combine, then the decoder's add + RMSNorm.
      std::vector<uint16_t> want_res = c.resid, want_norm(size_t(T) * H);
      ops::fused_add_rms_norm_cpu(c.want_out.data(), want_res.data(), c.gain.data(), T, H, eps,
                                  want_norm.data());
      for (bool pdl : {false, true}) {
        SCOPED_TRACE(str("H=", H, " T=", T, " pdl=", pdl));
        DevBuf<uint16_t> d_out(size_t(T) * H), d_res(c.resid.size()), d_norm(size_t(T) * H);
        d_res.upload(c.resid);
        ASSERT_EQ(c.run(d_out.get(), {d_res.get(), c.d_gain.get(), eps, d_norm.get()}, pdl),
                  cudaSuccess);
        device_sync();
        EXPECT_TRUE(bytes_equal(d_out.download(), c.want_out));
        EXPECT_TRUE(bytes_equal(d_res.download(), want_res));
        const std::vector<uint16_t> got = d_norm.download();
        size_t differ = 0, over_one_step = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          if (got[i] == want_norm[i]) continue;
          ++differ;
          const float a = bf16_to_float(got[i]), b = bf16_to_float(want_norm[i]);
          if (std::fabs(a - b) > std::ldexp(std::fabs(b), -7)) ++over_one_step;
        }
        EXPECT_EQ(over_one_step, 0u);
        EXPECT_LE(differ, got.size() / 50) << "normed differs in " << differ << " elements";
        EXPECT_TRUE(d_out.guards_intact());
        EXPECT_TRUE(d_res.guards_intact());
        EXPECT_TRUE(d_norm.guards_intact());
      }
    }
  }
  EXPECT_FALSE(cuda::combine_add_rms_norm_fits(4098, DType::F32));  // not whole 16-byte loads
  EXPECT_FALSE(cuda::combine_add_rms_norm_fits(4096, DType::BF16));
  EXPECT_FALSE(cuda::combine_add_rms_norm_fits(32772, DType::F32));
}

// The combine with the add + RMSNorm folded into the next linear (AddRmsNormStep::fold): out and
// the residual bit-identical to the CPU twin, gx = bf16(residual * g) bit-identical (one f32
// product, rounded once), each block's sum of squares within f32 summation error of the double
// sum over its 256 elements, and the reader's inv_rms (norm_fold_inv_rms) within 1e-6 of the
// double reference. H from one part to 32 (the last part partial at 2052); a
// mismatched part count is refused.
TEST(MoeOpsCuda, CombineWithFoldedNormMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(22);
  const float eps = 1e-5f;
  for (int H : {4096, 2052, 100, 8192, 5120}) {
    const int parts = cuda::combine_norm_fold_parts(H);
    ASSERT_EQ(parts, (H + 255) / 256) << H;
    for (int T : {1, 3, 8, 19}) {
      SCOPED_TRACE(str("H=", H, " T=", T));
      NormCombineCase c(T, H, rng);
      DevBuf<uint16_t> d_out(size_t(T) * H), d_res(c.resid.size()), d_gx(size_t(T) * H);
      DevBuf<float> d_sums(size_t(T) * parts);
      d_res.upload(c.resid);
      const NormFold fold{d_sums.get(), parts, H, eps};
      ASSERT_EQ(c.run(d_out.get(), {d_res.get(), c.d_gain.get(), eps, d_gx.get(), &fold}, true),
                cudaSuccess);
      device_sync();
      EXPECT_TRUE(bytes_equal(d_out.download(), c.want_out));
      EXPECT_TRUE(bytes_equal(d_res.download(), c.want_res));
      std::vector<uint16_t> want_gx(c.want_res.size());
      for (size_t i = 0; i < want_gx.size(); ++i)
        want_gx[i] = float_to_bf16(bf16_to_float(c.want_res[i]) * bf16_to_float(c.gain[i % H]));
      EXPECT_TRUE(bytes_equal(d_gx.download(), want_gx));
      const std::vector<float> sums = d_sums.download();
      for (int t = 0; t < T; ++t) {
        double row = 0;
        for (int p = 0; p < parts; ++p) {
          double part = 0;
          for (int h = p * 256; h < std::min(H, (p + 1) * 256); ++h) {
            const double v = bf16_to_float(c.want_res[size_t(t) * H + h]);
            part += v * v;
          }
          row += part;
          EXPECT_NEAR(sums[size_t(t) * parts + p], part, 1e-5 * part) << "t=" << t << " p=" << p;
        }
        const double inv = 1.0 / std::sqrt(row / H + eps);
        EXPECT_NEAR(norm_fold_inv_rms(&sums[size_t(t) * parts], parts, H, eps), inv, 1e-6 * inv)
            << "t=" << t;
      }
      EXPECT_TRUE(d_out.guards_intact() && d_res.guards_intact() && d_gx.guards_intact() &&
                  d_sums.guards_intact());
      const NormFold wrong{d_sums.get(), parts + 1, H, eps};
      EXPECT_THROW(c.run(d_out.get(), {d_res.get(), c.d_gain.get(), eps, d_gx.get(), &wrong}, true),
                   Error);
    }
  }
  EXPECT_EQ(cuda::combine_norm_fold_parts(8196), 0);  // 33 parts
  EXPECT_EQ(cuda::combine_norm_fold_parts(4098), 0);  // not whole 16-byte loads
}

TEST(MoeOpsCuda, GraphCapturedTokenPathReplaysCorrectly) {
  // route -> masked layout -> permute -> combine captured once (static shapes), replayed with
  // new logits: each replay must equal the CPU path on that replay's data.
  SKIP_WITHOUT_GPU();
  const int T = 64, H = 256, E = 256, K = 8, max_m = T;
  RouterParams p;
  p.num_experts = E;
  p.top_k = K;
  p.n_group = 8;
  p.topk_group = 4;
  p.routed_scaling_factor = 2.5f;
  std::mt19937 rng(10);
  std::normal_distribution<float> nd;
  std::vector<uint16_t> x(size_t(T) * H);
  for (uint16_t& v : x) v = float_to_bf16(nd(rng));
  DevBuf<float> d_logits(size_t(T) * E), d_w(size_t(T) * K);
  DevBuf<int32_t> d_ids(size_t(T) * K), d_masked_m(E), d_row_token(size_t(E) * max_m),
      d_slot(size_t(T) * K), d_dropped(1);
  DevBuf<uint16_t> d_x(x.size()), d_rows(size_t(E) * max_m * H), d_out(x.size());
  d_x.upload(x);
  TETRA_CHECK_EQ(cuda::layout_workspace_bytes(T, K, E), size_t(0));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const cuda::MaskedLayoutView view{max_m, d_masked_m.get(), d_row_token.get(), d_slot.get(),
                                    nullptr, d_dropped.get()};
  ASSERT_EQ(cuda::route(d_logits.get(), nullptr, T, p, d_ids.get(), d_w.get(), stream), cudaSuccess);
  ASSERT_EQ(cuda::build_masked(d_ids.get(), T, K, E, nullptr, 0, view, stream), cudaSuccess);
  ASSERT_EQ(cuda::permute_bf16(d_x.get(), T, H, K, d_slot.get(), d_rows.get(), stream), cudaSuccess);
  // The expert GEMMs would run here; combining the permuted inputs checks the round trip.
  ASSERT_EQ(cuda::combine_bf16(d_rows.get(), DType::BF16, T, H, K, d_slot.get(), d_w.get(),
                               nullptr, nullptr, d_out.get(), stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 3; ++replay) {
    std::vector<float> logits(size_t(T) * E);
    for (float& v : logits) v = nd(rng);
    d_logits.upload(logits);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<int32_t> ids(size_t(T) * K);
    std::vector<float> w(size_t(T) * K);
    route_cpu(logits.data(), nullptr, T, p, ids.data(), w.data());
    const MaskedLayout m = build_masked_cpu(ids.data(), T, K, E, max_m);
    std::vector<uint16_t> rows = poisoned<uint16_t>(size_t(E) * max_m * H);
    permute_rows_cpu(x.data(), T, H, K, m.slot_of.data(), rows.data());
    std::vector<uint16_t> want(x.size());
    combine_bf16_cpu(rows.data(), DType::BF16, T, H, K, m.slot_of.data(), w.data(), nullptr,
                     nullptr, want.data());
    EXPECT_EQ(d_ids.download(), ids) << "replay " << replay;
    EXPECT_EQ(d_slot.download(), m.slot_of) << "replay " << replay;
    EXPECT_TRUE(bytes_equal(d_out.download(), want)) << "replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The one-launch small-T token path (ops/moe/token_path.h) against the separate ops: logits and
// routing bit-identical to the CPU twins, and the layout + row bookkeeping equal to
// build_contiguous / build_masked + prepare_rows on the same ids (rows past each expert's count
// are not written by the one-launch path and not compared). Both layouts, an expert-parallel
// block, a hidden size off the vector path, repeated launches (the block counter must return to
// zero), the shared slot rows.
// Cases: GLM-5 (groups, H 6144: two experts per logits block), GLM-4.5-Air (H 4096), Qwen3
// (softmax), an expert-parallel block, > 256 experts, a hidden size off the vector path. Ties:
// `dup` copies every third gate row (and bias) to the next expert, so their logits and keys tie
// exactly; `hot` scales some gate rows so that their sigmoid saturates to 1.0f. T = 1..16 take
// the tiny kernel (token_path_tiny.h), T = 100 with top-8 the general one. At few tokens the tiny
// kernel computes sigmoid scores, keys and group keys block-wide before routing (every sigmoid
// case at T < 16). The tiny kernel also gets L2 warm-up hints (SmallTokenPath::warm), which must
// not change a bit.
TEST(MoeOpsCuda, SmallTokenPathEqualsTheSeparateOps) {
  SKIP_WITHOUT_GPU();
  struct Case {
    RouteCase r;
    int H, begin, count;
    bool dup = false, hot = false;
  };
  const std::vector<Case> cases = {
      {{Scoring::Sigmoid, 256, 8, 8, 4, true, true, 2.5f}, 512, 0, 256},
      {{Scoring::Sigmoid, 256, 8, 8, 4, true, true, 2.5f}, 6144, 0, 256, true},  // GLM-5
      {{Scoring::Sigmoid, 128, 8, 1, 1, true, true, 1.0f}, 4096, 0, 128, true},  // GLM-4.5-Air
      {{Scoring::Sigmoid, 128, 8, 1, 1, false, true, 1.0f}, 1024, 0, 128, false, true},
      {{Scoring::Softmax, 128, 8, 1, 1, false, true, 1.0f}, 2048, 0, 128, true},  // Qwen3
      {{Scoring::Softmax, 128, 8, 1, 1, false, false, 1.0f}, 100, 0, 128},
      {{Scoring::Sigmoid, 64, 4, 1, 1, true, true, 1.0f}, 256, 16, 24},
      {{Scoring::Sigmoid, 256, 8, 8, 4, true, true, 2.5f}, 512, 64, 64, true},  // EP rank 1 of 4
      {{Scoring::Sigmoid, 512, 8, 8, 4, true, true, 1.0f}, 256, 0, 512, true},
      {{Scoring::Softmax, 384, 8, 1, 1, false, true, 1.0f}, 128, 128, 256, false, true},
      // Groups narrower than a warp (12 experts) and an odd group count (5 of 32).
      {{Scoring::Sigmoid, 96, 6, 8, 3, true, true, 1.0f}, 256, 0, 96, true},
      {{Scoring::Sigmoid, 160, 8, 5, 2, true, true, 2.5f}, 512, 0, 160, false, true},
  };
  std::mt19937 rng(77);
  for (const Case& c : cases) {
    RouterParams p;
    p.scoring = c.r.scoring;
    p.num_experts = c.r.E;
    p.top_k = c.r.top_k;
    p.n_group = c.r.n_group;
    p.topk_group = c.r.topk_group;
    p.norm_topk_prob = c.r.norm;
    p.routed_scaling_factor = c.r.scale;
    const int E = c.r.E, K = c.r.top_k, H = c.H, El = c.count;
    cuda::small_token_path_setup(E, El);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> gate(size_t(E) * H);  // [E, H]
    for (auto& g : gate) g = float_to_bf16(nd(rng) / std::sqrt(float(H)));
    std::vector<float> bias(static_cast<size_t>(E));  // [E]
    for (auto& b : bias) b = 0.05f * nd(rng);
    for (int e = 0; e + 1 < E; e += 3) {
      if (c.dup) {
        std::copy_n(gate.begin() + size_t(e) * H, H, gate.begin() + size_t(e + 1) * H);
        bias[size_t(e) + 1] = bias[size_t(e)];
      }
      if (c.hot && e % 2 == 0)
        for (int k = 0; k < H; ++k)
          gate[size_t(e) * H + k] = float_to_bf16(60.0f * bf16_to_float(gate[size_t(e) * H + k]));
    }
    DevBuf<uint16_t> d_gate(gate.size());
    DevBuf<float> d_bias(bias.size());
    d_gate.upload(gate);
    d_bias.upload(bias);
    // Layouts: contiguous, masked, masked with max_m = 2 (pairs over it are dropped and counted).
    for (const int layout : {0, 1, 2}) {
      const bool masked = layout > 0;
      for (const int T : {1, 3, 5, 16, 64, 100}) {
        if (layout == 2 && (T < 3 || c.r.n_group > 1 || c.count < c.r.E)) continue;
        if (T == 64 && H > 2048) continue;  // the CPU twin of the logits would dominate
        SCOPED_TRACE(describe(c.r, T) + str(" H=", H, " block ", c.begin, "+", El,
                                            masked ? " masked" : " contiguous", layout == 2 ? " max_m=2" : "", c.dup ? " dup" : "",
                                            c.hot ? " hot" : ""));
        std::vector<uint16_t> x(size_t(T) * H);  // [T, H]
        for (auto& v : x) v = float_to_bf16(nd(rng));
        std::vector<float> logits(size_t(T) * E);
        router_logits_cpu(x.data(), gate.data(), T, H, E, logits.data());
        std::vector<int32_t> ids(size_t(T) * K);
        std::vector<float> w(ids.size());
        route_cpu(logits.data(), c.r.bias ? bias.data() : nullptr, T, p, ids.data(), w.data());

        const int max_m = layout == 2 ? 2 : T;
        const size_t rows = masked ? size_t(El) * max_m + T : size_t(T) * K + T;
        // Two sets of outputs: [0] one launch, [1] separate ops.
        struct Out {
          DevBuf<float> logits, weights;
          DevBuf<int32_t> ids, offsets, masked_m, row_token, slot_of, dropped, row_count, slots;
          Out(size_t TE, size_t TK, size_t El1, size_t rows)
              : logits(TE), weights(TK), ids(TK), offsets(El1), masked_m(El1), row_token(rows),
                slot_of(TK), dropped(1), row_count(El1), slots(El1) {}
        };
        Out o1(logits.size(), ids.size(), size_t(El) + 1, rows);
        Out o2(logits.size(), ids.size(), size_t(El) + 1, rows);
        DevBuf<uint16_t> d_x(x.size());
        DevBuf<uint32_t> counter(1);
        DevBuf<char> workspace(std::max<size_t>(cuda::layout_workspace_bytes(T, K, El), 1));
        d_x.upload(x);
        TETRA_CUDA_CHECK(cudaMemset(counter.get(), 0, 4));
        auto prep_of = [&](Out& o) {
          cuda::RowsPrep r;
          r.E = El;
          r.num_slots = std::min(El, T * K);
          r.max_m = masked ? max_m : 0;
          r.offsets = o.offsets.get();
          r.masked_m = o.masked_m.get();
          r.row_count = o.row_count.get();
          r.slots = o.slots.get();
          r.row_token = o.row_token.get();
          r.shared_slot = true;
          return r;
        };
        cuda::SmallTokenPath a;
        a.x = d_x.get();
        a.gate = d_gate.get();
        a.bias = c.r.bias ? d_bias.get() : nullptr;
        a.H = H;
        a.router = p;
        a.logits = o1.logits.get();
        a.ids = o1.ids.get();
        a.weights = o1.weights.get();
        a.expert_begin = c.begin;
        a.offsets = o1.offsets.get();
        a.masked_m = o1.masked_m.get();
        a.row_token = o1.row_token.get();
        a.slot_of = o1.slot_of.get();
        a.dropped = o1.dropped.get();
        a.rows = prep_of(o1);
        a.counter = counter.get();
        // L2 warm-up hints (the layer passes its shared expert's weights) over ranges that start
        // and end off the 16-byte granule, one left empty: they must change nothing.
        a.warm[0] = reinterpret_cast<const uint8_t*>(d_gate.get()) + 3;
        a.warm_bytes[0] = size_t(E) * H * 2 - 5;
        a.warm[2] = d_x.get();
        a.warm_bytes[2] = size_t(T) * H * 2;
        // Which kernel runs: the tiny one whenever the pairs fit one thread each and H the
        // vector loads (so both kernels are exercised by these cases).
        EXPECT_EQ(cuda::detail::tiny_token_path_fits(a, T),
                  T * K <= cuda::detail::kTinyThreads && H % 8 == 0);
        for (int rep = 0; rep < 3; ++rep)
          ASSERT_EQ(cuda::small_token_path(a, T, nullptr), cudaSuccess);
        // The separate ops.
        ASSERT_EQ(cuda::router_logits(d_x.get(), DType::BF16, d_gate.get(), T, H, E,
                                      o2.logits.get(), nullptr),
                  cudaSuccess);
        ASSERT_EQ(cuda::route(o2.logits.get(), c.r.bias ? d_bias.get() : nullptr, T, p,
                              o2.ids.get(), o2.weights.get(), nullptr),
                  cudaSuccess);
        const cuda::ExpertBlock block{c.begin, E};
        if (masked) {
          cuda::MaskedLayoutView v;
          v.max_m = max_m;
          v.masked_m = o2.masked_m.get();
          v.row_token = o2.row_token.get();
          v.slot_of = o2.slot_of.get();
          v.dropped = o2.dropped.get();
          v.block = block;
          ASSERT_EQ(cuda::build_masked(o2.ids.get(), T, K, El, workspace.get(),
                                       cuda::layout_workspace_bytes(T, K, El), v, nullptr),
                    cudaSuccess);
        } else {
          cuda::ContiguousLayoutView v;
          v.expert_offsets = o2.offsets.get();
          v.slot_token = o2.row_token.get();
          v.slot_of = o2.slot_of.get();
          v.dropped = o2.dropped.get();
          v.block = block;
          ASSERT_EQ(cuda::build_contiguous(o2.ids.get(), T, K, El, workspace.get(),
                                           cuda::layout_workspace_bytes(T, K, El), v, nullptr),
                    cudaSuccess);
        }
        ASSERT_EQ(cuda::prepare_rows(prep_of(o2), T, nullptr), cudaSuccess);
        device_sync();

        EXPECT_TRUE(bytes_equal(o1.logits.download(), logits)) << "logits vs cpu";
        EXPECT_EQ(o1.ids.download(), ids);
        EXPECT_TRUE(bytes_equal(o1.weights.download(), w)) << "weights vs cpu";
        EXPECT_EQ(counter.download()[0], 0u);
        const int32_t dropped = o2.dropped.download()[0];
        EXPECT_EQ(o1.dropped.download()[0], dropped);
        if (layout != 2) EXPECT_EQ(dropped, 0);
        EXPECT_EQ(o1.slot_of.download(), o2.slot_of.download());
        EXPECT_EQ(o1.slots.download(), o2.slots.download());
        const std::vector<int32_t> tok1 = o1.row_token.download(), tok2 = o2.row_token.download();
        std::vector<int32_t> count(size_t(El) + 1), start(size_t(El) + 1);  // incl. shared slot
        if (masked) {
          const std::vector<int32_t> m1 = o1.masked_m.download(), m2 = o2.masked_m.download();
          EXPECT_EQ(m1, m2);
          EXPECT_EQ(m1[size_t(El)], T);
          for (int e = 0; e <= El; ++e) count[size_t(e)] = m2[size_t(e)], start[size_t(e)] = e * max_m;
        } else {
          const std::vector<int32_t> f1 = o1.offsets.download(), f2 = o2.offsets.download();
          const std::vector<int32_t> n1 = o1.row_count.download(), n2 = o2.row_count.download();
          EXPECT_EQ(f1, f2);
          EXPECT_EQ(n1, n2);
          EXPECT_EQ(n1[size_t(El)], T);
          for (int e = 0; e <= El; ++e) count[size_t(e)] = n2[size_t(e)], start[size_t(e)] = f2[size_t(e)];
        }
        int local_pairs = 0;
        for (int32_t id : ids) local_pairs += id >= c.begin && id < c.begin + El;
        int placed = 0;
        for (int e = 0; e < El; ++e) placed += count[size_t(e)];
        EXPECT_EQ(placed + dropped, local_pairs);
        for (int e = 0; e <= El; ++e)
          for (int r = start[size_t(e)]; r < start[size_t(e)] + count[size_t(e)]; ++r)
            ASSERT_EQ(tok1[size_t(r)], tok2[size_t(r)]) << "row " << r << " of expert " << e;
        for (int t = 0; t < T; ++t) EXPECT_EQ(tok1[size_t(start[size_t(El)] + t)], t);
      }
    }
  }
}

// The one-launch token path captured once in a CUDA graph and replayed with new tokens (the
// kernel leaves its block counter at zero, so every replay must route anew): logits, ids,
// weights and the contiguous layout equal the CPU twins on each replay's data.
TEST(MoeOpsCuda, SmallTokenPathReplaysInAGraph) {
  SKIP_WITHOUT_GPU();
  const int E = 256, K = 8, H = 1024;
  RouterParams p;
  p.num_experts = E;
  p.top_k = K;
  p.n_group = 8;
  p.topk_group = 4;
  p.routed_scaling_factor = 2.5f;
  cuda::small_token_path_setup(E, E);
  std::mt19937 rng(31);
  std::normal_distribution<float> nd;
  std::vector<uint16_t> gate(size_t(E) * H);  // [E, H]
  for (auto& g : gate) g = float_to_bf16(nd(rng) / 32.0f);
  std::vector<float> bias(size_t(E), 0.0f);  // [E]
  for (auto& b : bias) b = 0.05f * nd(rng);
  DevBuf<uint16_t> d_gate(gate.size());
  DevBuf<float> d_bias(bias.size());
  d_gate.upload(gate);
  d_bias.upload(bias);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (const int T : {1, 3, 16}) {
    SCOPED_TRACE(str("T=", T));
    DevBuf<uint16_t> d_x(size_t(T) * H);
    DevBuf<float> d_logits(size_t(T) * E), d_w(size_t(T) * K);
    DevBuf<int32_t> d_ids(size_t(T) * K), d_offsets(size_t(E) + 1), d_row_count(size_t(E) + 1),
        d_slots(size_t(E) + 1), d_row_token(size_t(T) * K), d_slot_of(size_t(T) * K), d_dropped(1);
    DevBuf<uint32_t> counter(1);
    TETRA_CUDA_CHECK(cudaMemset(counter.get(), 0, 4));
    cuda::SmallTokenPath a;
    a.x = d_x.get();
    a.gate = d_gate.get();
    a.bias = d_bias.get();
    a.H = H;
    a.router = p;
    a.logits = d_logits.get();
    a.ids = d_ids.get();
    a.weights = d_w.get();
    a.offsets = d_offsets.get();
    a.row_token = d_row_token.get();
    a.slot_of = d_slot_of.get();
    a.dropped = d_dropped.get();
    a.rows.E = E;
    a.rows.num_slots = std::min(E, T * K);
    a.rows.offsets = d_offsets.get();
    a.rows.row_count = d_row_count.get();
    a.rows.slots = d_slots.get();
    a.rows.row_token = d_row_token.get();
    a.counter = counter.get();
    a.pdl = T == 3;  // a programmatic dependent launch in the graph
    ASSERT_TRUE(cuda::detail::tiny_token_path_fits(a, T));
    cudaGraph_t graph;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    ASSERT_EQ(cuda::small_token_path(a, T, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int replay = 0; replay < 3; ++replay) {
      std::vector<uint16_t> x(size_t(T) * H);  // [T, H]
      for (auto& v : x) v = float_to_bf16(nd(rng));
      d_x.upload(x);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      std::vector<float> logits(size_t(T) * E), w(size_t(T) * K);
      std::vector<int32_t> ids(size_t(T) * K);
      router_logits_cpu(x.data(), gate.data(), T, H, E, logits.data());
      route_cpu(logits.data(), bias.data(), T, p, ids.data(), w.data());
      const ContiguousLayout want = build_contiguous_cpu(ids.data(), T, K, E);
      EXPECT_TRUE(bytes_equal(d_logits.download(), logits)) << "replay " << replay;
      EXPECT_EQ(d_ids.download(), ids) << "replay " << replay;
      EXPECT_TRUE(bytes_equal(d_w.download(), w)) << "replay " << replay;
      EXPECT_EQ(d_offsets.download(), want.expert_offsets) << "replay " << replay;
      EXPECT_EQ(d_slot_of.download(), want.slot_of) << "replay " << replay;
      EXPECT_EQ(d_row_token.download(), want.slot_token) << "replay " << replay;
      EXPECT_EQ(d_dropped.download()[0], 0);
      EXPECT_EQ(counter.download()[0], 0u);
    }
    EXPECT_TRUE(d_offsets.guards_intact());
    EXPECT_TRUE(d_slots.guards_intact());
    EXPECT_TRUE(d_row_token.guards_intact());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}
