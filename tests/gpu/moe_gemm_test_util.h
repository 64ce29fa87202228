// Shared pieces of the grouped MoE GEMM gpu tests (test_w4a4_moe, test_bf16_moe): guarded device
// buffers, row mappings for both layouts, a parallel row loop for the CPU twins, and the
// comparison (NMSE over owned rows, NaN/Inf count, poison kept everywhere else).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda_check.h"
#include "core/half.h"
#include "ops/moe/w4a16_moe.h"

namespace tetra::moe_test {

// Parallel loop over rows (the GPU machine has 16 cores; the CPU twins are the slow part).
template <typename F>
void parallel_rows(int rows, F f) {
  const int nt = int(std::max(1u, std::min(16u, std::thread::hardware_concurrency())));
  std::vector<std::thread> th;
  for (int t = 0; t < nt; ++t)
    th.emplace_back([&, t] {
      for (int r = t; r < rows; r += nt) f(r);
    });
  for (auto& x : th) x.join();
}

inline std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(d(rng));
  return v;
}

template <typename T>
struct DevBuf {  // device buffer with kGuard poisoned (0xff bytes) elements either side
  static constexpr size_t kGuard = 64;
  T* base = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t n_) : n(std::max<size_t>(n_, 1)) {
    TETRA_CUDA_CHECK(cudaMalloc(&base, (n + 2 * kGuard) * sizeof(T)));
    poison();
  }
  ~DevBuf() { cudaFree(base); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  T* ptr() { return base + kGuard; }
  void poison() { TETRA_CUDA_CHECK(cudaMemset(base, 0xff, (n + 2 * kGuard) * sizeof(T))); }
  void upload(const std::vector<T>& v) {
    TETRA_CUDA_CHECK(cudaMemcpy(ptr(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download_all() {  // guards included
    std::vector<T> v(n + 2 * kGuard);
    TETRA_CUDA_CHECK(cudaMemcpy(v.data(), base, v.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};

// Row mapping of one test case on the host, plus its device copies.
struct RowMap {
  int total = 0;                  // rows of the grouped buffers
  std::vector<int> start, count;  // [E]
  std::vector<int> expert_of;     // [total] owning expert, -1 for masked gaps
  std::vector<int> slot_ids;      // active experts shuffled, padded with -1 (empty: no slots)
  std::vector<int> gather;        // [total] source row of x (empty: identity)
  int x_rows = 0;                 // rows of x
};

// masked: row_start[e] = e * (max_m + 2) (gaps of unowned rows); else contiguous offsets.
inline RowMap make_row_map(const std::vector<int>& counts, bool masked, bool slots, bool gather,
                           std::mt19937& rng) {
  RowMap m;
  const int E = int(counts.size());
  m.count = counts;
  m.start.resize(size_t(E));
  const int max_m = *std::max_element(counts.begin(), counts.end());
  for (int e = 0; e < E; ++e) {
    m.start[size_t(e)] = masked ? e * (max_m + 2) : m.total;
    m.total = masked ? (e + 1) * (max_m + 2) : m.total + counts[size_t(e)];
  }
  m.expert_of.assign(size_t(m.total), -1);
  for (int e = 0; e < E; ++e)
    for (int r = 0; r < counts[size_t(e)]; ++r) m.expert_of[size_t(m.start[size_t(e)] + r)] = e;
  if (slots) {
    for (int e = 0; e < E; ++e)
      if (counts[size_t(e)] > 0) m.slot_ids.push_back(e);
    std::shuffle(m.slot_ids.begin(), m.slot_ids.end(), rng);
    m.slot_ids.push_back(-1);
    m.slot_ids.push_back(-1);
  }
  m.x_rows = gather ? m.total + 5 : m.total;
  if (gather) {
    m.gather.resize(size_t(m.total));
    for (auto& g : m.gather) g = int(rng() % uint32_t(m.x_rows));
  }
  return m;
}

struct DevRowMap {
  DevBuf<int> start, count, slots, gather;
  explicit DevRowMap(const RowMap& m)
      : start(m.start.size()), count(m.count.size()), slots(m.slot_ids.size()),
        gather(m.gather.size()) {
    start.upload(m.start);
    count.upload(m.count);
    if (!m.slot_ids.empty()) slots.upload(m.slot_ids);
    if (!m.gather.empty()) gather.upload(m.gather);
  }
  MoeRows rows(const RowMap& m) {
    MoeRows r;
    r.row_start = start.ptr();
    r.row_count = count.ptr();
    r.expert_ids = m.slot_ids.empty() ? nullptr : slots.ptr();
    r.gather = m.gather.empty() ? nullptr : gather.ptr();
    return r;
  }
};

inline MoeGemmProblem make_problem(const RowMap& m, int E, int H, int I) {
  MoeGemmProblem p;
  p.num_experts = E;
  p.hidden = H;
  p.inter = I;
  p.total_rows = m.total;
  p.num_slots = int(m.slot_ids.size());
  return p;
}

struct Stats {
  double nmse = 0;
  size_t bad = 0;          // NaN/Inf among the outputs that must be written
  size_t poison_lost = 0;  // written elements outside the owned rows (guards included)
};

inline float value_of(uint16_t v) { return bf16_to_float(v); }
inline float value_of(float v) { return v; }
inline bool poisoned(uint16_t v) { return v == 0xffff; }
inline bool poisoned(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u == 0xffffffffu;
}

// all: a download_all() of a [rows, cols] buffer; ref: [rows, cols] (read on owned rows only).
// NMSE = sum (a - b)^2 / sum b^2 over the owned rows.
template <typename T>
Stats compare(const std::vector<T>& all, int rows, int cols, const std::vector<int>& expert_of,
              const std::vector<float>& ref) {
  constexpr size_t guard = DevBuf<T>::kGuard;
  Stats s;
  double num = 0, den = 0;
  for (size_t i = 0; i < guard; ++i) {
    s.poison_lost += !poisoned(all[i]);
    s.poison_lost += !poisoned(all[all.size() - 1 - i]);
  }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const T v = all[guard + size_t(r) * cols + c];
      if (expert_of[size_t(r)] < 0) {
        s.poison_lost += !poisoned(v);
        continue;
      }
      const float f = value_of(v);
      if (!std::isfinite(f)) {
        ++s.bad;
        continue;
      }
      const double b = ref[size_t(r) * cols + c];
      num += (double(f) - b) * (double(f) - b);
      den += b * b;
    }
  s.nmse = den > 0 ? num / den : (num > 0 ? 1.0 : 0.0);
  return s;
}

}  // namespace tetra::moe_test
