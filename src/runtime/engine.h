// The generation engine: requests in, streamed tokens out. Each step() runs one prefill batch
// (up to max_prefill_tokens tokens: first the next chunks of requests whose prompt is longer
// than the budget, then waiting requests admitted from the front of the queue while there are
// batch slots and KV blocks for their first chunk plus one), then one decode step for every
// running request that did not take part in that prefill: a long prompt's chunks alternate
// with decode steps of the others. Later chunks attend to the earlier chunks' paged KV.
// KV blocks are taken on demand (admission takes only the first chunk's blocks, decode a block
// whenever a sequence crosses a block edge). When the pool runs out, the newest running
// request is preempted by recompute: its blocks are freed and it goes back to the front of the
// queue; when readmitted, its prompt plus the tokens it generated so far are prefilled again
// and generation continues with the same sampler stream (the seed stream is indexed by output
// position), so its output is the same as an uninterrupted run.
// With prefix caching, an admitted request starts holding the cached KV blocks that match its
// first tokens and prefills only the rest (runtime/kv_cache.h); every step registers the full
// blocks it wrote.
// Sampling is per request (ops/sampling/sampling.h); the KV cache is paged
// (runtime/kv_cache.h bookkeeping, storage in the backend).
#pragma once
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/model.h"
#include "ops/sampling/logprobs.h"
#include "ops/sampling/sampling.h"
#include "runtime/kv_cache.h"

namespace tetra::runtime {

struct EngineOptions {
  std::string backend = "cpu";        // "cpu", "cuda", "auto" (model/model_ops.h registry)
  std::string moe_backend = "auto";   // MoE runner for the backend
  int max_batch = 8;                  // running sequences at once
  int max_context = 2048;             // prompt + generated tokens per sequence
  int max_prefill_tokens = 0;         // tokens per prefill step (longer prompts are chunked);
                                      // 0: max(max_context, 256)
  int kv_block_size = 16;
  int kv_num_blocks = 0;              // 0: enough for max_batch full contexts
  uint64_t seed = 0;                  // seeds requests that give none (seed 0 in SamplingParams)
  bool prefix_caching = true;         // reuse cached KV blocks of equal prefixes (runtime/kv_cache.h)
  int tp = 1, ep = 1;                 // tensor / expert parallel GPUs (model/model.h)
};

enum class FinishReason { None, Length, Stop, Error, Cancelled };
// "", "length", "stop", "error", "cancelled"
const char* finish_reason_name(FinishReason r);

// The logprobs a request asks for (ops/sampling/logprobs.h: the model's raw distribution).
struct LogprobOptions {
  int top = -1;         // -1: none; 0..ops::kMaxTopLogprobs: each generated token's logprob and
                        // the `top` most likely tokens at its position
  bool prompt = false;  // the same for every prompt token after the first (needs top >= 0)
};

// What a request asks for beyond its sampling params and stop ids.
struct RequestExtras {
  LogprobOptions logprobs;
  // (token, bias) added to the raw logits before sampling (OpenAI's logit_bias; bias in
  // [-100, 100], -100 in effect bans the token). Logprobs stay those of the raw logits.
  std::vector<std::pair<int32_t, float>> logit_bias;
  int min_tokens = 0;  // the stop ids are not drawn before this many tokens (vLLM's min_tokens)
};

// Prompt rows whose logits one prefill step reads back for prompt logprobs: at most this many
// rows of [vocab] f32 go to the host per step (a long prompt's rows come over several steps).
constexpr int kPromptLogprobRowsPerStep = 256;

// One generated token of one request, in the order step() produced them.
struct TokenEvent {
  int64_t request = 0;
  int32_t token = 0;
  FinishReason finish = FinishReason::None;  // set on the request's last token
  std::optional<ops::PositionLogprobs> logprobs;  // when the request asked (LogprobOptions::top)
};

struct RequestState {
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;  // generated tokens so far
  // [prompt - 1]: prompt tokens 1.. under the logits before them (LogprobOptions::prompt);
  // complete by the request's first token event.
  std::vector<ops::PositionLogprobs> prompt_logprobs;
  FinishReason finish = FinishReason::None;
  bool done() const { return finish != FinishReason::None; }
};

struct EngineStats {
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0;
  int64_t decode_steps = 0;
  int64_t decode_tokens = 0;  // tokens produced by decode steps (sum of their batch sizes)
  double decode_seconds = 0;
  int64_t prefill_chunks = 0;  // sequence runs prefilled (a prompt cut in 3 chunks counts 3)
  int64_t preemptions = 0;     // requests preempted (KV freed, recomputed later)
  int64_t prefix_cached_tokens = 0;  // admitted tokens whose KV came from the prefix cache
  double prefill_tokens_per_s() const { return prefill_seconds > 0 ? prefill_tokens / prefill_seconds : 0; }
  double decode_ms_per_step() const { return decode_steps ? 1e3 * decode_seconds / decode_steps : 0; }
};

class Engine {
 public:
  // Loads the checkpoint at `dir` on the chosen backend. Throws tetra::Error for bad input and
  // unsupported architectures (MLA: GLM-5, DeepSeek-V3).
  static std::unique_ptr<Engine> load(const std::filesystem::path& dir, const EngineOptions& opt);

  const ModelConfig& config() const { return model_->config(); }
  const EngineOptions& options() const { return opt_; }
  std::string backend_name() { return model_->ops().name(); }

  // Queues a request; returns its id. Prompt ids must be in [0, vocab), the prompt non-empty,
  // prompt + max_new_tokens <= max_context, and that many tokens must fit the whole KV cache
  // (else tetra::Error: a request that could never run alone is refused, not queued forever). Generation stops after
  // max_new_tokens (finish "length") or when a token in stop_ids is produced (finish "stop";
  // the stop token is reported). `extras`: the logprobs each token event (and the request's
  // state, for the prompt) carries, token biases and a minimum length; out-of-range values
  // (see RequestExtras, min_tokens > max_new_tokens) are errors. Biases, minimum lengths and
  // logprobs all run where the logits are (the backend's sampler and logprobs ops).
  int64_t add_request(std::vector<int32_t> prompt, const ops::SamplingParams& params,
                      int max_new_tokens, std::vector<int32_t> stop_ids = {},
                      RequestExtras extras = {});

  // One scheduling step (a prefill batch and/or one decode step); the tokens it produced.
  std::vector<TokenEvent> step();
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  // Runs step() until every request is done.
  void run_to_completion();

  const RequestState& request(int64_t id) const;
  const EngineStats& stats() const { return stats_; }

  // Ends a queued or running request at once (finish "cancelled") and frees its KV blocks; a
  // request already done or unknown is left as it is. Returns whether it was cancelled.
  bool cancel(int64_t id);
  // Forgets a finished request's state (prompt, output); a server calls it once the client has
  // everything, so the request map does not grow forever. Unfinished requests are an error.
  void release(int64_t id);
  int num_waiting() const { return int(waiting_.size()); }
  int num_running() const { return int(running_.size()); }
  // KV cache blocks held by sequences, and all blocks: used / total is the KV usage.
  int kv_blocks_used() const { return cache_->num_blocks() - cache_->free_blocks(); }
  int kv_blocks_total() const { return cache_->num_blocks(); }
  // Tokens the whole KV cache holds: the most prompt + max_new_tokens a request may ask for.
  int64_t kv_capacity_tokens() const { return int64_t(cache_->num_blocks()) * cache_->block_size(); }

  // Test/reference hook: logits of every prompt position plus `decode_steps` greedy decode
  // steps, for each prompt (prefilled together as one batch, decoded together).
  // Returns per prompt [len + decode_steps, vocab] f32 row-major, and in *generated (if not
  // null) per prompt the decode_steps tokens fed back (argmax of the row before). Needs an
  // idle engine (no running requests); leaves the cache empty.
  std::vector<std::vector<float>> score(const std::vector<std::vector<int32_t>>& prompts,
                                        int decode_steps,
                                        std::vector<std::vector<int32_t>>* generated = nullptr);

 private:
  struct Running {
    int64_t id = 0;
    ops::SamplingParams params;
    int max_new_tokens = 0;
    std::vector<int32_t> stop_ids;
    int64_t admitted = 0;    // admission counter: the largest is the newest (preempted first)
    bool prefilled = false;  // its prompt (+ output, after a preemption) is in the cache
    LogprobOptions logprobs;
    int prompt_logprob_rows = 0;  // prompt positions whose logits were read (of prompt - 1)
    std::vector<std::pair<int32_t, float>> logit_bias;
    int min_tokens = 0;
  };
  // Logit rows of one prefill step that belong to a prompt's logprobs: positions
  // [first, first + count) of request `id`, whose first is the step's token `token`, at logit
  // rows [row, row + count).
  struct PromptLogprobRows {
    int64_t id = 0;
    int first = 0, count = 0, token = 0, row = 0;
  };
  Engine() = default;
  // Prefill step: chunks of running requests, then admissions. Appends the prefilled ids to
  // *stepped; whether a forward ran.
  bool prefill_step(std::vector<TokenEvent>& events, std::vector<int64_t>* stepped);
  // Decode step of the prefilled running requests not in `skip`; whether a forward ran.
  bool decode_step(std::vector<TokenEvent>& events, const std::vector<int64_t>& skip);
  // Samples one token for each of `rows` (rows[i] from the step's logit row logit_row[i]; empty:
  // row i) on the backend, with logprobs where asked, and records it.
  std::vector<TokenEvent> sample_and_record(const std::vector<Running*>& rows,
                                            const std::vector<int32_t>& logit_row = {});
  // A row's logit biases this step, ascending ids: its logit_bias, and -inf on its stop ids
  // until min_tokens are out.
  std::vector<std::pair<int32_t, float>> logit_bias_row(const Running& r) const;
  // Fills the prompt logprobs of `runs` from the step's logits.
  void record_prompt_logprobs(const std::vector<PromptLogprobRows>& runs);
  void finish_if_done(Running& r, TokenEvent& ev);
  // Tokens a (re)prefill covers: prompt + output so far. Token i of that sequence.
  int prefill_target(int64_t id) const;
  int32_t token_at(int64_t id, int i) const;
  std::vector<int32_t> sequence_tokens(int64_t id) const;  // prompt + output so far
  // Prefix caching: registers the full KV blocks this step's forward wrote for `seqs`.
  void register_written_blocks(const std::vector<int64_t>& seqs);
  // Frees the newest running request's blocks and puts it at the front of the queue.
  void preempt_newest();
  // Appends n slots to running_[i]'s sequence, preempting newer requests while the pool is
  // short; false when running_[i] itself had to go (then nothing was appended).
  bool append_or_preempt(size_t i, int n, std::vector<int64_t>* slots);
  void retire_finished();

  EngineOptions opt_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<PagedKvCache> cache_;
  int64_t next_id_ = 1;
  int64_t next_admission_ = 1;
  std::deque<Running> waiting_;   // front: admitted first (preempted requests go here)
  std::vector<Running> running_;  // in admission order
  std::map<int64_t, RequestState> requests_;
  EngineStats stats_;
};

}  // namespace tetra::runtime
