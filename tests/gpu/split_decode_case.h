// A random paged-KV decode attention problem for the split decode attention tests: host data,
// the CPU reference (ops::paged_decode_attention_cpu), the same data on the device and one
// launch of split_decode_attention with a poisoned output and guarded buffers.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/half.h"
#include "guarded_device_array.h"
#include "model/cuda/split_decode_attention.h"
#include "model/cuda/split_decode_plan.h"
#include "ops/attention/attention.h"

namespace tetra::model::cuda::test {

inline std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float a) {
  std::uniform_real_distribution<float> u(-a, a);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}

// Host side of one problem. Block tables are a shuffle of the cache's blocks, one spare column
// per sequence and three spare blocks, so no sequence sits in order or at the cache's start.
struct HostCase {
  ops::AttentionShape sh;
  int block_size = 0, mb = 0, num_blocks = 0;
  std::vector<uint16_t> q;        // [S, sh.q_step()] bf16
  std::vector<uint16_t> kc, vc;   // [num_blocks, block_size, n_kv, D] bf16
  std::vector<int32_t> tables;    // [S, mb], unused entries -1
  std::vector<int32_t> lens;      // [S]

  int num_seqs() const { return int(lens.size()); }
  int64_t row_elems() const { return int64_t(sh.n_kv_heads) * sh.head_dim; }
  // Cache row (block * block_size + offset) of sequence s's position p.
  int64_t slot(int s, int p) const {
    return int64_t(tables[size_t(s) * mb + size_t(p / block_size)]) * block_size + p % block_size;
  }
  ops::PagedKv host_kv() const {
    ops::PagedKv kv;
    kv.k_cache = kc.data();
    kv.v_cache = vc.data();
    kv.block_tables = tables.data();
    kv.seq_lens = lens.data();
    kv.num_blocks = num_blocks;
    kv.block_size = block_size;
    kv.max_blocks_per_seq = mb;
    return kv;
  }
  std::vector<uint16_t> cpu_reference() const {
    std::vector<uint16_t> want(size_t(num_seqs()) * sh.n_heads * sh.head_dim);
    ops::paged_decode_attention_cpu(q.data(), host_kv(), num_seqs(), sh, want.data());
    return want;
  }
  std::string label() const {
    std::string l = "D=" + std::to_string(sh.head_dim) + " heads=" + std::to_string(sh.n_heads) +
                    "/" + std::to_string(sh.n_kv_heads) + " block=" + std::to_string(block_size) +
                    " lens";
    for (int32_t n : lens) l += " " + std::to_string(n);
    return l;
  }
};

// q rows two heads wider than the heads, as a fused qkv output would be. K entries in
// [-2, 2] (scores spread out), V in [-1, 1].
inline HostCase make_case(int D, int heads, int kv_heads, const std::vector<int>& lens,
                          int block_size, std::mt19937& rng) {
  HostCase c;
  c.sh.n_heads = heads;
  c.sh.n_kv_heads = kv_heads;
  c.sh.head_dim = D;
  c.sh.scale = 1.0f / std::sqrt(float(D));
  c.sh.q_stride = int64_t(heads + 2) * D;
  c.block_size = block_size;
  const int S = int(lens.size());
  const int max_len = *std::max_element(lens.begin(), lens.end());
  c.mb = (max_len + block_size - 1) / block_size + 1;
  c.num_blocks = S * c.mb + 3;
  const size_t cache_elems = size_t(c.num_blocks) * block_size * kv_heads * D;
  c.kc = random_bf16(cache_elems, rng, 2.0f);
  c.vc = random_bf16(cache_elems, rng, 1.0f);
  c.q = random_bf16(size_t(S) * c.sh.q_step(), rng, 1.0f);
  std::vector<int32_t> perm(size_t(c.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  c.tables.assign(size_t(S) * c.mb, -1);
  for (int s = 0; s < S; ++s)
    for (int b = 0; b * block_size < lens[size_t(s)]; ++b)
      c.tables[size_t(s) * c.mb + b] = perm[size_t(s) * c.mb + b];
  c.lens.assign(lens.begin(), lens.end());
  return c;
}

// The problem on the device (guarded arrays: an out-of-bounds write shows in the guards).
struct DevCase {
  explicit DevCase(const HostCase& c)
      : q(c.q), k(c.kc), v(c.vc), tables(c.tables), lens(c.lens),
        out(size_t(c.num_seqs()) * c.sh.n_heads * c.sh.head_dim), host(c) {}
  ops::PagedKv kv() {
    ops::PagedKv d = host.host_kv();
    d.k_cache = k.ptr();
    d.v_cache = v.ptr();
    d.block_tables = tables.ptr();
    d.seq_lens = lens.ptr();
    return d;
  }
  // The step plan (split_decode_plan.h) of this case at `splits` (0: the count the op picks),
  // uploaded; returns the explicit count the plan is for.
  int upload_plan(int splits) {
    if (splits == 0) splits = split_decode_auto_splits(host.num_seqs(), host.sh);
    std::vector<int32_t> p(split_decode_plan_ints(host.num_seqs(), splits));
    build_split_decode_plan(host.lens.data(), host.tables.data(), host.mb, host.block_size,
                            host.num_seqs(), splits, p.data());
    plan = std::make_unique<tetra::test::GuardedDeviceArray<int32_t>>(p);
    return splits;
  }
  // Enqueues the attention on `stream` (no poisoning, no sync): for tests that launch a
  // predecessor right before it. plan_ptr: a plan for this `splits` (nonzero), or nullptr.
  void launch(int splits, PredecessorWrites mode, cudaStream_t stream,
              const int32_t* plan_ptr = nullptr) {
    TETRA_CUDA_CHECK(split_decode_attention(q.ptr(), kv(), host.num_seqs(), host.sh, out.ptr(),
                                            stream, splits, mode, nullptr, plan_ptr));
  }
  // One launch over a poisoned output (0xFFFF: NaN); returns the output. planned: with the
  // case's step plan (upload_plan) instead of the kernel's own length and table reads.
  std::vector<uint16_t> run(int splits, PredecessorWrites mode, cudaStream_t stream = nullptr,
                            bool planned = false) {
    if (planned) splits = upload_plan(splits);
    out.poison();
    launch(splits, mode, stream, planned ? plan->ptr() : nullptr);
    TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(out.guards_intact()) << host.label();
    return out.download();
  }
  tetra::test::GuardedDeviceArray<uint16_t> q, k, v;
  tetra::test::GuardedDeviceArray<int32_t> tables, lens;
  std::unique_ptr<tetra::test::GuardedDeviceArray<int32_t>> plan;  // upload_plan's
  tetra::test::GuardedDeviceArray<uint16_t> out;
  const HostCase& host;
};

// Every output finite and NMSE vs the CPU reference <= 2e-5: the kernel computes the softmax
// and sums in float over the same bf16 inputs and rounds once, like the CPU, but rounds P to
// bf16 for the tensor cores (2^-9 relative per weight, averaging out: ~1e-6 in NMSE on large
// outputs). Measured on the H200: 1.006e-5 for one head pair of 64 dims (128 outputs) over
// 4097 tokens in one split, the noisiest case the tests build.
inline void expect_matches_cpu(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want,
                               const std::string& label) {
  ASSERT_EQ(got.size(), want.size()) << label;
  double err = 0, ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = bf16_to_float(got[i]), w = bf16_to_float(want[i]);
    ASSERT_TRUE(std::isfinite(g)) << label << ": element " << i;
    err += (g - w) * (g - w);
    ref += w * w;
  }
  ASSERT_GT(ref, 0.0) << label << ": the reference is all zeros";
  EXPECT_LE(err / ref, 2e-5) << label;
}

}  // namespace tetra::model::cuda::test
