// The worker pool behind parallel_for (see parallel.h).
#include "core/parallel.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

namespace tetra::detail {
namespace {

thread_local bool t_in_chunk = false;  // this thread runs a chunk: nested calls run inline

// One call's chunks: how many the workers still hold, and each chunk's exception.
struct Batch {
  explicit Batch(int count) : left(count - 1), errors(static_cast<size_t>(count)) {}
  std::mutex m;
  std::condition_variable done;
  int left;                                // chunks 1.. not finished yet
  std::vector<std::exception_ptr> errors;  // [count]
};

struct Job {
  ChunkFn body;
  int w = 0;
  Batch* batch = nullptr;
};

void run_chunk(ChunkFn body, int w, std::exception_ptr& error) {
  const bool outer = t_in_chunk;  // inline runs of a nested call keep the enclosing chunk's mark
  t_in_chunk = true;
  try {
    body(w);
  } catch (...) {
    error = std::current_exception();
  }
  t_in_chunk = outer;
}

void rethrow_first(const std::vector<std::exception_ptr>& errors) {
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

class Pool {
 public:
  explicit Pool(int workers) : owner_(getpid()) {
    for (int i = 0; i < workers; ++i) workers_.push_back(std::make_unique<Worker>());
    for (auto& k : workers_) k->thread = std::thread([this, p = k.get()] { serve(*p); });
  }
  ~Pool() {
    for (auto& k : workers_) {
      {
        std::lock_guard<std::mutex> lock(k->m);
        k->stop = true;
      }
      k->cv.notify_one();
    }
    for (auto& k : workers_) k->thread.join();
  }

  // A forked child has the pool's memory but not its threads.
  bool usable() const { return !workers_.empty() && getpid() == owner_; }

  void run(int count, ChunkFn body) {
    Batch batch(count);
    for (int w = 1; w < count; ++w) {
      Worker& k = *workers_[size_t(w - 1) % workers_.size()];
      {
        std::lock_guard<std::mutex> lock(k.m);
        k.jobs.push_back({body, w, &batch});
      }
      k.cv.notify_one();
    }
    run_chunk(body, 0, batch.errors[0]);
    {
      std::unique_lock<std::mutex> lock(batch.m);
      batch.done.wait(lock, [&] { return batch.left == 0; });
    }
    rethrow_first(batch.errors);
  }

 private:
  struct Worker {
    std::thread thread;
    std::mutex m;
    std::condition_variable cv;
    std::deque<Job> jobs;  // FIFO: calls from several threads queue up
    bool stop = false;
  };

  static void serve(Worker& k) {
    // Asynchronous signals (SIGINT, SIGTERM, ...) go to the application's threads, whichever
    // mask the thread that started the pool had: `tetra serve` waits for them with sigwait.
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(k.m);
        k.cv.wait(lock, [&] { return k.stop || !k.jobs.empty(); });
        if (k.jobs.empty()) return;  // stop, nothing left
        job = k.jobs.front();
        k.jobs.pop_front();
      }
      run_chunk(job.body, job.w, job.batch->errors[size_t(job.w)]);
      // Notified under the lock: the caller cannot see left == 0 and destroy the batch before
      // this thread is done with it.
      std::lock_guard<std::mutex> lock(job.batch->m);
      if (--job.batch->left == 0) job.batch->done.notify_one();
    }
  }

  pid_t owner_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

Pool& pool() {
  static Pool p(hardware_threads() - 1);
  return p;
}

}  // namespace

void run_chunks(int count, ChunkFn body) {
  if (count <= 0) return;
  if (count > 1 && !t_in_chunk) {
    Pool& p = pool();
    if (p.usable()) return p.run(count, body);
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(count));  // [count]
  for (int w = 0; w < count; ++w) run_chunk(body, w, errors[size_t(w)]);
  rethrow_first(errors);
}

}  // namespace tetra::detail
