// A minimal parallel-for over [0, n) in contiguous chunks: enough for per-tensor CPU work.
#pragma once
#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace tetra {

inline int hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

// Calls fn(begin, end) on up to `threads` workers; rethrows the first exception.
template <typename Fn>
void parallel_for(int64_t n, int64_t min_chunk, Fn&& fn, int threads = hardware_threads()) {
  if (n <= 0) return;
  const int64_t workers = std::clamp<int64_t>(n / std::max<int64_t>(min_chunk, 1), 1, threads);
  if (workers == 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(workers);
  const int64_t chunk = (n + workers - 1) / workers;
  for (int64_t w = 0; w < workers; ++w) {
    const int64_t begin = w * chunk, end = std::min(n, begin + chunk);
    if (begin >= end) break;
    pool.emplace_back([&, w, begin, end] {
      try {
        fn(begin, end);
      } catch (...) {
        errors[w] = std::current_exception();
      }
    });
  }
  for (auto& t : pool) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace tetra
