// What does a kernel pay for code its SM has not run recently? The decode step's latency-bound
// kernels run once per SM per layer and are mostly straight-line code (the split decode
// attention is ~5,500 instructions, 88 KB, of which ~250 are its chunk loop; the tiny token path
// ~97 KB), and between two layers ~250 KB of other kernels' code pass through each SM.
// A walker kernel of N straight-line FMAs (16 bytes each, 8 independent chains) runs one block
// per SM and each block times itself (clock64 from entry to exit). Three states of its code:
//   warm:     the same kernel ran just before on every SM;
//   icache:   a walker of other code ran just before (320 KB of SASS: the SM's instruction
//             caches hold none of this one; the L2 still does);
//   l2:       as icache, then 256 MB were streamed so the L2 lost it too.
// Default: a smoke check that the walker computes what the host computes.
// TETRA_BENCH_FULL=1: the table (cycles per block, median over blocks, per state and N).
// H200 (bench/results/2026-12-01-session18-h200.md): cold code costs 1.0-1.5 extra cycles per
// instruction whether or not the L2 holds it (512-2048 FMAs, 4 warps per SM). At that rate the
// attention's ~5,500 instructions (88 KB, most run once per block) take 2.8-4 us to fetch where
// nothing else overlaps the fetch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/cuda_check.h"

namespace tetra {
namespace {

// N / 8 rounds of 8 independent x = x * m + c; m and c differ per SEED, so two SEEDs are two
// distinct code bodies of the same length.
template <int N, int SEED>
__global__ void walker(float* out, long long* cycles) {
  const long long t0 = clock64();
  float x[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) x[j] = float(threadIdx.x + j);
#pragma unroll
  for (int i = 0; i < N / 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float m = 1.0f - float((i * 8 + j + SEED) % 7) * (1.0f / 1024.0f);
      const float c = float((i + SEED) % 5) * (1.0f / 256.0f);
      asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x[j]) : "f"(m), "f"(c));
    }
  __syncthreads();
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += x[j];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = clock64() - t0;
}

std::vector<float> host_walker(int N, int SEED, int threads) {
  std::vector<float> r(static_cast<size_t>(threads), 0.0f);
  for (int t = 0; t < threads; ++t) {
    float x[8];
    for (int j = 0; j < 8; ++j) x[j] = float(t + j);
    for (int i = 0; i < N / 8; ++i)
      for (int j = 0; j < 8; ++j) {
        const float m = 1.0f - float((i * 8 + j + SEED) % 7) * (1.0f / 1024.0f);
        const float c = float((i + SEED) % 5) * (1.0f / 256.0f);
        x[j] = std::fma(x[j], m, c);
      }
    float s = 0.0f;
    for (int j = 0; j < 8; ++j) s += x[j];
    r[static_cast<size_t>(t)] = s;
  }
  return r;
}

__global__ void flush_l2(const uint4* p, size_t n16, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n16;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

constexpr int kThreads = 128;

TEST(BenchIcache, WalkerComputesWhatTheHostDoes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int blocks = 3;
  float* d_out;
  long long* d_cyc;
  TETRA_CUDA_CHECK(cudaMalloc(&d_out, sizeof(float) * blocks * kThreads));
  TETRA_CUDA_CHECK(cudaMalloc(&d_cyc, sizeof(long long) * blocks));
  walker<1024, 3><<<blocks, kThreads>>>(d_out, d_cyc);
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got(size_t(blocks) * kThreads);
  TETRA_CUDA_CHECK(cudaMemcpy(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost));
  const std::vector<float> want = host_walker(1024, 3, kThreads);
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < kThreads; ++t)
      ASSERT_EQ(got[size_t(b) * kThreads + t], want[size_t(t)]) << "block " << b << " thread " << t;
  cudaFree(d_out), cudaFree(d_cyc);
}

struct Bufs {
  float* out;
  long long* cyc;
  uint4* flush;
  size_t flush16;
  uint32_t* sink;
  int sms;
};

long long median_cycles(const Bufs& b) {
  std::vector<long long> c(size_t(b.sms));
  TETRA_CUDA_CHECK(cudaMemcpy(c.data(), b.cyc, c.size() * 8, cudaMemcpyDeviceToHost));
  std::nth_element(c.begin(), c.begin() + c.size() / 2, c.end());
  return c[c.size() / 2];
}

// Median block cycles of walker<N> in each state, best of `reps` rounds.
template <int N>
void time_states(const Bufs& b, int reps) {
  long long best[3] = {-1, -1, -1};
  for (int r = 0; r < reps; ++r)
    for (int state = 0; state < 3; ++state) {
      if (state == 0) walker<N, 0><<<b.sms, kThreads>>>(b.out, b.cyc);
      else walker<16384, 1><<<b.sms, kThreads>>>(b.out, b.cyc);  // other code, 320 KB
      if (state == 2) flush_l2<<<b.sms * 4, 256>>>(b.flush, b.flush16, b.sink);
      walker<N, 0><<<b.sms, kThreads>>>(b.out, b.cyc);
      TETRA_CUDA_CHECK(cudaDeviceSynchronize());
      const long long m = median_cycles(b);
      if (best[state] < 0 || m < best[state]) best[state] = m;
    }
  std::printf("| %d | %d | %lld | %lld | %lld | %.2f | %.2f |\n", N, N * 16 / 1024, best[0],
              best[1], best[2], double(best[1] - best[0]) / N, double(best[2] - best[0]) / N);
}

TEST(BenchIcache, ColdCodeCost) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (std::getenv("TETRA_BENCH_FULL") == nullptr) GTEST_SKIP() << "TETRA_BENCH_FULL=1 runs it";
  Bufs b{};
  b.sms = current_device_sm_count();
  b.flush16 = (size_t(256) << 20) / 16;
  TETRA_CUDA_CHECK(cudaMalloc(&b.out, sizeof(float) * b.sms * kThreads));
  TETRA_CUDA_CHECK(cudaMalloc(&b.cyc, sizeof(long long) * b.sms));
  TETRA_CUDA_CHECK(cudaMalloc(&b.flush, b.flush16 * 16));
  TETRA_CUDA_CHECK(cudaMalloc(&b.sink, 4));
  TETRA_CUDA_CHECK(cudaMemset(b.flush, 1, b.flush16 * 16));
  std::printf("| FMAs | KB | warm cycles | icache-cold | L2-cold | extra/instr icache | extra/instr L2 |\n"
              "|---|---|---|---|---|---|---|\n");
  time_states<512>(b, 5);
  time_states<1024>(b, 5);
  time_states<2048>(b, 5);  // larger N: nvcc stops unrolling (a loop over local memory)
  cudaFree(b.out), cudaFree(b.cyc), cudaFree(b.flush), cudaFree(b.sink);
}

}  // namespace
}  // namespace tetra
