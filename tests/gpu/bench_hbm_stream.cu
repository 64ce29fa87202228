// How long does one kernel take to read N bytes from HBM? A plain streaming read (16-byte loads,
// four in flight per thread, 8 blocks of 256 threads per SM) timed alone with CUDA events and as
// a CUDA graph of back-to-back launches, for N from a few MB (one MoE GEMM at 1 token: 30-130 MB)
// to 1 GB, reading either one contiguous range or `pieces` ranges spread over a 4 GB pool (a
// layer's experts). Fits time = fixed + N / bandwidth, the floor every short decode kernel pays.
// Default: a smoke check that the kernel reads every byte (its XOR equals the host's).
// TETRA_BENCH_FULL=1: the table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/cuda_check.h"
#include "core/kernel_launch.h"

namespace tetra {
namespace {

// XOR of `pieces` ranges of n16 16-byte words each, starting at base + offsets[i] words.
// PDL: launched as a programmatic dependent that reads first and waits for its predecessor only
// before its one write (how a decode kernel streams weights ahead of its activations).
template <bool PDL = false>
__global__ void stream_read(const uint4* base, const size_t* offsets, int pieces, size_t n16,
                            uint32_t* out) {
  if (PDL) asm volatile("griddepcontrol.launch_dependents;");
  uint32_t acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (int p = 0; p < pieces; ++p) {
    const uint4* src = base + offsets[p];
    size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = __ldcs(src + i + u * stride);
#pragma unroll
      for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) {
      const uint4 v = __ldcs(src + i);
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  if (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (acc != 0) atomicXor(out, acc);
}

int grid_blocks() { return current_device_sm_count() * 8; }

TEST(BenchHbmStream, ReadsEveryByte) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const size_t n16 = (size_t(3) << 20) / 16 + 7;  // odd length: the tail loop runs too
  std::vector<uint32_t> host(n16 * 4);
  uint32_t want = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    host[i] = uint32_t(i * 2654435761u) ^ uint32_t(i >> 7);
    want ^= host[i];
  }
  uint4* d;
  size_t* d_off;
  uint32_t* d_out;
  TETRA_CUDA_CHECK(cudaMalloc(&d, n16 * 16));
  TETRA_CUDA_CHECK(cudaMalloc(&d_off, sizeof(size_t)));
  TETRA_CUDA_CHECK(cudaMalloc(&d_out, 4));
  TETRA_CUDA_CHECK(cudaMemcpy(d, host.data(), n16 * 16, cudaMemcpyHostToDevice));
  TETRA_CUDA_CHECK(cudaMemset(d_off, 0, sizeof(size_t)));
  TETRA_CUDA_CHECK(cudaMemset(d_out, 0, 4));
  stream_read<<<grid_blocks(), 256>>>(d, d_off, 1, n16, d_out);
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  uint32_t got = 0;
  TETRA_CUDA_CHECK(cudaMemcpy(&got, d_out, 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, want);
  cudaFree(d), cudaFree(d_off), cudaFree(d_out);
}

TEST(BenchHbmStream, TimeVsSize) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (std::getenv("TETRA_BENCH_FULL") == nullptr) GTEST_SKIP() << "TETRA_BENCH_FULL=1 runs it";
  const size_t pool = size_t(4) << 30;
  uint4* d;
  uint32_t* d_out;
  TETRA_CUDA_CHECK(cudaMalloc(&d, pool));
  TETRA_CUDA_CHECK(cudaMalloc(&d_out, 4));
  TETRA_CUDA_CHECK(cudaMemset(d, 0x5a, pool));
  const int kSets = 16;  // rotating placements, so no launch finds its bytes in L2 (60 MB)
  size_t* d_off;
  TETRA_CUDA_CHECK(cudaMalloc(&d_off, kSets * 9 * sizeof(size_t)));
  cudaStream_t s;
  TETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  TETRA_CUDA_CHECK(cudaEventCreate(&e0));
  TETRA_CUDA_CHECK(cudaEventCreate(&e1));
  std::printf("| MiB | pieces | alone us | alone TB/s | graph us/launch | graph TB/s | PDL graph us/launch | PDL graph TB/s |\n|---|---|---|---|---|---|---|---|\n");
  for (int pieces : {1, 9}) {
    for (size_t mb : {8, 16, 32, 64, 128, 256, 512, 1024}) {
      const size_t bytes = mb << 20, n16 = bytes / 16 / pieces;
      // Placement set k: piece i at a pseudo-random 16 KB-aligned place of its own 1/pieces of the pool.
      std::vector<size_t> off(size_t(kSets) * 9, 0);
      const size_t span = pool / 16 / size_t(pieces);
      for (int k = 0; k < kSets; ++k)
        for (int i = 0; i < pieces; ++i) {
          const size_t room = span - n16;
          const size_t pick = (size_t(k) * 2654435761u + size_t(i) * 40503u) % (room / 1024 + 1) * 1024;
          off[size_t(k) * 9 + i] = size_t(i) * span + pick;
        }
      TETRA_CUDA_CHECK(cudaMemcpy(d_off, off.data(), off.size() * sizeof(size_t), cudaMemcpyHostToDevice));
      std::vector<double> alone;
      for (int it = 0; it < 3 + 20; ++it) {
        const size_t* o = d_off + size_t(it % kSets) * 9;
        TETRA_CUDA_CHECK(cudaEventRecord(e0, s));
        stream_read<<<grid_blocks(), 256, 0, s>>>(d, o, pieces, n16, d_out);
        TETRA_CUDA_CHECK(cudaEventRecord(e1, s));
        TETRA_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms;
        TETRA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 3) alone.push_back(ms * 1e3);
      }
      std::sort(alone.begin(), alone.end());
      // A graph of kSets back-to-back launches over the placements; us per launch.
      auto graph_us = [&](bool pdl) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        TETRA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int k = 0; k < kSets; ++k) {
          const KernelLaunch launch(dim3(grid_blocks()), dim3(256), s, pdl);
          TETRA_CUDA_CHECK(pdl ? launch(stream_read<true>, d, d_off + size_t(k) * 9, pieces, n16, d_out)
                               : launch(stream_read<false>, d, d_off + size_t(k) * 9, pieces, n16, d_out));
        }
        TETRA_CUDA_CHECK(cudaStreamEndCapture(s, &g));
        TETRA_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
        std::vector<double> t;
        for (int it = 0; it < 2 + 7; ++it) {
          TETRA_CUDA_CHECK(cudaEventRecord(e0, s));
          TETRA_CUDA_CHECK(cudaGraphLaunch(ge, s));
          TETRA_CUDA_CHECK(cudaEventRecord(e1, s));
          TETRA_CUDA_CHECK(cudaEventSynchronize(e1));
          float ms;
          TETRA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
          if (it >= 2) t.push_back(ms * 1e3 / kSets);
        }
        std::sort(t.begin(), t.end());
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
        return t[t.size() / 2];
      };
      const double real = double(n16) * 16 * pieces;
      const double a = alone[alone.size() / 2], gr = graph_us(false), gp = graph_us(true);
      EXPECT_GT(a, 0.0);
      std::printf("| %zu | %d | %.1f | %.2f | %.1f | %.2f | %.1f | %.2f |\n", mb, pieces, a,
                  real / a / 1e6, gr, real / gr / 1e6, gp, real / gp / 1e6);
      std::fflush(stdout);
    }
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1), cudaStreamDestroy(s);
  cudaFree(d), cudaFree(d_off), cudaFree(d_out);
}

}  // namespace
}  // namespace tetra
