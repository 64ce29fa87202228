// What does one kernel-to-kernel hand-off cost in the decode step's chain, and would a
// completion counter be cheaper than griddepcontrol.wait? The step is ~8 dependent kernels per
// layer; each consumer waits for its whole producer grid before reading its output.
// A chain of N link kernels (G blocks of 128 threads), each reading another block's output of the
// link before (a real cross-block dependency) and writing its own, replayed as one CUDA graph:
//   stream:   plain launches, stream order;
//   pdl:      programmatic dependent launches, griddepcontrol.launch_dependents at entry and
//             griddepcontrol.wait before the read (what the model's kernels do);
//   counter:  programmatic dependent launches that never wait on the grid: each producer block
//             counts itself in (release) after its stores, thread 0 of each consumer block spins
//             (acquire) until every producer block is in. A consumer grid is scheduled only
//             once every producer block has started (launch_dependents), so the spin cannot
//             hold a slot a producer block needs.
// And one launch for the whole chain (what a persistent decode-layer kernel would pay):
//   barrier:  every link runs in one resident grid; between links each block counts itself in
//             on a monotonic counter (release) and thread 0 polls it (relaxed, then one acquire
//             fence) until the whole grid, or only its group of 4 blocks, is in, instead of a
//             kernel boundary;
//   cluster:  the same in clusters of 8 blocks that wait on the cluster's hardware barrier.
// `work` FMA rounds per thread before the stores give each link a body (and an uneven end when
// `skew` adds work to every 8th block).
// Default: a smoke check that every mode computes the host's chain (and so that the counter's
// ordering holds). TETRA_BENCH_FULL=1: the table, us per link, median of graph replays.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/atomics.cuh"
#include "core/cuda_check.h"
#include "core/kernel_launch.h"
#include "graph_timing.h"

namespace tetra {
namespace {

enum Handoff { kStream = 0, kPdl = 1, kCounter = 2, kRelaxed = 3, kRelaxedLate = 4, kRelaxedLateNoFence = 5 };
constexpr int kThreads = 128;
constexpr int kReadBlocks = 37;  // block b reads block b + 37 (in its group) of the link before

// Block b of link k reads block src_block(b, group, 1) of level k, thread for thread: kReadBlocks
// blocks further within its group of `group` consecutive blocks (group = G: the whole grid);
// `steps` links back, src_block(b, group, steps).
__host__ __device__ inline int src_block(int b, int group, int steps) {
  return b - b % group + int((int64_t(b % group) + int64_t(steps) * kReadBlocks) % group);
}

// in, out: [G * kThreads]. in_done: the producer's counter (nullptr: nothing to wait for).
template <int MODE>
__global__ void __launch_bounds__(kThreads) link_kernel(const int* in, int* out,
                                                        const uint32_t* in_done, uint32_t* out_done,
                                                        int work, int skew) {
  if (MODE != kStream && MODE < kRelaxedLate) asm volatile("griddepcontrol.launch_dependents;");
  float f = float(threadIdx.x);
  const int rounds = work + ((skew > 0 && blockIdx.x % 8 == 0) ? skew : 0);
  for (int r = 0; r < rounds; ++r) f = fmaf(f, 0.999f, 0.5f);
  if (MODE == kPdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (MODE == kCounter) {
    if (threadIdx.x == 0 && in_done != nullptr)
      while (ld_acquire_gpu(in_done) < gridDim.x) {
      }
    __syncthreads();
  }
  if (MODE >= kRelaxed) {
    if (threadIdx.x == 0 && in_done != nullptr) {
      while (ld_relaxed_gpu(in_done) < gridDim.x) {
      }
      fence_acq_rel_gpu();
    }
    __syncthreads();
    if (MODE >= kRelaxedLate) asm volatile("griddepcontrol.launch_dependents;");
  }
  const int i = int(blockIdx.x) * kThreads + int(threadIdx.x);
  const int src = src_block(int(blockIdx.x), int(gridDim.x), 1) * kThreads + int(threadIdx.x);
  // f is ~500 after any rounds: adds 0 (keeps the FMA loop alive).
  out[i] = in[src] + 1 + (f < -1.0f ? 1 : 0);
  if (MODE >= kCounter) {
    __syncthreads();
    if (threadIdx.x == 0) {
      if (MODE != kRelaxedLateNoFence) __threadfence();
      red_add_release_gpu(out_done, 1u);
    }
  }
}

// The links of a one-launch chain, as block b runs them: link k does its work, waits (k > 0)
// with wait(k) until its group has written level k, then reads level k and writes level k + 1.
template <class Wait>
__device__ __forceinline__ void run_links(int* levels, int group, int links, int work, int skew,
                                          Wait wait) {
  const int n = int(gridDim.x) * kThreads;
  const int b = int(blockIdx.x), i = b * kThreads + int(threadIdx.x);
  const int src = src_block(b, group, 1) * kThreads + int(threadIdx.x);
  float f = float(threadIdx.x);
  const int rounds = work + ((skew > 0 && b % 8 == 0) ? skew : 0);
  for (int k = 0; k < links; ++k) {
    for (int r = 0; r < rounds; ++r) f = fmaf(f, 0.999f, 0.5f);
    if (k > 0) wait(k);
    const int* in = levels + size_t(k) * n;
    int* out = levels + size_t(k + 1) * n;
    out[i] = in[src] + 1 + (f < -1.0f ? 1 : 0);
  }
}

// The whole chain in one launch, links separated by a barrier over each group of blocks
// (arrivals[b / group] >= k * group; group = G: the whole grid). arrivals [G / group]: zero
// before the launch. Every block must be resident.
__global__ void __launch_bounds__(kThreads) barrier_chain(int* levels, uint32_t* arrivals,
                                                          int group, int links, int work,
                                                          int skew) {
  uint32_t* my_arrivals = arrivals + blockIdx.x / group;
  run_links(levels, group, links, work, skew, [&](int k) {
    __syncthreads();  // every thread's level-k store, before the block counts in
    if (threadIdx.x == 0) {
      __threadfence();
      red_add_release_gpu(my_arrivals, 1u);
      const uint32_t all = uint32_t(k) * uint32_t(group);
      while (ld_relaxed_gpu(my_arrivals) < all) {
      }
      fence_acq_rel_gpu();
    }
    __syncthreads();
  });
}

// The same with clusters of kClusterBlocks blocks as the groups and the cluster's hardware
// barrier (arrive.release / wait.acquire) as the signal: no counter in memory. G: a multiple of
// kClusterBlocks. Clusters never wait on each other, so they need not all be resident.
constexpr int kClusterBlocks = 8;
__global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(kThreads)
    cluster_chain(int* levels, int links, int work, int skew) {
  run_links(levels, kClusterBlocks, links, work, skew, [](int) {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
  });
}

struct Chain {
  int G = 0, links = 0, mode = kStream, work = 0, skew = 0;
  test::DeviceScratch buf, done;
  Chain(int g, int n, int m, int w, int s)
      : G(g), links(n), mode(m), work(w), skew(s),
        buf(size_t(n + 1) * g * kThreads * sizeof(int)),
        done(size_t(std::max(n, g)) * sizeof(uint32_t)) {}
  int* level(int k) const { return buf.as<int>() + size_t(k) * G * kThreads; }

  void launch(int k, cudaStream_t s) const {
    uint32_t* d = done.as<uint32_t>();
    if (k == 0) TETRA_CUDA_CHECK(cudaMemsetAsync(d, 0, size_t(links) * sizeof(uint32_t), s));
    // The first link follows the memset: a plain launch in every mode.
    KernelLaunch l(dim3(G), dim3(kThreads), s, mode != kStream && k > 0);
    const uint32_t* in_done = k > 0 ? d + k - 1 : nullptr;
    cudaError_t e = cudaSuccess;
    switch (mode) {
      case kStream: e = l(link_kernel<kStream>, level(k), level(k + 1), in_done, d + k, work, skew); break;
      case kPdl: e = l(link_kernel<kPdl>, level(k), level(k + 1), in_done, d + k, work, skew); break;
      case kCounter: e = l(link_kernel<kCounter>, level(k), level(k + 1), in_done, d + k, work, skew); break;
      case kRelaxed: e = l(link_kernel<kRelaxed>, level(k), level(k + 1), in_done, d + k, work, skew); break;
      case kRelaxedLate: e = l(link_kernel<kRelaxedLate>, level(k), level(k + 1), in_done, d + k, work, skew); break;
      default: e = l(link_kernel<kRelaxedLateNoFence>, level(k), level(k + 1), in_done, d + k, work, skew);
    }
    TETRA_CUDA_CHECK(e);
  }
  // The whole chain as one launch: barrier_chain over groups of `group` blocks (G: the whole
  // grid; G % group == 0), its counters zeroed first, or cluster_chain (group kClusterBlocks).
  void launch_one(int group, bool clusters, cudaStream_t s) const {
    KernelLaunch l(dim3(G), dim3(kThreads), s, false);
    if (clusters) {
      TETRA_CUDA_CHECK(l(cluster_chain, level(0), links, work, skew));
      return;
    }
    uint32_t* d = done.as<uint32_t>();
    TETRA_CUDA_CHECK(cudaMemsetAsync(d, 0, size_t(G / group) * sizeof(uint32_t), s));
    TETRA_CUDA_CHECK(l(barrier_chain, level(0), d, group, links, work, skew));
  }
  // The chain's last level against the host's: level k element (b, t) = level 0 element
  // (src_block(b, group, k), t), plus k. The kernel-per-link modes read across the whole grid.
  void expect_host_result(const std::vector<int>& level0, int group = 0) const {
    const int n = G * kThreads, g = group > 0 ? group : G;
    std::vector<int> got(static_cast<size_t>(n));
    TETRA_CUDA_CHECK(cudaMemcpy(got.data(), level(links), size_t(n) * sizeof(int),
                                cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; ++i) {
      const int src = src_block(i / kThreads, g, links) * kThreads + i % kThreads;
      if (got[size_t(i)] != level0[size_t(src)] + links) ++bad;
    }
    EXPECT_EQ(bad, 0) << "mode " << mode << " G " << G << " group " << g << " work " << work
                      << " skew " << skew;
  }
};

std::vector<int> seed_level0(const Chain& c) {
  const int n = c.G * kThreads;
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = (i * 7919) % 100003;
  TETRA_CUDA_CHECK(cudaMemcpy(c.level(0), v.data(), size_t(n) * sizeof(int), cudaMemcpyHostToDevice));
  return v;
}

// A chain of `links` links on G blocks run as one launch (Chain::launch_one), replayed `replays`
// times and checked against the host's; returns us per link.
double one_launch_us_per_link(int G, int links, int work, int skew, int group, bool clusters,
                              int replays) {
  Chain c(G, links, kStream, work, skew);
  const std::vector<int> level0 = seed_level0(c);
  const double us = test::graph_us_per_launch(
      1, [&](int, cudaStream_t s) { c.launch_one(group, clusters, s); }, replays);
  c.expect_host_result(level0, clusters ? kClusterBlocks : group);
  return us / links;
}

TEST(GridHandoff, EveryModeComputesTheHostChain) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (int mode : {kStream, kPdl, kCounter, kRelaxed, kRelaxedLate, kRelaxedLateNoFence})
    for (int G : {1, 132, 528, 1056})
      for (int skew : {0, 4000}) {
        Chain c(G, 24, mode, 200, skew);
        const std::vector<int> level0 = seed_level0(c);
        // Graph replays, as the bench runs them; every replay recomputes the same levels.
        test::graph_us_per_launch(c.links, [&](int k, cudaStream_t s) { c.launch(k, s); }, 3);
        c.expect_host_result(level0);
      }
  // The one-launch chain (its grid is resident: at most 8 blocks of 128 threads per SM), over
  // the whole grid and over groups of 4 blocks.
  for (int G : {4, 132, 528, 1056})
    for (int group : {G, 4})
      for (int skew : {0, 4000}) one_launch_us_per_link(G, 24, 200, skew, group, false, 3);
  for (int G : {8, 264, 1056})
    for (int skew : {0, 4000}) one_launch_us_per_link(G, 24, 200, skew, kClusterBlocks, true, 3);
}

TEST(GridHandoff, Table) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (std::getenv("TETRA_BENCH_FULL") == nullptr) GTEST_SKIP() << "TETRA_BENCH_FULL=1 runs it";
  std::printf("| blocks | work | skew | stream | pdl | counter (acquire spin) | counter (relaxed "
              "spin) | relaxed, trigger after the spin | the same without __threadfence | one "
              "launch, grid barrier | one launch, barriers over 4 blocks | one launch, cluster "
              "barriers (8 blocks) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int G : {64, 132, 264, 528, 1056})
    for (int work : {0, 2000})
      for (int skew : {0, 4000}) {
        double us[6];
        for (int mode : {kStream, kPdl, kCounter, kRelaxed, kRelaxedLate, kRelaxedLateNoFence}) {
          Chain c(G, 64, mode, work, skew);
          const std::vector<int> level0 = seed_level0(c);
          us[mode] = test::graph_us_per_launch(c.links, [&](int k, cudaStream_t s) { c.launch(k, s); },
                                               20);
          c.expect_host_result(level0);
        }
        const double grid = one_launch_us_per_link(G, 64, work, skew, G, false, 20);
        const double four = one_launch_us_per_link(G, 64, work, skew, 4, false, 20);
        char cl[16] = "-";  // grids of whole clusters only
        if (G % kClusterBlocks == 0)
          std::snprintf(cl, sizeof(cl), "%.2f",
                        one_launch_us_per_link(G, 64, work, skew, kClusterBlocks, true, 20));
        std::printf("| %d | %d | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s |\n",
                    G, work, skew, us[0], us[1], us[2], us[3], us[4], us[5], grid, four, cl);
      }
}

}  // namespace
}  // namespace tetra
