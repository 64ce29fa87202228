// parallel_for on its worker pool: every index exactly once in the documented chunks, a chunk
// index on the same thread from call to call (chunk 0 on the caller), every chunk run and the
// first one's exception rethrown, nested calls, calls from several threads at once, and a forked
// child (which has the pool's memory but not its threads).
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/parallel.h"

namespace tetra {
namespace {

// The chunks parallel_for promises: workers = clamp(n / min_chunk, 1, threads), equal ceil
// sizes, the last one short.
std::vector<std::pair<int64_t, int64_t>> expected_chunks(int64_t n, int64_t min_chunk, int threads) {
  const int64_t workers = std::clamp<int64_t>(n / std::max<int64_t>(min_chunk, 1), 1, threads);
  const int64_t chunk = (n + workers - 1) / workers;
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t b = 0; b < n; b += chunk) out.push_back({b, std::min(n, b + chunk)});
  return out;
}

TEST(ParallelFor, EveryIndexOnceInTheDocumentedChunks) {
  for (int64_t n : {1, 2, 3, 7, 64, 1000, 4097})
    for (int64_t min_chunk : {1, 3, 64, 5000})
      for (int threads : {1, 2, 3, 8, 33}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::mutex m;
        std::set<std::pair<int64_t, int64_t>> chunks;
        parallel_for(n, min_chunk, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
          std::lock_guard<std::mutex> lock(m);
          chunks.insert({b, e});
        }, threads);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << n << " " << i;
        const auto want = expected_chunks(n, min_chunk, threads);
        const std::set<std::pair<int64_t, int64_t>> want_set(want.begin(), want.end());
        EXPECT_EQ(chunks, want_set)
            << "n " << n << " min_chunk " << min_chunk << " threads " << threads;
      }
  int calls = 0;
  parallel_for(0, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ParallelFor, AChunkRunsOnTheSameThreadEachCallAndChunkZeroOnTheCaller) {
  const int threads = 4;
  auto owners = [&] {
    std::vector<std::thread::id> who(threads);
    parallel_for(threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) who[size_t(t)] = std::this_thread::get_id();
    }, threads);
    return who;
  };
  const auto first = owners();
  EXPECT_EQ(first[0], std::this_thread::get_id());
  for (int call = 0; call < 5; ++call) EXPECT_EQ(owners(), first);
  if (hardware_threads() >= threads) {  // one chunk per thread: all distinct
    EXPECT_EQ(std::set<std::thread::id>(first.begin(), first.end()).size(), size_t(threads));
  }
}

// Workers block asynchronous signals, so SIGTERM reaches the thread that waits for it (tetra
// serve's sigwait) even when the pool was started by a thread with them unblocked.
TEST(ParallelFor, WorkersBlockAsynchronousSignals) {
  if (hardware_threads() < 2) GTEST_SKIP() << "one thread: no workers";
  std::vector<int> blocked(2, -1);
  parallel_for(2, 1, [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) {
      sigset_t mask;
      pthread_sigmask(SIG_BLOCK, nullptr, &mask);
      blocked[size_t(w)] = sigismember(&mask, SIGTERM) + 2 * sigismember(&mask, SIGINT);
    }
  }, 2);
  EXPECT_EQ(blocked[1], 3);  // chunk 1: a worker
  EXPECT_EQ(blocked[0], 0);  // chunk 0: this thread, unchanged
}

TEST(ParallelFor, EveryChunkRunsAndTheFirstChunksErrorIsRethrown) {
  std::atomic<int> ran{0};
  try {
    parallel_for(8, 1, [&](int64_t b, int64_t) {
      ++ran;
      if (b == 3 || b == 5) throw std::runtime_error("chunk " + std::to_string(b));
    }, 8);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "chunk 3");
  }
  EXPECT_EQ(ran.load(), 8);
  // The pool still serves calls.
  std::atomic<int64_t> sum{0};
  parallel_for(100, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

TEST(ParallelFor, NestedCallsAndCallsFromSeveralThreads) {
  std::atomic<int64_t> sum{0};
  parallel_for(6, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      parallel_for(10, 1, [&](int64_t b2, int64_t e2) {
        for (int64_t j = b2; j < e2; ++j) sum += i * 10 + j;
      });
  }, 6);
  EXPECT_EQ(sum.load(), 59 * 60 / 2);

  std::vector<int64_t> totals(6, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < 6; ++c)
    callers.emplace_back([&, c] {
      for (int rep = 0; rep < 200; ++rep) {
        std::atomic<int64_t> s{0};
        parallel_for(1000, 10, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) s += i;
        });
        totals[size_t(c)] += s.load();
      }
    });
  for (auto& t : callers) t.join();
  for (int64_t t : totals) EXPECT_EQ(t, 200 * int64_t(999 * 1000 / 2));
}

TEST(ParallelFor, AForkedChildRunsItsChunksItself) {
  parallel_for(16, 1, [](int64_t, int64_t) {});  // the pool exists before the fork
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::atomic<int64_t> sum{0};
    parallel_for(16, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum += i;
    }, 16);
    _exit(sum.load() == 120 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace tetra
