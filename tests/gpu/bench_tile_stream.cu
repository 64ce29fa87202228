// Does the fragment layout's access pattern read HBM as fast as a plain sweep of the same bytes?
// At one token the MoE decode GEMMs stream at ~4.0 TB/s once started (session 20) where a plain
// 16-byte sweep reads 4.46-4.7 TB/s. Their loads differ from a sweep in two ways: each warp reads
// its own k range of a tile pair as 1 KB pieces (U = 2 chunks of 512 B per tile per batch), and
// every 512 B weight chunk brings a 64 B scale piece from a separate array (moe/expert_weights.h).
// This loads-only kernel (no math: the XOR of what it read) walks the decode kernel's exact
// pattern over 9 experts picked from a pool larger than the L2, in four variants:
//   sweep       - the same bytes (weights and scales of the 9 experts) as a grid-stride sweep
//   decode      - the decode kernel's loads: weight chunks and their scale pieces, 2 arrays
//   no_scales   - the weight loads alone (what the scale pieces cost)
//   interleaved - scales stored right after their chunk (576-byte tile-chunks, one array)
//   scales_first- each warp reads its whole range's scales as 16-byte loads first, then weights
//   warp_strided- the decode loads with a block's k-warps interleaved chunk by chunk (warp w
//                 takes chunks w, w + KW, ...), so a block's requests in flight are one span
// Timed as a CUDA graph of launches over rotating expert sets (the model's launch gaps).
// OccupancyTable walks the decode pattern at other block shapes, occupancies and batch depths.
// Default: a smoke check that every variant reads every byte it should (XOR against the host).
// TETRA_BENCH_FULL=1: the tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/cuda_check.h"
#include "core/kernel_launch.h"
#include "graph_timing.h"
#include "ops/moe/w4a16_fragment.cuh"

namespace tetra {
namespace {

using moe_detail::kTileChunkBytes;
using moe_detail::kTileChunkScales;

enum Pattern { kSweep, kDecode, kNoScales, kInterleaved, kScalesFirst, kWarpStrided };
constexpr const char* kPatternName[] = {"sweep", "decode", "no_scales", "interleaved",
                                        "scales_first", "warp_strided"};
constexpr int kWarps = 4;          // k-warps per block, as the late decode kernel
constexpr int kBlocksPerSm = 8;    // its register cap's occupancy, held here by shared memory
constexpr int kSlots = 9;          // 8 routed experts + the shared one
constexpr int kSets = 16;          // rotating expert sets of the timing tests

struct Geometry {
  const char* name;
  int pairs;   // tile pairs per expert (n / 32)
  int chunks;  // k / 64
  size_t w_bytes() const { return size_t(pairs) * 2 * chunks * kTileChunkBytes; }
  size_t s_bytes() const { return size_t(pairs) * 2 * chunks * kTileChunkScales; }
};

struct StreamArgs {
  const uint8_t* w;     // [pool experts][tiles][chunks][512] (interleaved: [..][576])
  const uint8_t* s;     // [pool experts][tiles][chunks][64]
  const int* experts;   // [kSlots] pool indices of this launch
  int pairs, chunks;
  uint32_t* out;
};

// kPdl: launched as a programmatic dependent that waits after its first weight batch (the real
// GEMM2 after GEMM1). Every variant lets its dependents start at once (as GEMM1 does).
// MINB: the register cap of an occupancy above kBlocksPerSm; KW: k-warps per block
// (OccupancyTable).
template <int P, int U, bool kPdl = false, int MINB = 1, int KW = kWarps>
__global__ void __launch_bounds__(KW * 32, MINB) tile_stream(const StreamArgs a) {
  asm volatile("griddepcontrol.launch_dependents;");
  const uint64_t pol = moe_detail::l2_evict_first_policy();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t tiles = size_t(a.pairs) * 2, wx = tiles * a.chunks * kTileChunkBytes,
               sx = tiles * a.chunks * kTileChunkScales;
  uint32_t acc = 0;
  if constexpr (P == kSweep) {
    // Every slot's weight and scale bytes, 16 B per thread per step, whole grid striding.
    const size_t stride = size_t(gridDim.x) * blockDim.x * 16;
    for (int slot = 0; slot < kSlots; ++slot) {
      const size_t e = size_t(a.experts[slot]);
      for (int part = 0; part < 2; ++part) {
        const uint8_t* base = part == 0 ? a.w + e * wx : a.s + e * sx;
        const size_t n = part == 0 ? wx : sx;
        size_t i = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) * 16;
        for (; i + (U - 1) * stride < n; i += U * stride) {
          uint4 v[U];
#pragma unroll
          for (int u = 0; u < U; ++u) v[u] = moe_detail::ld_stream_u4(base + i + u * stride, pol);
#pragma unroll
          for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        }
        for (; i < n; i += stride) {
          const uint4 v = moe_detail::ld_stream_u4(base + i, pol);
          acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
      }
    }
  } else {
    const int pair = int(blockIdx.x) % a.pairs, slot = int(blockIdx.x) / a.pairs;
    const size_t e = size_t(a.experts[slot]);
    const int c_begin = warp * a.chunks / KW, c_end = (warp + 1) * a.chunks / KW;
    // The warp's chunks: its contiguous range, or (warp_strided) every KW-th chunk from its index.
    constexpr int kStep = P == kWarpStrided ? KW : 1;
    const int c_first = P == kWarpStrided ? warp : c_begin;
    const int c_last = P == kWarpStrided ? a.chunks : c_end;  // exclusive
    const size_t t0 = size_t(2 * pair) * a.chunks;  // tile-chunk index of tile0's chunk 0
    const size_t t1 = t0 + a.chunks;                // tile0 + 1
    constexpr size_t kIl = kTileChunkBytes + kTileChunkScales;
    const uint8_t* wbase = P == kInterleaved ? a.w + e * (wx + sx) : a.w + e * wx;
    const uint8_t* sbase = a.s + e * sx;
    if constexpr (P == kScalesFirst) {
      // The range's scale pieces are contiguous per tile: (c_end - c_begin) * 64 bytes each.
      const int n16 = (c_end - c_begin) * kTileChunkScales / 16;
      for (int i = lane; i < 2 * n16; i += 32) {
        const size_t tc = (i < n16 ? t0 : t1) + c_begin;
        const uint4 v = moe_detail::ld_stream_u4(sbase + tc * kTileChunkScales + (i % n16) * 16, pol);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
    }
    for (int c = c_first; c < c_last; c += U * kStep) {
      uint4 wv[U][2];
      uint32_t sv[U][2];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (c + u * kStep >= c_last) continue;
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const size_t tc = (t == 0 ? t0 : t1) + c + u * kStep;
          if constexpr (P == kInterleaved) {
            wv[u][t] = moe_detail::ld_stream_u4(wbase + tc * kIl + lane * 16, pol);
            sv[u][t] = moe_detail::ld_stream_u16(wbase + tc * kIl + kTileChunkBytes + lane * 2, pol);
          } else {
            wv[u][t] = moe_detail::ld_stream_u4(wbase + tc * kTileChunkBytes + lane * 16, pol);
            sv[u][t] = P == kDecode || P == kWarpStrided
                           ? moe_detail::ld_stream_u16(sbase + tc * kTileChunkScales + lane * 2, pol)
                           : 0u;
          }
        }
      }
      if (kPdl && c == c_first) asm volatile("griddepcontrol.wait;" ::: "memory");
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (c + u * kStep >= c_last) continue;
#pragma unroll
        for (int t = 0; t < 2; ++t)
          acc ^= wv[u][t].x ^ wv[u][t].y ^ wv[u][t].z ^ wv[u][t].w ^ sv[u][t];
      }
    }
  }
  if (acc != 0) atomicXor(a.out, acc);
}

// Grid, block and the shared-memory padding that holds occupancy at BPS blocks per SM.
constexpr size_t pad_for(int blocks_per_sm) { return size_t(227 << 10) / blocks_per_sm - 1024; }
constexpr size_t kPad = pad_for(kBlocksPerSm);
template <int P, int U, bool kPdl = false, int BPS = kBlocksPerSm, int KW = kWarps>
cudaError_t launch_pattern(const StreamArgs& a, cudaStream_t s) {
  const int sms = current_device_sm_count();
  const unsigned grid = P == kSweep ? unsigned(sms * BPS) : unsigned(a.pairs * kSlots);
  auto kernel = tile_stream<P, U, kPdl, (BPS * KW > kBlocksPerSm * kWarps ? BPS : 1), KW>;
  const int pad = int(pad_for(BPS));
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, pad);
  if (e != cudaSuccess) return e;
  const KernelLaunch launch(dim3(grid), dim3(KW * 32), s, kPdl, size_t(pad));
  return launch(kernel, a);
}

cudaError_t launch_any(int pattern, int u, const StreamArgs& a, cudaStream_t s) {
#define TETRA_PATTERN(P)                                   \
  case P:                                                  \
    return u == 2 ? launch_pattern<P, 2>(a, s) : launch_pattern<P, 4>(a, s);
  switch (pattern) {
    TETRA_PATTERN(kSweep)
    TETRA_PATTERN(kDecode)
    TETRA_PATTERN(kNoScales)
    TETRA_PATTERN(kInterleaved)
    TETRA_PATTERN(kScalesFirst)
    TETRA_PATTERN(kWarpStrided)
    default: return cudaErrorInvalidValue;
  }
#undef TETRA_PATTERN
}

// The one-token layer's two GEMMs as one grid, the shape a fused kernel would have: cluster c of 8
// blocks owns 128 intermediate rows (slice p) of slot s's expert; block j streams gate/up tile
// pair 8p + j over all of k, then the down projection's rows [H/8 j, H/8 (j+1)) over the slice's
// two k chunks (partial sums a real kernel would reduce across slices). kSync: a cluster barrier
// between the parts (where a real kernel would exchange the slice's activations over DSMEM), the
// first down batch issued before it.
struct FusedArgs {
  StreamArgs g1;            // gate/up: pairs = I / 16, chunks = H / 64
  const uint8_t *w2, *s2;   // down, per pool expert: [tiles2][chunks2][512] and [..][64]
  int tiles2, chunks2;      // H / 16, I / 64 (= 2 * slices)
};

template <bool kSync>
__global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(kWarps * 32)
    fused_stream(const FusedArgs f) {
  const StreamArgs& a = f.g1;
  const uint64_t pol = moe_detail::l2_evict_first_policy();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slices = a.pairs / 8, cl = int(blockIdx.x) / 8, j = int(blockIdx.x) % 8;
  const int slot = cl / slices, p = cl % slices;
  const size_t e = size_t(a.experts[slot]);
  uint32_t acc = 0;
  {  // gate/up pair 8p + j: the decode pattern, U = 2
    const size_t wx = size_t(a.pairs) * 2 * a.chunks * kTileChunkBytes;
    const size_t sx = size_t(a.pairs) * 2 * a.chunks * kTileChunkScales;
    const int c_begin = warp * a.chunks / kWarps, c_end = (warp + 1) * a.chunks / kWarps;
    const size_t t0 = size_t(2 * (8 * p + j)) * a.chunks, t1 = t0 + a.chunks;
    for (int c = c_begin; c < c_end; c += 2) {
      uint4 wv[2][2];
      uint32_t sv[2][2];
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int t = 0; t < 2; ++t)
          if (c + u < c_end) {
            const size_t tc = (t == 0 ? t0 : t1) + c + u;
            wv[u][t] = moe_detail::ld_stream_u4(a.w + e * wx + tc * kTileChunkBytes + lane * 16, pol);
            sv[u][t] = moe_detail::ld_stream_u16(a.s + e * sx + tc * kTileChunkScales + lane * 2, pol);
          }
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int t = 0; t < 2; ++t)
          if (c + u < c_end) acc ^= wv[u][t].x ^ wv[u][t].y ^ wv[u][t].z ^ wv[u][t].w ^ sv[u][t];
    }
  }
  // Down rows of block j, warp's share tpw tiles (even), 2 tiles x 2 chunks per batch.
  const int tpw = f.tiles2 / 8 / kWarps, tile0 = j * (f.tiles2 / 8) + warp * tpw;
  const size_t wx2 = size_t(f.tiles2) * f.chunks2 * kTileChunkBytes;
  const size_t sx2 = size_t(f.tiles2) * f.chunks2 * kTileChunkScales;
  for (int t = 0; t < tpw; t += 2) {
    uint4 wv[2][2];
    uint32_t sv[2][2];
#pragma unroll
    for (int tt = 0; tt < 2; ++tt)
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        const size_t tc = size_t(tile0 + t + tt) * f.chunks2 + 2 * p + cc;
        wv[tt][cc] = moe_detail::ld_stream_u4(f.w2 + e * wx2 + tc * kTileChunkBytes + lane * 16, pol);
        sv[tt][cc] = moe_detail::ld_stream_u16(f.s2 + e * sx2 + tc * kTileChunkScales + lane * 2, pol);
      }
    if (kSync && t == 0)
      asm volatile("barrier.cluster.arrive.release.aligned;\n"
                   "barrier.cluster.wait.acquire.aligned;" ::: "memory");
#pragma unroll
    for (int tt = 0; tt < 2; ++tt)
#pragma unroll
      for (int cc = 0; cc < 2; ++cc)
        acc ^= wv[tt][cc].x ^ wv[tt][cc].y ^ wv[tt][cc].z ^ wv[tt][cc].w ^ sv[tt][cc];
  }
  if (acc != 0) atomicXor(a.out, acc);
}

cudaError_t launch_fused(bool sync, const FusedArgs& f, cudaStream_t s) {
  auto kernel = sync ? fused_stream<true> : fused_stream<false>;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kPad));
  if (e != cudaSuccess) return e;
  const KernelLaunch launch(dim3(unsigned(f.g1.pairs * kSlots)), dim3(kWarps * 32), s, false, kPad);
  return launch(kernel, f);
}

// Pool of E experts of geometry g: weights (separate or interleaved) and scales, byte i of
// expert e = hash(e, i); the host XOR of what a pattern must read.
struct Pool {
  Pool(const Geometry& g, int experts) : g(g), experts(experts) {
    const size_t wb = g.w_bytes() + g.s_bytes();
    TETRA_CUDA_CHECK(cudaMalloc(&w, wb * experts));
    TETRA_CUDA_CHECK(cudaMalloc(&s, g.s_bytes() * experts));
    TETRA_CUDA_CHECK(cudaMalloc(&ids, sizeof(int) * kSlots * 64));
    TETRA_CUDA_CHECK(cudaMalloc(&out, 4));
  }
  ~Pool() { cudaFree(w), cudaFree(s), cudaFree(ids), cudaFree(out); }
  // For timing: constant bytes, and kSets sets of kSlots experts in ids (launch i reads set
  // i % kSets, so no launch finds the previous one's bytes in the L2).
  void fill_for_timing() {
    TETRA_CUDA_CHECK(cudaMemset(w, 0x5a, (g.w_bytes() + g.s_bytes()) * experts));
    TETRA_CUDA_CHECK(cudaMemset(s, 0x3c, g.s_bytes() * experts));
    std::vector<int> h(size_t(kSets) * kSlots);
    for (int k = 0; k < kSets; ++k)
      for (int i = 0; i < kSlots; ++i) h[size_t(k) * kSlots + i] = (k * kSlots + i) * 7 % experts;
    TETRA_CUDA_CHECK(cudaMemcpy(ids, h.data(), h.size() * sizeof(int), cudaMemcpyHostToDevice));
  }
  Geometry g;
  int experts;
  uint8_t *w = nullptr, *s = nullptr;
  int* ids = nullptr;
  uint32_t* out = nullptr;
};

uint32_t word_hash(size_t i) { return uint32_t(i * 2654435761u) ^ uint32_t(i >> 9) ^ 0x9e3779b9u; }

TEST(BenchTileStream, EveryPatternReadsItsBytes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  // Odd shape: 3 pairs, 11 chunks (warp ranges of 2 and 3 chunks, a short last batch).
  const Geometry g{"odd", 3, 11};
  Pool pool(g, kSlots);
  const size_t wx = g.w_bytes(), sx = g.s_bytes(), n_w = wx / 4 * kSlots, n_s = sx / 4 * kSlots;
  std::vector<uint32_t> hw(n_w), hs(n_s), hil((wx + sx) / 4 * kSlots);
  uint32_t want_w = 0, want_s = 0;
  for (size_t i = 0; i < n_w; ++i) want_w ^= (hw[i] = word_hash(i));
  for (size_t i = 0; i < n_s; ++i) want_s ^= (hs[i] = word_hash(i + (size_t(1) << 40)));
  // Interleaved copy: tile-chunk j of expert e = its 512 weight bytes, then its 64 scale bytes.
  const size_t tcs = wx / kTileChunkBytes;
  for (size_t e = 0; e < kSlots; ++e)
    for (size_t j = 0; j < tcs; ++j) {
      uint32_t* dst = hil.data() + (e * tcs + j) * (kTileChunkBytes + kTileChunkScales) / 4;
      for (int q = 0; q < kTileChunkBytes / 4; ++q)
        dst[q] = hw[(e * tcs + j) * kTileChunkBytes / 4 + q];
      for (int q = 0; q < kTileChunkScales / 4; ++q)
        dst[kTileChunkBytes / 4 + q] = hs[(e * tcs + j) * kTileChunkScales / 4 + q];
    }
  std::vector<int> ids(kSlots);
  for (int i = 0; i < kSlots; ++i) ids[i] = kSlots - 1 - i;
  TETRA_CUDA_CHECK(cudaMemcpy(pool.s, hs.data(), sx * kSlots, cudaMemcpyHostToDevice));
  TETRA_CUDA_CHECK(cudaMemcpy(pool.ids, ids.data(), sizeof(int) * kSlots, cudaMemcpyHostToDevice));
  // Scale XOR as the u16 loads see it: every 16-bit piece once, so the XOR of the words folds
  // to lo ^ hi halves.
  auto fold = [](uint32_t v) { return (v & 0xffffu) ^ (v >> 16); };
  for (int pattern : {kSweep, kDecode, kNoScales, kInterleaved, kScalesFirst, kWarpStrided})
    for (int u : {2, 4}) {
      const bool il = pattern == kInterleaved;
      TETRA_CUDA_CHECK(cudaMemcpy(pool.w, il ? hil.data() : hw.data(), il ? (wx + sx) * kSlots : wx * kSlots,
                                  cudaMemcpyHostToDevice));
      TETRA_CUDA_CHECK(cudaMemset(pool.out, 0, 4));
      const StreamArgs a{pool.w, pool.s, pool.ids, g.pairs, g.chunks, pool.out};
      TETRA_CUDA_CHECK(launch_any(pattern, u, a, nullptr));
      TETRA_CUDA_CHECK(cudaDeviceSynchronize());
      uint32_t got = 0;
      TETRA_CUDA_CHECK(cudaMemcpy(&got, pool.out, 4, cudaMemcpyDeviceToHost));
      uint32_t want = want_w;
      if (pattern == kSweep || pattern == kScalesFirst) want ^= want_s;
      if (pattern == kDecode || pattern == kInterleaved || pattern == kWarpStrided) want ^= fold(want_s);
      EXPECT_EQ(got, want) << kPatternName[pattern] << " U=" << u;
    }
}

// Device bytes of hashed words (seeded); returns the XOR of the words.
uint32_t fill_hashed(uint8_t* d, size_t bytes, size_t seed) {
  std::vector<uint32_t> h(bytes / 4);
  uint32_t x = 0;
  for (size_t i = 0; i < h.size(); ++i) x ^= (h[i] = word_hash(i + (seed << 40)));
  TETRA_CUDA_CHECK(cudaMemcpy(d, h.data(), bytes, cudaMemcpyHostToDevice));
  return x;
}
uint32_t fold16(uint32_t v) { return (v & 0xffffu) ^ (v >> 16); }

TEST(BenchTileStream, FusedReadsBothGemmsBytes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  // 2 slices of 8 pairs, k 5 chunks (warp ranges of 1 and 2); down 64 tiles x 4 chunks.
  const Geometry g1{"odd gate/up", 16, 5};
  const int tiles2 = 64, chunks2 = 4;
  const size_t w2b = size_t(tiles2) * chunks2 * kTileChunkBytes * kSlots;
  const size_t s2b = size_t(tiles2) * chunks2 * kTileChunkScales * kSlots;
  Pool pool(g1, kSlots);
  uint8_t *w2, *s2;
  TETRA_CUDA_CHECK(cudaMalloc(&w2, w2b));
  TETRA_CUDA_CHECK(cudaMalloc(&s2, s2b));
  const uint32_t want = fill_hashed(pool.w, g1.w_bytes() * kSlots, 1) ^
                        fold16(fill_hashed(pool.s, g1.s_bytes() * kSlots, 2)) ^
                        fill_hashed(w2, w2b, 3) ^ fold16(fill_hashed(s2, s2b, 4));
  std::vector<int> ids(kSlots);
  for (int i = 0; i < kSlots; ++i) ids[i] = (i * 4) % kSlots;  // a permutation of 0..8
  TETRA_CUDA_CHECK(cudaMemcpy(pool.ids, ids.data(), sizeof(int) * kSlots, cudaMemcpyHostToDevice));
  for (bool sync : {false, true}) {
    TETRA_CUDA_CHECK(cudaMemset(pool.out, 0, 4));
    const FusedArgs f{{pool.w, pool.s, pool.ids, g1.pairs, g1.chunks, pool.out}, w2, s2, tiles2, chunks2};
    TETRA_CUDA_CHECK(launch_fused(sync, f, nullptr));
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
    uint32_t got = 0;
    TETRA_CUDA_CHECK(cudaMemcpy(&got, pool.out, 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, want) << "sync " << sync;
  }
  cudaFree(w2), cudaFree(s2);
}

// The one-token MoE layer's GEMM bytes (9 experts): GEMM1 and GEMM2 as two launches (GEMM2 a
// programmatic dependent that waits after its first batch, as in the model) against one fused
// grid, with and without its mid-kernel cluster barrier.
TEST(BenchTileStream, OneTokenGemmsFusedVsTwoLaunches) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (std::getenv("TETRA_BENCH_FULL") == nullptr) GTEST_SKIP() << "TETRA_BENCH_FULL=1 runs it";
  struct Layer { const char* name; int H, I; };
  std::printf("| layer | variant | us/layer | TB/s (both GEMMs' bytes) |\n|---|---|---|---|\n");
  for (const Layer& l : {Layer{"glm4.5-air", 4096, 1408}, Layer{"glm5", 6144, 2048},
                         Layer{"qwen3-30b-a3b", 2048, 768}}) {
    const Geometry g1{"gate/up", l.I / 16, l.H / 64};  // pairs = 2 I / 32
    const Geometry g2{"down", l.H / 32, l.I / 64};
    const size_t per_expert = g1.w_bytes() + g1.s_bytes() + g2.w_bytes() + g2.s_bytes();
    const int experts = int(std::max<size_t>(64, (size_t(900) << 20) / per_expert));
    Pool p1(g1, experts), p2(g2, experts);  // launch i reads the same set of both
    p1.fill_for_timing();
    p2.fill_for_timing();
    const double bytes = double(per_expert) * kSlots;
    const char* names[] = {"gemm1 alone", "gemm2 alone", "gemm1 + gemm2 (pdl)", "fused",
                           "fused + cluster barrier"};
    for (int v = 0; v < 5; ++v) {
      const double us = test::graph_us_per_launch(32, [&](int i, cudaStream_t s) {
        const int* set = p1.ids + (i % kSets) * kSlots;
        const StreamArgs a1{p1.w, p1.s, set, g1.pairs, g1.chunks, p1.out};
        const StreamArgs a2{p2.w, p2.s, set, g2.pairs, g2.chunks, p2.out};
        const FusedArgs f{a1, p2.w, p2.s, 2 * g2.pairs, g2.chunks};
        if (v == 0 || v == 2) TETRA_CUDA_CHECK((launch_pattern<kDecode, 2>(a1, s)));
        if (v == 1) TETRA_CUDA_CHECK((launch_pattern<kDecode, 2>(a2, s)));
        if (v == 2) TETRA_CUDA_CHECK((launch_pattern<kDecode, 2, true>(a2, s)));
        if (v >= 3) TETRA_CUDA_CHECK(launch_fused(v == 4, f, s));
      });
      const double moved = v == 0   ? double(g1.w_bytes() + g1.s_bytes()) * kSlots
                           : v == 1 ? double(g2.w_bytes() + g2.s_bytes()) * kSlots
                                    : bytes;
      EXPECT_GT(us, 0.0);
      std::printf("| %s | %s | %.2f | %.2f |\n", l.name, names[v], us, moved / us / 1e6);
      std::fflush(stdout);
    }
  }
}

// The one-token GEMMs the timing tables walk.
constexpr Geometry kOneTokenShapes[] = {{"air gemm1 (n 2816, k 4096)", 88, 64},
                                        {"air gemm2 (n 4096, k 1408)", 128, 22},
                                        {"glm5 gemm1 (n 4096, k 6144)", 128, 96}};
// A pool of experts 12x the L2 at least; launch i reads the 9 experts of set i % 16.
int timing_pool_experts(const Geometry& g) {
  return int(std::max<size_t>(64, (size_t(800) << 20) / (g.w_bytes() + g.s_bytes())));
}

// The decode pattern's loads at other occupancies and batch depths: does a one-token GEMM1 that
// keeps more warps per SM (fewer registers each) read faster than the real kernel's 8 blocks of 4
// warps? (A plain sweep at 16 blocks of 8 warps per SM reads ~4.5 TB/s, session 11.)
// One row: us per launch of the decode pattern at U chunks per batch, BPS blocks per SM (cap),
// KW k-warps per block.
template <int U, int BPS, int KW = kWarps, int P = kDecode>
double occupancy_row(const Geometry& g, Pool& pool) {
  return test::graph_us_per_launch(32, [&](int i, cudaStream_t s) {
    const StreamArgs a{pool.w, pool.s, pool.ids + (i % kSets) * kSlots, g.pairs, g.chunks, pool.out};
    TETRA_CUDA_CHECK((launch_pattern<P, U, false, BPS, KW>(a, s)));
  });
}

TEST(BenchTileStream, OccupancyTable) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (std::getenv("TETRA_BENCH_FULL") == nullptr) GTEST_SKIP() << "TETRA_BENCH_FULL=1 runs it";
  std::printf("| shape | k-warps | blocks/SM (cap) | U | us/launch | TB/s |\n|---|---|---|---|---|---|\n");
  for (const Geometry& g : kOneTokenShapes) {
    Pool pool(g, timing_pool_experts(g));
    pool.fill_for_timing();
    const double bytes = double(g.w_bytes() + g.s_bytes()) * kSlots;
    auto row = [&](int kw, int bps, int u, double us) {
      EXPECT_GT(us, 0.0);
      std::printf("| %s | %d | %d | %d | %.2f | %.2f |\n", g.name, kw, bps, u, us,
                  bytes / us / 1e6);
      std::fflush(stdout);
    };
    row(4, 8, 2, occupancy_row<2, 8>(g, pool));  // the real kernel's shape
    row(4, 8, 1, occupancy_row<1, 8>(g, pool));
    row(4, 4, 2, occupancy_row<2, 4>(g, pool));
    row(4, 12, 2, occupancy_row<2, 12>(g, pool));
    row(4, 16, 1, occupancy_row<1, 16>(g, pool));
    row(6, 8, 2, occupancy_row<2, 8, 6>(g, pool));
    row(8, 6, 1, occupancy_row<1, 6, 8>(g, pool));
    row(8, 6, 2, occupancy_row<2, 6, 8>(g, pool));
    row(8, 8, 1, occupancy_row<1, 8, 8>(g, pool));
    row(8, 8, 2, occupancy_row<2, 8, 8>(g, pool));
    row(16, 4, 1, occupancy_row<1, 4, 16>(g, pool));
    // The same with a block's k-warps interleaved chunk by chunk (warp_strided).
    std::printf("| %s | warp_strided from here | | | | |\n", g.name);
    row(4, 8, 2, occupancy_row<2, 8, 4, kWarpStrided>(g, pool));
    row(4, 8, 1, occupancy_row<1, 8, 4, kWarpStrided>(g, pool));
    row(6, 8, 2, occupancy_row<2, 8, 6, kWarpStrided>(g, pool));
    row(8, 6, 2, occupancy_row<2, 6, 8, kWarpStrided>(g, pool));
    row(8, 8, 1, occupancy_row<1, 8, 8, kWarpStrided>(g, pool));
    row(8, 8, 2, occupancy_row<2, 8, 8, kWarpStrided>(g, pool));
    row(4, 16, 1, occupancy_row<1, 16, 4, kWarpStrided>(g, pool));
    row(4, 8, 2, occupancy_row<2, 8>(g, pool));  // the first row again: drift
  }
}

TEST(BenchTileStream, PatternTable) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (std::getenv("TETRA_BENCH_FULL") == nullptr) GTEST_SKIP() << "TETRA_BENCH_FULL=1 runs it";
  std::printf("| shape | pattern | U | us/launch | TB/s (weights + scales) |\n|---|---|---|---|---|\n");
  for (const Geometry& g : kOneTokenShapes) {
    Pool pool(g, timing_pool_experts(g));
    pool.fill_for_timing();
    const double bytes = double(g.w_bytes() + g.s_bytes()) * kSlots;
    for (int pattern : {kSweep, kDecode, kNoScales, kInterleaved, kScalesFirst, kWarpStrided})
      for (int u : {2, 4}) {
        const double us = test::graph_us_per_launch(32, [&](int i, cudaStream_t s) {
          const StreamArgs a{pool.w, pool.s, pool.ids + (i % kSets) * kSlots, g.pairs, g.chunks,
                             pool.out};
          TETRA_CUDA_CHECK(launch_any(pattern, u, a, s));
        });
        // no_scales moves only the weights.
        const double moved = pattern == kNoScales ? double(g.w_bytes()) * kSlots : bytes;
        EXPECT_GT(us, 0.0);
        std::printf("| %s | %s | %d | %.2f | %.2f |\n", g.name, kPatternName[pattern], u, us,
                    moved / us / 1e6);
        std::fflush(stdout);
      }
  }
}

}  // namespace
}  // namespace tetra
