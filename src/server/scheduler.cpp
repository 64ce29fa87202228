#include "server/scheduler.h"

#include "core/error.h"
#include "server/api_error.h"

namespace tetra::server {
namespace {

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

void StreamBell::ring() {
  {
    std::lock_guard<std::mutex> l(mu_);
    ++rings_;
  }
  cv_.notify_all();
}

uint64_t StreamBell::wait(uint64_t seen, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, timeout, [&] { return rings_ != seen; });
  return rings_;
}

StreamUpdate RequestStream::poll() {
  std::lock_guard<std::mutex> l(mu_);
  StreamUpdate out = std::move(pending_);
  pending_ = StreamUpdate{};
  if (out.done()) pending_.finish = out.finish;  // later polls keep reporting the finish
  if (out.done()) pending_.error = out.error;
  return out;
}

void RequestStream::cancel() {
  if (cancel_requested_.exchange(true)) return;
  if (owner_) owner_->wake();
}

Scheduler::Scheduler(std::unique_ptr<runtime::Engine> engine, SchedulerOptions opt, Metrics& metrics,
                     Profiler& profiler)
    : engine_(std::move(engine)), opt_(opt), metrics_(metrics), profiler_(profiler) {
  config_ = engine_->config();
  max_context_ = engine_->options().max_context;
  kv_capacity_tokens_ = engine_->kv_capacity_tokens();
  vocab_size_ = engine_->config().vocab_size;
  backend_name_ = engine_->backend_name();
  publish_gauges();
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Scheduler::wake() {
  {
    std::lock_guard<std::mutex> l(mu_);
    wake_flag_ = true;
  }
  cv_.notify_all();
}

std::shared_ptr<RequestStream> Scheduler::submit(std::vector<int32_t> prompt, const ops::SamplingParams& params,
                                                 int max_new_tokens, std::vector<int32_t> stop_ids,
                                                 runtime::RequestExtras extras,
                                                 std::shared_ptr<StreamBell> bell) {
  if (prompt.empty()) throw ApiError(400, "the prompt is empty");
  for (int32_t t : prompt)
    if (t < 0 || t >= vocab_size_)
      throw ApiError(400, str("token id ", t, " is outside the vocabulary [0, ", vocab_size_, ")"));
  for (int32_t t : stop_ids)
    if (t < 0 || t >= vocab_size_)
      throw ApiError(400, str("stop token id ", t, " is outside the vocabulary [0, ", vocab_size_, ")"));
  if (int64_t(prompt.size()) >= max_context_)
    throw ApiError(400, str("the prompt has ", prompt.size(), " tokens; the context limit is ", max_context_,
                            " (prompt + max_tokens)"), "context_length_exceeded");
  if (int64_t(prompt.size()) + max_new_tokens > max_context_)
    throw ApiError(400, str("max_tokens ", max_new_tokens, " + prompt ", prompt.size(), " tokens exceeds the context limit ",
                            max_context_, "; ask for at most ", max_context_ - int64_t(prompt.size())), "context_length_exceeded");
  if (int64_t(prompt.size()) + max_new_tokens > kv_capacity_tokens_)
    throw ApiError(400, str("max_tokens ", max_new_tokens, " + prompt ", prompt.size(), " tokens needs more KV cache than ",
                            "the server has (", kv_capacity_tokens_, " tokens); ask for at most ",
                            std::max<int64_t>(0, kv_capacity_tokens_ - int64_t(prompt.size()))),
                   "context_length_exceeded");
  for (const auto& [t, bias] : extras.logit_bias)
    if (t < 0 || t >= vocab_size_)
      throw ApiError(400, str("logit_bias token id ", t, " is outside the vocabulary [0, ", vocab_size_, ")"));
  if (extras.min_tokens > max_new_tokens)
    throw ApiError(400, str("min_tokens ", extras.min_tokens, " is over max_tokens ", max_new_tokens));
  try {
    ops::check_sampling_params(params, 0);
  } catch (const Error& e) {
    throw ApiError(400, e.what());
  }
  TETRA_CHECK(bell != nullptr, "Scheduler::submit: a stream needs a bell");
  auto s = std::make_shared<RequestStream>();
  s->owner_ = this;
  s->prompt_tokens_ = int(prompt.size());
  s->prompt_ = std::move(prompt);
  s->params_ = params;
  s->extras_ = std::move(extras);
  s->bell_ = std::move(bell);
  s->max_new_tokens_ = max_new_tokens;
  s->stop_ids_ = std::move(stop_ids);
  s->arrived_ = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) throw ApiError(503, "the server is shutting down");
    if (int(submitted_.size()) + engine_waiting_ >= opt_.max_queued)
      throw ApiError(429, str("the queue is full (", opt_.max_queued, " requests waiting); retry later"));
    submitted_.push_back(s);
  }
  cv_.notify_all();
  return s;
}

void Scheduler::finish(const std::shared_ptr<RequestStream>& s, runtime::FinishReason why, const std::string& error) {
  // Record first: once the stream hears of its finish the client may read metrics or the trace.
  const auto now = std::chrono::steady_clock::now();
  metrics_.request_finished(runtime::finish_reason_name(why), seconds(now - s->arrived_));
  if (profiler_.active())
    profiler_.async_end("request", s->engine_id_, profiler_.now_us(),
                        {{"finish", runtime::finish_reason_name(why)}, {"generated", s->generated_}});
  {
    std::lock_guard<std::mutex> l(s->mu_);
    s->pending_.finish = why;
    s->pending_.error = error;
    s->finished_ = true;
  }
  s->bell_->ring();
}

void Scheduler::admit(std::vector<std::shared_ptr<RequestStream>>& fresh) {
  for (auto& s : fresh) {
    if (s->cancel_requested_) {
      finish(s, runtime::FinishReason::Cancelled);
      continue;
    }
    try {
      s->engine_id_ = engine_->add_request(std::move(s->prompt_), s->params_, s->max_new_tokens_, s->stop_ids_,
                                           s->extras_);
    } catch (const std::exception& e) {
      finish(s, runtime::FinishReason::Error, e.what());
      continue;
    }
    metrics_.add_prompt_tokens(s->prompt_tokens_);
    if (profiler_.active())
      profiler_.async_begin("request", s->engine_id_, profiler_.now_us(),
                            {{"prompt_tokens", s->prompt_tokens_}, {"max_tokens", s->max_new_tokens_}});
    active_[s->engine_id_] = s;
  }
}

void Scheduler::process_cancellations() {
  for (auto it = active_.begin(); it != active_.end();) {
    if (it->second->cancel_requested_) {
      engine_->cancel(it->first);
      engine_->release(it->first);
      finish(it->second, runtime::FinishReason::Cancelled);
      it = active_.erase(it);
    } else {
      ++it;
    }
  }
}

void Scheduler::run_step() {
  const runtime::EngineStats before = engine_->stats();
  const int waiting = engine_->num_waiting(), running = engine_->num_running();
  const double t0 = profiler_.now_us();
  std::vector<runtime::TokenEvent> events;
  try {
    events = engine_->step();
  } catch (const std::exception& e) {
    // The engine could not step: end every request (cancel frees their KV blocks).
    for (auto& [id, s] : active_) {
      try {  // a step that threw half-way may leave a request in neither queue: never let that escape
        engine_->cancel(id);
        engine_->release(id);
      } catch (const std::exception&) {
      }
      finish(s, runtime::FinishReason::Error, str("engine step failed: ", e.what()));
    }
    active_.clear();
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (profiler_.active()) {
    const runtime::EngineStats& after = engine_->stats();
    const double t1 = profiler_.now_us();
    const double pre_us = (after.prefill_seconds - before.prefill_seconds) * 1e6;
    const double dec_us = (after.decode_seconds - before.decode_seconds) * 1e6;
    profiler_.complete("engine.step", "step", t0, t1 - t0, 1,
                       {{"waiting_before", waiting}, {"running_before", running}, {"tokens_out", events.size()}});
    if (pre_us > 0)
      profiler_.complete("prefill", "phase", t0, pre_us, 1, {{"tokens", after.prefill_tokens - before.prefill_tokens}});
    if (dec_us > 0)
      profiler_.complete("decode", "phase", t0 + pre_us, dec_us, 1, {{"batch", after.decode_tokens - before.decode_tokens}});
  }
  metrics_.add_generated_tokens(int64_t(events.size()));
  for (const runtime::TokenEvent& ev : events) {
    auto it = active_.find(ev.request);
    if (it == active_.end()) continue;
    RequestStream& s = *it->second;
    if (s.generated_ == 0) metrics_.observe_ttft(seconds(now - s.arrived_));
    else metrics_.observe_itl(seconds(now - s.last_token_));
    s.last_token_ = now;
    ++s.generated_;
    if (ev.finish != runtime::FinishReason::Error) {
      std::lock_guard<std::mutex> l(s.mu_);
      s.pending_.tokens.push_back(ev.token);
      if (ev.logprobs) s.pending_.logprobs.push_back(*ev.logprobs);
      if (s.generated_ == 1 && s.extras_.logprobs.prompt)  // complete once the first token is out
        s.pending_.prompt_logprobs = engine_->request(ev.request).prompt_logprobs;
    }
    s.bell_->ring();
    if (ev.finish != runtime::FinishReason::None) {
      engine_->release(ev.request);
      finish(it->second, ev.finish, ev.finish == runtime::FinishReason::Error ? "no token could be sampled (all logits NaN or -inf)" : "");
      active_.erase(it);
    }
  }
}

void Scheduler::publish_gauges() {
  SchedulerGauges g;
  g.waiting = engine_->num_waiting();
  g.running = engine_->num_running();
  g.kv_blocks_used = engine_->kv_blocks_used();
  g.kv_blocks_total = engine_->kv_blocks_total();
  g.preemptions = engine_->stats().preemptions;
  g.prefill_chunks = engine_->stats().prefill_chunks;
  g.prefix_cached_tokens = engine_->stats().prefix_cached_tokens;
  engine_waiting_ = g.waiting;
  metrics_.set_gauges(g);
}

void Scheduler::loop() {
  for (;;) {
    std::vector<std::shared_ptr<RequestStream>> fresh;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || wake_flag_ || !submitted_.empty() || engine_->has_work(); });
      if (stop_) break;
      wake_flag_ = false;
      fresh.swap(submitted_);
      // Counted as waiting until the engine has them, so the queue limit sees them.
      engine_waiting_ = engine_->num_waiting() + int(fresh.size());
    }
    admit(fresh);
    process_cancellations();
    if (engine_->has_work()) run_step();
    publish_gauges();
  }
  std::lock_guard<std::mutex> l(mu_);
  for (auto& s : submitted_) finish(s, runtime::FinishReason::Error, "the server shut down");
  for (auto& [id, s] : active_) {
    engine_->cancel(id);
    finish(s, runtime::FinishReason::Error, "the server shut down");
  }
  active_.clear();
  publish_gauges();
}

}  // namespace tetra::server
