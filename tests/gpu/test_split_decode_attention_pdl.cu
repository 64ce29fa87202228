// Race test of split_decode_attention's PredecessorWrites::QAndNewKvRow: a writer kernel lets
// its programmatic dependents launch at once, spins for tens of microseconds, then writes q and
// each sequence's cache row of position len - 1 (what the RoPE + KV write does in a decode
// step). The attention, launched right after it with PDL on the same stream, is then running
// its early cache reads while the writer spins. Before the writer runs, q and those rows hold
// NaN: an attention that read either before griddepcontrol.wait gives NaN outputs (or the bits
// differ from the default mode over the final data). Reference: the CPU attention over the
// written q and cache.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "model/cuda/split_decode_attention.h"
#include "split_decode_case.h"

namespace tetra::model::cuda {
namespace {

using test::DevCase;
using test::HostCase;

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One block per sequence s: after delay_ns, q row s <- q_final row s ([S, q_step] bf16) and
// cache row slots[s] of k_cache / v_cache ([slots, row] bf16) <- k_rows / v_rows row s.
__global__ void slow_new_row_writer(const uint16_t* q_final, uint16_t* q, int64_t q_step,
                                    const uint16_t* k_rows, const uint16_t* v_rows, int64_t row,
                                    const int64_t* slots, uint16_t* k_cache, uint16_t* v_cache,
                                    uint64_t delay_ns) {
  asm volatile("griddepcontrol.launch_dependents;");
  const uint64_t t0 = global_ns();
  while (global_ns() - t0 < delay_ns) {
  }
  const int64_t s = blockIdx.x, slot = slots[s];
  for (int64_t i = threadIdx.x; i < q_step; i += blockDim.x) q[s * q_step + i] = q_final[s * q_step + i];
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    k_cache[slot * row + i] = k_rows[s * row + i];
    v_cache[slot * row + i] = v_rows[s * row + i];
  }
}

TEST(SplitDecodeAttentionPdl, SlowPredecessorWritesQAndNewRows) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  constexpr uint16_t kNaN = 0x7FC0;
  constexpr uint64_t kDelayNs = 30000;  // ~3x the whole attention at 1025 tokens
  std::mt19937 rng(2026);
  struct Case { int D, heads, kv_heads; std::vector<int> lens; int block_size; };
  const std::vector<Case> cases = {
      {128, 96, 8, {1025}, 16},  // GLM-4.5-Air, batch 1
      {128, 96, 8, {1, 17, 64, 65, 4097}, 16},
      {64, 64, 4, {1, 15, 16, 150, 1025}, 12},  // group 16
      {64, 4, 4, {63, 2000}, 12},               // group 1
  };
  cudaStream_t stream = nullptr;
  TETRA_CUDA_CHECK(cudaStreamCreate(&stream));  // blocking: ordered after the uploads
  for (const Case& c : cases) {
    // hc holds the final state (what the writer leaves); the device starts with NaN in its place.
    const HostCase hc = test::make_case(c.D, c.heads, c.kv_heads, c.lens, c.block_size, rng);
    const int S = hc.num_seqs();
    const int64_t row = hc.row_elems(), q_step = hc.sh.q_step();
    std::vector<int64_t> slots(static_cast<size_t>(S));
    std::vector<uint16_t> k_rows(size_t(S) * row), v_rows(size_t(S) * row);
    std::vector<uint16_t> kc0 = hc.kc, vc0 = hc.vc;
    for (int s = 0; s < S; ++s) {
      slots[size_t(s)] = hc.slot(s, hc.lens[size_t(s)] - 1);
      for (int64_t i = 0; i < row; ++i) {
        const size_t at = size_t(slots[size_t(s)] * row + i);
        k_rows[size_t(s * row + i)] = hc.kc[at];
        v_rows[size_t(s * row + i)] = hc.vc[at];
        kc0[at] = kNaN;
        vc0[at] = kNaN;
      }
    }
    const std::vector<uint16_t> q_nan(hc.q.size(), kNaN);
    tetra::test::GuardedDeviceArray<uint16_t> dq_final(hc.q), dk_rows(k_rows), dv_rows(v_rows);
    tetra::test::GuardedDeviceArray<int64_t> dslots(slots);
    const std::vector<uint16_t> want = hc.cpu_reference();
    DevCase dev(hc);
    for (int splits : {0, 1, 16}) {
      const std::string label = hc.label() + " splits " + std::to_string(splits);
      for (int round = 0; round < 5; ++round) {
        dev.q.upload(q_nan);
        dev.k.upload(kc0);
        dev.v.upload(vc0);
        dev.out.poison();
        slow_new_row_writer<<<S, 256, 0, stream>>>(dq_final.ptr(), dev.q.ptr(), q_step,
                                                   dk_rows.ptr(), dv_rows.ptr(), row,
                                                   dslots.ptr(), dev.k.ptr(), dev.v.ptr(), kDelayNs);
        TETRA_CUDA_CHECK(cudaGetLastError());
        dev.launch(splits, PredecessorWrites::QAndNewKvRow, stream);
        TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
        const std::vector<uint16_t> got = dev.out.download();
        ASSERT_EQ(dev.k.download(), hc.kc) << "the writer left the cache wrong, " << label;
        test::expect_matches_cpu(got, want, label + " round " + std::to_string(round));
        EXPECT_EQ(dev.run(splits, PredecessorWrites::Anything), got)
            << "default mode over the final data, " << label;
        EXPECT_TRUE(dev.out.guards_intact()) << label;
      }
    }
  }
  TETRA_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace tetra::model::cuda
