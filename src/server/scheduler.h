// The serving loop: one thread owns the Engine and calls step() while there is work; HTTP
// threads submit requests and read their tokens through a RequestStream. New requests join the
// running batch between steps (continuous batching). A stream whose client went away is
// cancelled: the loop ends it in the engine, which frees its KV blocks at once.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "server/metrics.h"
#include "server/profiler.h"

namespace tetra::server {

class Scheduler;

// What a stream got since the last wait().
struct StreamUpdate {
  std::vector<int32_t> tokens;
  std::vector<ops::PositionLogprobs> logprobs;  // [tokens] when the request asked for them
  // [prompt - 1] prompt tokens 1.. (LogprobOptions::prompt): in the update with the first token
  std::vector<ops::PositionLogprobs> prompt_logprobs;
  runtime::FinishReason finish = runtime::FinishReason::None;
  std::string error;  // set when finish is Error
  bool done() const { return finish != runtime::FinishReason::None; }
};

// Rung when any of a group's streams gets tokens or its finish: a handler serving several
// choices waits on one bell instead of on each stream.
class StreamBell {
 public:
  void ring();
  // Blocks until the bell has rung more than `seen` times or `timeout` passes; the ring count.
  uint64_t wait(uint64_t seen, std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t rings_ = 0;
};

class RequestStream {
 public:
  // What arrived since the last poll (empty if nothing did): the caller waits on its StreamBell.
  StreamUpdate poll();
  // Asks the loop to end this request (client gone, stop string seen). Safe to call twice.
  void cancel();
  int prompt_tokens() const { return prompt_tokens_; }

 private:
  friend class Scheduler;
  Scheduler* owner_ = nullptr;
  int64_t engine_id_ = 0;
  int prompt_tokens_ = 0;
  std::vector<int32_t> prompt_;
  ops::SamplingParams params_;
  runtime::RequestExtras extras_;
  std::shared_ptr<StreamBell> bell_;  // rung on every update
  int max_new_tokens_ = 0;
  std::vector<int32_t> stop_ids_;
  std::chrono::steady_clock::time_point arrived_, last_token_;
  int generated_ = 0;
  std::atomic<bool> cancel_requested_{false};
  std::mutex mu_;
  StreamUpdate pending_;  // filled by the loop, drained by poll()
  bool finished_ = false;
};

struct SchedulerOptions {
  int max_queued = 256;  // requests waiting for their prefill; more get 429
};

class Scheduler {
 public:
  Scheduler(std::unique_ptr<runtime::Engine> engine, SchedulerOptions opt, Metrics& metrics, Profiler& profiler);
  ~Scheduler();  // stops the loop; unfinished streams end with an error
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. ApiError 429 when the queue is full, 400 when it cannot fit the context
  // (or the whole KV cache) or names a token outside the vocabulary (prompt, stop ids,
  // logit_bias), or min_tokens is over max_new_tokens. `bell` rings whenever the stream gets
  // something (one bell may serve several streams).
  std::shared_ptr<RequestStream> submit(std::vector<int32_t> prompt, const ops::SamplingParams& params,
                                        int max_new_tokens, std::vector<int32_t> stop_ids,
                                        runtime::RequestExtras extras,
                                        std::shared_ptr<StreamBell> bell);
  // Immutable engine facts, safe from any thread.
  int max_context() const { return max_context_; }
  int64_t vocab_size() const { return vocab_size_; }
  const ModelConfig& config() const { return config_; }
  std::string backend_name() const { return backend_name_; }

 private:
  friend class RequestStream;
  void wake();
  void loop();
  void admit(std::vector<std::shared_ptr<RequestStream>>& fresh);
  void process_cancellations();
  void run_step();
  void finish(const std::shared_ptr<RequestStream>& s, runtime::FinishReason why, const std::string& error = "");
  void publish_gauges();

  std::unique_ptr<runtime::Engine> engine_;  // touched only by the loop thread
  SchedulerOptions opt_;
  Metrics& metrics_;
  Profiler& profiler_;
  ModelConfig config_;
  int max_context_ = 0;
  int64_t kv_capacity_tokens_ = 0;  // the whole KV cache: no request may need more
  int64_t vocab_size_ = 0;
  std::string backend_name_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<RequestStream>> submitted_;  // not yet given to the engine
  bool wake_flag_ = false;
  bool stop_ = false;
  std::atomic<int> engine_waiting_{0};
  std::map<int64_t, std::shared_ptr<RequestStream>> active_;  // by engine id (loop thread only)
  std::thread thread_;
};

}  // namespace tetra::server
