#include "dist/rank_workers.h"

#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "core/error.h"

namespace tetra::dist {

RankWorkers::RankWorkers(int ranks, std::vector<int> devices) : devices_(std::move(devices)) {
  TETRA_CHECK(ranks >= 1, "rank workers need at least one rank");
  TETRA_CHECK(devices_.empty() || int(devices_.size()) == ranks, "rank workers: ", ranks,
              " ranks but ", devices_.size(), " devices");
  errors_.resize(size_t(ranks));
  for (int r = 0; r < ranks; ++r) threads_.emplace_back([this, r] { loop(r); });
}

RankWorkers::~RankWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankWorkers::loop(int rank) {
  std::exception_ptr setup_error;
  if (!devices_.empty()) {
    const cudaError_t e = cudaSetDevice(devices_[size_t(rank)]);
    if (e != cudaSuccess)
      setup_error = std::make_exception_ptr(
          Error(str("rank ", rank, ": cudaSetDevice(", devices_[size_t(rank)], "): ",
                    cudaGetErrorString(e))));
  }
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (only_ >= 0 && only_ != rank) continue;
      job = job_;
    }
    std::exception_ptr err = setup_error;
    if (!err) {
      try {
        (*job)(rank);
      } catch (...) {
        err = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      errors_[size_t(rank)] = err;
      if (--pending_ == 0) done_.notify_all();
    }
  }
}

void RankWorkers::run_all(const std::function<void(int rank)>& fn) {
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  only_ = -1;
  pending_ = size();
  for (auto& e : errors_) e = nullptr;
  ++generation_;
  wake_.notify_all();
  done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
  for (const std::exception_ptr& e : errors_)
    if (e) std::rethrow_exception(e);
}

void RankWorkers::run_one(int r, const std::function<void()>& fn) {
  TETRA_CHECK(r >= 0 && r < size(), "rank ", r, " of ", size());
  const std::function<void(int)> job = [&](int) { fn(); };
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &job;
  only_ = r;
  pending_ = 1;
  errors_[size_t(r)] = nullptr;
  ++generation_;
  wake_.notify_all();
  done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
  if (errors_[size_t(r)]) std::rethrow_exception(errors_[size_t(r)]);
}

}  // namespace tetra::dist
