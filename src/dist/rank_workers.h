// Persistent worker threads, one per rank: the thread of rank r keeps devices[r] current for
// its whole life (so CUDA state such as a stream capture in thread-local mode stays on it).
// run_all hands every rank the same job and waits for all; the first exception is rethrown.
// A CPU-only group (no devices) gives plain threads.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tetra::dist {

class RankWorkers {
 public:
  // `ranks` threads; devices empty (CPU) or one device id per rank (cudaSetDevice once).
  RankWorkers(int ranks, std::vector<int> devices);
  ~RankWorkers();
  RankWorkers(const RankWorkers&) = delete;
  RankWorkers& operator=(const RankWorkers&) = delete;

  int size() const { return int(threads_.size()); }
  // fn(rank) on every rank's thread, concurrently; returns when all are done.
  void run_all(const std::function<void(int rank)>& fn);
  // fn() on rank r's thread only.
  void run_one(int r, const std::function<void()>& fn);

 private:
  void loop(int rank);

  std::vector<int> devices_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  int only_ = -1;           // -1: every rank runs the job; else only this rank
  uint64_t generation_ = 0;  // bumped per job
  int pending_ = 0;          // ranks still running the current job
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;  // [ranks]
  std::vector<std::thread> threads_;
};

}  // namespace tetra::dist
