// Benchmark of the W4A16 MoE GEMMs (GEMM1+SiLU*up, GEMM2) on model shapes, as a gpu-labelled
// test binary. Default: a quick smoke run that checks the timing path (finite outputs, times > 0).
// TETRA_BENCH_FULL=1: the full table (GLM-5, GLM-4.5-Air; 1..4096 tokens; every kernel variant,
// and the decode kernel's diagnostic modes, which time its loads without parts of its math).
// Routing is random top-k, rotated over several sets so L2 (60 MB) cannot hold the experts.
// Floor = bytes that must move (unique experts' packed weights + scales, x, act write+read, y f32)
// at 4.46 TB/s (measured HBM read ceiling, DEVICE.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "core/cuda_check.h"
#include "moe/expert_weights.h"
#include "ops/moe/w4a16_launch.h"
#include "ops/moe/w4a16_moe.h"

namespace tetra {
namespace {

__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed, uint8_t lo, uint8_t span) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ seed ^ uint32_t(i >> 32) * 0x85EBCA77u;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    p[i] = span ? uint8_t(lo + (h % span)) : uint8_t(h);
  }
}
__global__ void fill_bf16(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 13;
    // bf16 in [-2, 2): sign, exponent 126..127, random mantissa
    p[i] = uint16_t((h & 0x8000u) | ((126u + ((h >> 8) & 1u)) << 7) | (h & 0x7fu));
  }
}
__global__ void fill_f32(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) p[i] = v;
}

struct Shape {
  const char* name;
  int E, H, I, topk;
};

struct Routing {  // one routing set on the device, contiguous layout
  int* d_start = nullptr;  // [E]
  int* d_count = nullptr;  // [E]
  int* d_ids = nullptr;    // [slots] active experts, padded with -1
  int slots = 0, unique = 0, max_rows = 0;
};

Routing make_routing(const Shape& s, int tokens, std::mt19937& rng) {
  std::vector<int> count(s.E, 0);
  std::vector<int> perm(s.E);
  for (int t = 0; t < tokens; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int k = 0; k < s.topk; ++k) {  // partial Fisher-Yates: topk distinct experts
      const int j = k + int(rng() % uint32_t(s.E - k));
      std::swap(perm[k], perm[j]);
      ++count[perm[k]];
    }
  }
  Routing r;
  std::vector<int> start(s.E), ids;
  int off = 0;
  for (int e = 0; e < s.E; ++e) {
    start[e] = off;
    off += count[e];
    if (count[e] > 0) ids.push_back(e);
    r.max_rows = std::max(r.max_rows, count[e]);
  }
  r.unique = int(ids.size());
  r.slots = std::min(s.E, tokens * s.topk);
  ids.resize(size_t(r.slots), -1);
  TETRA_CUDA_CHECK(cudaMalloc(&r.d_start, s.E * sizeof(int)));
  TETRA_CUDA_CHECK(cudaMalloc(&r.d_count, s.E * sizeof(int)));
  TETRA_CUDA_CHECK(cudaMalloc(&r.d_ids, ids.size() * sizeof(int)));
  TETRA_CUDA_CHECK(cudaMemcpy(r.d_start, start.data(), s.E * sizeof(int), cudaMemcpyHostToDevice));
  TETRA_CUDA_CHECK(cudaMemcpy(r.d_count, count.data(), s.E * sizeof(int), cudaMemcpyHostToDevice));
  TETRA_CUDA_CHECK(cudaMemcpy(r.d_ids, ids.data(), ids.size() * sizeof(int), cudaMemcpyHostToDevice));
  return r;
}

struct Variant {
  const char* label;
  MoeKernel kernel;
  moe_detail::DecodeConfig cfg;
  bool explicit_cfg;
  bool pdl = false;  // GEMM2 as a programmatic dependent of GEMM1: no event between them
  bool pair = false;  // both GEMMs as one launch (moe_w4a16_gemm_pair), timed together
};

struct Result {
  double g1_us, g2_us, total_us, floor_us, eff, gbs, tflops;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Returns false when an output was not finite (a broken kernel must not produce a table row).
bool bench_one(const Shape& s, int tokens, const Variant& v, int iters, Result& res, bool print) {
  if (v.pair) {  // the pair launch takes decode sizes only
    MoeGemmProblem p;
    p.num_experts = s.E, p.hidden = s.H, p.inter = s.I, p.total_rows = tokens * s.topk;
    p.num_slots = std::min(s.E, tokens * s.topk);
    if (!moe_gemm_pair_fits(p, p)) return true;
  }
  const size_t w13 = packed_weight_bytes(2 * s.I, s.H), s13 = packed_scale_bytes(2 * s.I, s.H);
  const size_t w2 = packed_weight_bytes(s.H, s.I), s2 = packed_scale_bytes(s.H, s.I);
  uint8_t *d_w13, *d_s13, *d_w2, *d_s2;
  float* d_alpha;
  TETRA_CUDA_CHECK(cudaMalloc(&d_w13, w13 * s.E));
  TETRA_CUDA_CHECK(cudaMalloc(&d_s13, s13 * s.E));
  TETRA_CUDA_CHECK(cudaMalloc(&d_w2, w2 * s.E));
  TETRA_CUDA_CHECK(cudaMalloc(&d_s2, s2 * s.E));
  TETRA_CUDA_CHECK(cudaMalloc(&d_alpha, 3 * s.E * sizeof(float)));
  fill_bytes<<<1024, 256>>>(d_w13, w13 * s.E, 1, 0, 0);
  fill_bytes<<<1024, 256>>>(d_w2, w2 * s.E, 2, 0, 0);
  fill_bytes<<<1024, 256>>>(d_s13, s13 * s.E, 3, 64, 64);  // ue5m3 codes: scales 2^-2 .. 2^5
  fill_bytes<<<1024, 256>>>(d_s2, s2 * s.E, 4, 64, 64);
  fill_f32<<<64, 256>>>(d_alpha, 3 * size_t(s.E), 1e-3f);
  TETRA_CUDA_CHECK(cudaGetLastError());
  MoeWeightsDevice w;
  w.w13 = d_w13, w.s13 = d_s13, w.w2 = d_w2, w.s2 = d_s2;
  w.alpha_gate = d_alpha, w.alpha_up = d_alpha + s.E, w.alpha_down = d_alpha + 2 * s.E;

  const int rows = tokens * s.topk;
  uint16_t *d_x, *d_act;
  float* d_y;
  TETRA_CUDA_CHECK(cudaMalloc(&d_x, size_t(rows) * s.H * 2));
  TETRA_CUDA_CHECK(cudaMalloc(&d_act, size_t(rows) * s.I * 2));
  TETRA_CUDA_CHECK(cudaMalloc(&d_y, size_t(rows) * s.H * 4));
  fill_bf16<<<1024, 256>>>(d_x, size_t(rows) * s.H, 5);
  TETRA_CUDA_CHECK(cudaGetLastError());

  std::mt19937 rng(1234 + tokens);
  const int kSets = 4;
  std::vector<Routing> R;
  for (int i = 0; i < kSets; ++i) R.push_back(make_routing(s, tokens, rng));

  uint32_t* d_done = nullptr;  // the pair launch's counters, zero between launches
  TETRA_CUDA_CHECK(cudaMalloc(&d_done, 2 * size_t(s.E) * sizeof(uint32_t)));
  TETRA_CUDA_CHECK(cudaMemset(d_done, 0, 2 * size_t(s.E) * sizeof(uint32_t)));
    cudaEvent_t ev[3];
  for (auto& e : ev) TETRA_CUDA_CHECK(cudaEventCreate(&e));
  std::vector<double> t1, t2;
  const int warm = 3;
  for (int it = 0; it < warm + iters; ++it) {
    const Routing& r = R[size_t(it % kSets)];
    MoeGemmProblem p;
    p.num_experts = s.E, p.hidden = s.H, p.inter = s.I, p.total_rows = rows, p.num_slots = r.slots;
    p.gemm2_pdl = v.pdl;
    p.x_wgmma_order = v.kernel == MoeKernel::kWgmma;  // timing only: x content does not matter
    MoeRows mr;
    mr.row_start = r.d_start, mr.row_count = r.d_count, mr.expert_ids = r.d_ids;
    const moe_detail::DecodeConfig* cfg = v.explicit_cfg ? &v.cfg : nullptr;
    TETRA_CUDA_CHECK(cudaEventRecord(ev[0]));
    if (v.pair) {
      MoeGemmProblem p2 = p;
      p2.gemm2_pdl = true;
      TETRA_CUDA_CHECK(moe_w4a16_gemm_pair(p, p2, w, mr, d_x, d_act, d_y, d_done, nullptr));
    } else {
      TETRA_CUDA_CHECK(moe_detail::gemm1_with(p, w, mr, d_x, d_act, nullptr, v.kernel, cfg));
      if (!v.pdl) TETRA_CUDA_CHECK(cudaEventRecord(ev[1]));
      TETRA_CUDA_CHECK(moe_detail::gemm2_with(p, w, mr, d_act, d_y, true, nullptr, v.kernel, cfg));
    }
    TETRA_CUDA_CHECK(cudaEventRecord(ev[2]));
    TETRA_CUDA_CHECK(cudaEventSynchronize(ev[2]));
    float a = 0, b;
    if (v.pdl || v.pair) {
      TETRA_CUDA_CHECK(cudaEventElapsedTime(&b, ev[0], ev[2]));  // both GEMMs, reported as gemm2
    } else {
      TETRA_CUDA_CHECK(cudaEventElapsedTime(&a, ev[0], ev[1]));
      TETRA_CUDA_CHECK(cudaEventElapsedTime(&b, ev[1], ev[2]));
    }
    if (it >= warm) t1.push_back(a * 1e3), t2.push_back(b * 1e3);
  }
  // Output sanity: finite values.
  std::vector<float> y(std::min<size_t>(size_t(rows) * s.H, 1 << 20));
  TETRA_CUDA_CHECK(cudaMemcpy(y.data(), d_y, y.size() * 4, cudaMemcpyDeviceToHost));
  bool finite = true;
  for (float f : y) finite = finite && std::isfinite(f);

  double unique = 0;
  for (auto& r : R) unique += r.unique;
  unique /= kSets;
  const double wbytes = unique * double(w13 + s13 + w2 + s2);
  const double abytes = double(rows) * (s.H * 2.0 + s.I * 4.0 + s.H * 4.0);
  res.g1_us = median(t1);
  res.g2_us = median(t2);
  std::vector<double> tt(t1.size());
  for (size_t i = 0; i < tt.size(); ++i) tt[i] = t1[i] + t2[i];
  res.total_us = median(tt);
  res.floor_us = (wbytes + abytes) / 4.46e12 * 1e6;
  res.eff = res.floor_us / res.total_us;
  res.gbs = (wbytes + abytes) / (res.total_us * 1e-6) / 1e9;
  res.tflops = 2.0 * rows * 3.0 * s.H * s.I / (res.total_us * 1e-6) / 1e12;
  if (print)
    std::printf("| %-11s | %5d | %-16s | %7.0f | %9.1f | %9.1f | %9.1f | %8.1f | %5.1f%% | %6.0f | %6.1f |\n",
                s.name, tokens, v.label, unique, res.g1_us, res.g2_us, res.total_us, res.floor_us,
                100.0 * res.eff, res.gbs, res.tflops);
  std::fflush(stdout);

  for (auto& r : R) cudaFree(r.d_start), cudaFree(r.d_count), cudaFree(r.d_ids);
  for (auto& e : ev) cudaEventDestroy(e);
  cudaFree(d_done);
  cudaFree(d_x), cudaFree(d_act), cudaFree(d_y);
  cudaFree(d_w13), cudaFree(d_s13), cudaFree(d_w2), cudaFree(d_s2), cudaFree(d_alpha);
  return finite;
}

TEST(BenchW4a16Moe, Table) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const bool full = std::getenv("TETRA_BENCH_FULL") != nullptr;
  const Variant variants[] = {
      {"auto", MoeKernel::kAuto, {}, false},
      {"auto+pdl", MoeKernel::kAuto, {}, false, true},
      {"classic n8 kw4", MoeKernel::kDecode, {.k_warps = 4}, true},
      {"classic n8 kw4+pdl", MoeKernel::kDecode, {.k_warps = 4}, true, true},
      {"classic n8 kw8", MoeKernel::kDecode, {.k_warps = 8}, true},
      {"late n8 kw4 u4 b4", MoeKernel::kDecode, {.late_x = true, .chunks_per_batch = 4, .min_blocks_per_sm = 4}, true},
      {"late n8 kw4 u4 b5", MoeKernel::kDecode, {.late_x = true, .chunks_per_batch = 4, .min_blocks_per_sm = 5}, true},
      {"late n8 kw4 u4 b6", MoeKernel::kDecode, {.late_x = true, .chunks_per_batch = 4, .min_blocks_per_sm = 6}, true},
      {"late n8 kw4 u2 b8+pdl", MoeKernel::kDecode, {.late_x = true, .chunks_per_batch = 2, .min_blocks_per_sm = 8}, true, true},
      {"late n8 kw4 u2 b8", MoeKernel::kDecode, {.late_x = true, .chunks_per_batch = 2, .min_blocks_per_sm = 8}, true},
      {"pair", MoeKernel::kAuto, {}, false, false, true},
      {"late n8 kw2 u8 b8", MoeKernel::kDecode, {.k_warps = 2, .late_x = true, .chunks_per_batch = 8, .min_blocks_per_sm = 8}, true},
      // Diagnostics (moe_detail::DecodeDiag): the default kernel's loads alone, without the
      // dequantize, and the loads alone with 4x the bytes in flight per SM (u8, 4 blocks/SM).
      {"diag loads only", MoeKernel::kDecode, {.late_x = true, .chunks_per_batch = 2, .min_blocks_per_sm = 8, .diag = moe_detail::kDecodeLoadsOnly}, true},
      {"diag loads only+pdl", MoeKernel::kDecode, {.late_x = true, .chunks_per_batch = 2, .min_blocks_per_sm = 8, .diag = moe_detail::kDecodeLoadsOnly}, true, true},
      {"diag loads u8 b4+pdl", MoeKernel::kDecode, {.late_x = true, .chunks_per_batch = 8, .min_blocks_per_sm = 4, .diag = moe_detail::kDecodeLoadsOnly}, true, true},
      {"diag no dequant+pdl", MoeKernel::kDecode, {.late_x = true, .chunks_per_batch = 2, .min_blocks_per_sm = 8, .diag = moe_detail::kDecodeNoDequant}, true, true},
      {"classic n16 kw4", MoeKernel::kDecode, {.token_tiles = 2, .k_warps = 4}, true},
      {"tiled 1/SM", MoeKernel::kTiled, {.tiled_blocks_per_sm = 1}, true},
      {"tiled 2/SM", MoeKernel::kTiled, {.tiled_blocks_per_sm = 2}, true},
      {"wgmma", MoeKernel::kWgmma, {}, true},
  };

  if (!full) {
    const Shape s{"smoke", 16, 512, 256, 4};
    for (const Variant& v : variants) {
      Result r;
      // A diagnostic's outputs are meaningless (it skips the math): only its timing is checked.
      EXPECT_TRUE(bench_one(s, 8, v, 3, r, false) || v.cfg.diag != 0) << v.label;
      EXPECT_GT(r.total_us, 0.0) << v.label;
      EXPECT_GT(r.floor_us, 0.0);
    }
    return;
  }
  std::printf("| shape | tokens | kernel | uniq exp | gemm1 us | gemm2 us | total us | floor us | eff | GB/s | TFLOP/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  const Shape shapes[] = {{"GLM-5", 256, 6144, 2048, 8}, {"GLM-4.5-Air", 128, 4096, 1408, 8}};
  // Optional TETRA_BENCH_TOKENS: comma-separated token counts to run (default: all).
  const char* only = std::getenv("TETRA_BENCH_TOKENS");
  auto wanted = [&](int tokens) {
    if (!only) return true;
    for (const char* p = only; *p;) {
      char* end = nullptr;
      const long v = std::strtol(p, &end, 10);
      if (end == p) break;
      if (v == tokens) return true;
      p = *end == ',' ? end + 1 : end;
    }
    return false;
  };
  for (const Shape& s : shapes)
    for (int tokens : {1, 4, 8, 16, 64, 512, 4096}) {
      if (!wanted(tokens)) continue;
      for (const Variant& v : variants) {
        // Optional TETRA_BENCH_VARIANTS: comma-separated label prefixes to run (default: all).
        if (const char* pick = std::getenv("TETRA_BENCH_VARIANTS")) {
          bool hit = false;
          for (const char* q = pick; *q;) {
            const char* end = std::strchr(q, ',');
            const size_t len = end ? size_t(end - q) : std::strlen(q);
            if (len > 0 && std::strncmp(v.label, q, len) == 0) hit = true;
            q = end ? end + 1 : q + len;
          }
          if (!hit) continue;
        }
        const bool decode = v.kernel == MoeKernel::kDecode;
        if (decode && tokens >= 512) continue;  // streams weights once per 8*NT rows: far too slow
        if (v.kernel == MoeKernel::kTiled && tokens < 512 && std::getenv("TETRA_BENCH_NO_TILED_SMALL"))
          continue;  // measured 2-3x slower than decode there (RESULTS.md)
        Result r;
        EXPECT_TRUE(bench_one(s, tokens, v, tokens >= 512 ? 5 : 20, r, true) || v.cfg.diag != 0)
            << v.label;
      }
    }
}

}  // namespace
}  // namespace tetra
