// A parallel-for over [0, n) in contiguous chunks, run on a pool of persistent worker threads
// (started on first use): enough for per-tensor CPU work. Starting threads on every call cost
// the CPU backend more than its math at decode sizes (two thread starts and joins per op).
#pragma once
#include <algorithm>
#include <cstdint>
#include <thread>

namespace tetra {

inline int hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

namespace detail {

// A non-owning reference to a callable taking a chunk index: what the pool runs.
class ChunkFn {
 public:
  ChunkFn() = default;
  template <typename F>
  explicit ChunkFn(F& f) : obj_(&f), call_([](void* o, int w) { (*static_cast<F*>(o))(w); }) {}
  void operator()(int w) const { call_(obj_, w); }

 private:
  void* obj_ = nullptr;
  void (*call_)(void*, int) = nullptr;
};

// Runs body(w) for every w in [0, count) and returns when all have run: w = 0 on the calling
// thread, w >= 1 on pool worker (w - 1) % workers, so a chunk index lands on the same thread
// from call to call (the pages a chunk first touched stay with the thread that reads them).
// Every chunk runs even if some throw; then the lowest w's exception is rethrown. Calls made
// from inside a chunk, in a forked child or on a one-thread machine run all w inline, in order.
void run_chunks(int count, ChunkFn body);

}  // namespace detail

// Calls fn(begin, end) on up to `threads` chunks of at least min_chunk indices (the calling
// thread takes the first); rethrows the first chunk's exception. The chunks depend only on n,
// min_chunk and threads, never on which thread runs them. fn must not wait for another thread
// that may itself be in parallel_for: calls from several threads queue on the same workers.
template <typename Fn>
void parallel_for(int64_t n, int64_t min_chunk, Fn&& fn, int threads = hardware_threads()) {
  if (n <= 0) return;
  const int64_t workers = std::clamp<int64_t>(n / std::max<int64_t>(min_chunk, 1), 1, threads);
  if (workers == 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t chunk = (n + workers - 1) / workers;
  auto body = [&](int w) {
    const int64_t begin = w * chunk, end = std::min(n, begin + chunk);
    if (begin < end) fn(begin, end);
  };
  detail::run_chunks(int(workers), detail::ChunkFn(body));
}

}  // namespace tetra
