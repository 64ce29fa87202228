#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <set>
#include <utility>

#include "core/error.h"
#include "format/model_config.h"

namespace tetra::runtime {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Row-wise argmax, lowest id on ties (greedy, as the sampler's temperature <= 0 path).
int32_t argmax_row(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (row[i] > row[best]) best = i;
  return int32_t(best);
}

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "";
    case FinishReason::Length: return "length";
    case FinishReason::Stop: return "stop";
    case FinishReason::Error: return "error";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "?";
}

std::unique_ptr<Engine> Engine::load(const std::filesystem::path& dir, const EngineOptions& opt) {
  if (opt.max_batch < 1) TETRA_FAIL("max_batch must be at least 1 (got ", opt.max_batch, ")");
  if (opt.max_context < 2) TETRA_FAIL("max_context must be at least 2 (got ", opt.max_context, ")");
  if (opt.kv_block_size < 1) TETRA_FAIL("kv_block_size must be at least 1");
  // Before any weight or KV cache is allocated for it: a context past the model's positions
  // would size the cache for tokens the model was never configured for.
  const ModelConfig cfg = load_model_config(dir);
  if (opt.max_context > cfg.context_limit())
    TETRA_FAIL("a context of ", opt.max_context, " tokens (prompt + generated) is over the model's ",
               cfg.context_limit(), " positions (config.json max_position_embeddings and rope scaling)");
  std::unique_ptr<Engine> e(new Engine());
  e->opt_ = opt;
  if (e->opt_.max_prefill_tokens <= 0) e->opt_.max_prefill_tokens = std::max(opt.max_context, 256);
  const int blocks_per_seq = ceil_div(opt.max_context, opt.kv_block_size);
  if (e->opt_.kv_num_blocks <= 0) e->opt_.kv_num_blocks = opt.max_batch * blocks_per_seq;
  model::ModelOptions mo;
  mo.backend = opt.backend;
  mo.limits.max_tokens = std::max(e->opt_.max_prefill_tokens, opt.max_batch);
  mo.limits.max_seqs = opt.max_batch;
  mo.limits.kv_block_size = opt.kv_block_size;
  mo.limits.kv_num_blocks = e->opt_.kv_num_blocks;
  mo.limits.max_blocks_per_seq = blocks_per_seq;
  mo.limits.moe_backend = opt.moe_backend;
  mo.tp = opt.tp;
  mo.ep = opt.ep;
  e->model_ = model::Model::load(dir, mo);
  e->cache_ = std::make_unique<PagedKvCache>(e->opt_.kv_num_blocks, opt.kv_block_size, opt.prefix_caching);
  return e;
}

int64_t Engine::add_request(std::vector<int32_t> prompt, const ops::SamplingParams& params,
                            int max_new_tokens, std::vector<int32_t> stop_ids,
                            RequestExtras extras) {
  const LogprobOptions& logprobs = extras.logprobs;
  const int64_t vocab = config().vocab_size;
  if (prompt.empty()) TETRA_FAIL("a request needs at least one prompt token");
  for (int32_t t : prompt)
    if (t < 0 || t >= vocab) TETRA_FAIL("prompt token id ", t, " is outside the vocabulary [0, ", vocab, ")");
  for (int32_t t : stop_ids)
    if (t < 0 || t >= vocab) TETRA_FAIL("stop token id ", t, " is outside the vocabulary [0, ", vocab, ")");
  if (max_new_tokens < 1) TETRA_FAIL("max_new_tokens must be at least 1 (got ", max_new_tokens, ")");
  if (int64_t(prompt.size()) + max_new_tokens > opt_.max_context)
    TETRA_FAIL("prompt (", prompt.size(), " tokens) + max_new_tokens (", max_new_tokens,
               ") exceeds the context limit ", opt_.max_context);
  if (int64_t(prompt.size()) + max_new_tokens > kv_capacity_tokens())
    TETRA_FAIL("prompt (", prompt.size(), " tokens) + max_new_tokens (", max_new_tokens,
               ") needs more KV cache than the engine has (", cache_->num_blocks(), " blocks of ",
               cache_->block_size(), " = ", kv_capacity_tokens(), " tokens): it could never run");
  ops::check_sampling_params(params, 0);
  if (logprobs.top < -1 || logprobs.top > ops::kMaxTopLogprobs)
    TETRA_FAIL("top logprobs ", logprobs.top, " must be in [-1, ", ops::kMaxTopLogprobs, "]");
  if (logprobs.prompt && logprobs.top < 0) TETRA_FAIL("prompt logprobs need top logprobs >= 0");
  if (extras.logit_bias.size() > size_t(ops::kMaxLogitBias))
    TETRA_FAIL("logit_bias has ", extras.logit_bias.size(), " entries; at most ", ops::kMaxLogitBias);
  for (const auto& [t, bias] : extras.logit_bias) {
    if (t < 0 || t >= vocab) TETRA_FAIL("logit_bias token id ", t, " is outside the vocabulary [0, ", vocab, ")");
    if (!(bias >= -100.0f && bias <= 100.0f)) TETRA_FAIL("logit_bias for token ", t, " must be in [-100, 100], got ", bias);
  }
  if (extras.min_tokens < 0 || extras.min_tokens > max_new_tokens)
    TETRA_FAIL("min_tokens ", extras.min_tokens, " must be in [0, max_new_tokens = ", max_new_tokens, "]");
  Running r;
  r.logprobs = logprobs;
  r.logit_bias = std::move(extras.logit_bias);
  r.min_tokens = extras.min_tokens;
  r.id = next_id_++;
  r.params = params;
  // Unseeded requests get distinct seeds derived from the engine seed.
  if (r.params.seed == 0) r.params.seed = opt_.seed * 0x9E3779B97F4A7C15ull + uint64_t(r.id);
  r.max_new_tokens = max_new_tokens;
  r.stop_ids = std::move(stop_ids);
  RequestState& st = requests_[r.id];
  if (logprobs.prompt) st.prompt_logprobs.resize(prompt.size() - 1);
  st.prompt = std::move(prompt);
  waiting_.push_back(std::move(r));
  return waiting_.back().id;
}

const RequestState& Engine::request(int64_t id) const {
  const auto it = requests_.find(id);
  if (it == requests_.end()) TETRA_FAIL("no request with id ", id);
  return it->second;
}

bool Engine::cancel(int64_t id) {
  auto matches = [id](const Running& r) { return r.id == id; };
  auto w = std::find_if(waiting_.begin(), waiting_.end(), matches);
  if (w != waiting_.end()) {
    waiting_.erase(w);
  } else {
    auto r = std::find_if(running_.begin(), running_.end(), matches);
    if (r == running_.end()) return false;
    running_.erase(r);
    cache_->free_sequence(id);
  }
  requests_[id].finish = FinishReason::Cancelled;
  return true;
}

void Engine::release(int64_t id) {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return;
  if (!it->second.done()) TETRA_FAIL("release: request ", id, " has not finished");
  requests_.erase(it);
}

void Engine::finish_if_done(Running& r, TokenEvent& ev) {
  RequestState& st = requests_[r.id];
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), ev.token) != r.stop_ids.end())
    st.finish = FinishReason::Stop;
  else if (int(st.output.size()) >= r.max_new_tokens)
    st.finish = FinishReason::Length;
  ev.finish = st.finish;
}

std::vector<TokenEvent> Engine::sample_and_record(const std::vector<Running*>& rows,
                                                  const std::vector<int32_t>& logit_row) {
  const int R = int(rows.size());
  std::vector<ops::SamplingParams> params(static_cast<size_t>(R));
  std::vector<int32_t> prompt_tokens, prompt_off{0}, out_tokens, out_off{0};
  std::vector<int32_t> bias_tokens, bias_off{0};
  std::vector<float> bias_values;
  for (int i = 0; i < R; ++i) {
    const Running& r = *rows[size_t(i)];
    const RequestState& st = requests_[r.id];
    params[size_t(i)] = r.params;
    params[size_t(i)].step = st.output.size();
    prompt_tokens.insert(prompt_tokens.end(), st.prompt.begin(), st.prompt.end());
    prompt_off.push_back(int32_t(prompt_tokens.size()));
    out_tokens.insert(out_tokens.end(), st.output.begin(), st.output.end());
    out_off.push_back(int32_t(out_tokens.size()));
    for (const auto& [t, bias] : logit_bias_row(r)) {
      bias_tokens.push_back(t);
      bias_values.push_back(bias);
    }
    bias_off.push_back(int32_t(bias_tokens.size()));
  }
  model::SampleBatch batch;
  batch.rows = R;
  batch.logit_rows = logit_row.empty() ? nullptr : logit_row.data();
  batch.params = params.data();
  batch.history = {prompt_tokens.data(), prompt_off.data(), out_tokens.data(), out_off.data()};
  if (!bias_tokens.empty()) batch.bias = {bias_tokens.data(), bias_values.data(), bias_off.data()};
  // Rows asking for logprobs get them with their draws, under the raw logits.
  std::vector<int32_t> logprob_top(static_cast<size_t>(R));
  std::vector<ops::PositionLogprobs> logprobs(static_cast<size_t>(R));
  bool any_logprobs = false;
  for (int i = 0; i < R; ++i) {
    logprob_top[size_t(i)] = rows[size_t(i)]->logprobs.top;
    any_logprobs = any_logprobs || logprob_top[size_t(i)] >= 0;
  }
  if (any_logprobs) batch.logprob_top = logprob_top.data(), batch.logprobs = logprobs.data();
  std::vector<int32_t> tokens(static_cast<size_t>(R));
  model_->ops().sample(batch, tokens.data());

  std::vector<TokenEvent> events(static_cast<size_t>(R));
  for (int i = 0; i < R; ++i)
    if (logprob_top[size_t(i)] >= 0 && tokens[size_t(i)] >= 0)
      events[size_t(i)].logprobs = std::move(logprobs[size_t(i)]);
  for (int i = 0; i < R; ++i) {
    Running& r = *rows[size_t(i)];
    TokenEvent& ev = events[size_t(i)];
    ev.request = r.id;
    ev.token = tokens[size_t(i)];
    RequestState& st = requests_[r.id];
    if (ev.token < 0) {  // nothing drawable (all logits NaN/-inf): end the request
      st.finish = FinishReason::Error;
      ev.finish = FinishReason::Error;
    } else {
      st.output.push_back(ev.token);
      finish_if_done(r, ev);
    }
  }
  return events;
}

std::vector<std::pair<int32_t, float>> Engine::logit_bias_row(const Running& r) const {
  std::map<int32_t, float> bias;  // token -> summed bias (a token given twice adds up)
  for (const auto& [t, b] : r.logit_bias) bias[t] += b;
  if (int(requests_.at(r.id).output.size()) < r.min_tokens)
    for (int32_t t : r.stop_ids) bias[t] = -std::numeric_limits<float>::infinity();
  return {bias.begin(), bias.end()};
}

void Engine::record_prompt_logprobs(const std::vector<PromptLogprobRows>& runs) {
  std::vector<ops::LogprobQuery> queries;
  for (const PromptLogprobRows& run : runs) {
    const RequestState& st = requests_.at(run.id);
    int top = 0;
    for (Running& r : running_)
      if (r.id == run.id) {
        top = r.logprobs.top;
        r.prompt_logprob_rows = run.first + run.count;
      }
    // Position p's logits give the logprob of prompt token p + 1.
    for (int k = 0; k < run.count; ++k) queries.push_back({run.row + k, st.prompt[size_t(run.first + k) + 1], top});
  }
  std::vector<ops::PositionLogprobs> answers(queries.size());
  model_->ops().logprobs(queries.data(), int(queries.size()), answers.data());
  size_t q = 0;
  for (const PromptLogprobRows& run : runs) {
    RequestState& st = requests_.at(run.id);
    for (int k = 0; k < run.count; ++k) st.prompt_logprobs[size_t(run.first + k)] = std::move(answers[q++]);
  }
}

int Engine::prefill_target(int64_t id) const {
  const RequestState& st = requests_.at(id);
  return int(st.prompt.size() + st.output.size());
}

std::vector<int32_t> Engine::sequence_tokens(int64_t id) const {
  const RequestState& st = requests_.at(id);
  std::vector<int32_t> out = st.prompt;
  out.insert(out.end(), st.output.begin(), st.output.end());
  return out;
}

void Engine::register_written_blocks(const std::vector<int64_t>& seqs) {
  if (!opt_.prefix_caching) return;
  for (int64_t id : seqs) cache_->register_full_blocks(id, [&](int i) { return token_at(id, i); });
}

int32_t Engine::token_at(int64_t id, int i) const {
  const RequestState& st = requests_.at(id);
  const int P = int(st.prompt.size());
  return i < P ? st.prompt[size_t(i)] : st.output[size_t(i - P)];
}

void Engine::preempt_newest() {
  Running r = std::move(running_.back());
  running_.pop_back();
  cache_->free_sequence(r.id);
  r.prefilled = false;
  waiting_.push_front(std::move(r));
  stats_.preemptions += 1;
}

bool Engine::append_or_preempt(size_t i, int n, std::vector<int64_t>* slots) {
  const int64_t id = running_[i].id;
  while (cache_->blocks_needed(id, n) > cache_->free_blocks()) {
    const bool self = running_.size() == i + 1;  // running_[i] is the newest
    preempt_newest();
    if (self) return false;
  }
  std::vector<BlockCopy> copies;
  *slots = cache_->append(id, n, &copies);
  model_->ops().copy_kv_blocks(copies);
  return true;
}

bool Engine::prefill_step(std::vector<TokenEvent>& events, std::vector<int64_t>* stepped) {
  model::StepBatch b;
  b.kind = model::StepKind::Prefill;
  b.cu_seqlens = {0};
  int budget = opt_.max_prefill_tokens;
  int logprob_budget = kPromptLogprobRowsPerStep;  // prompt-logprob rows this step may read
  bool any_prefix = false;
  std::vector<int64_t> seqs;  // [S] sequence ids of the batch
  std::vector<PromptLogprobRows> logprob_runs;
  // Prompt positions of r still without logprobs, [from, to): position p's logits give the
  // logprob of prompt token p + 1.
  auto logprob_span = [&](const Running& r) -> std::pair<int, int> {
    if (!r.logprobs.prompt) return {0, 0};
    return {r.prompt_logprob_rows, int(requests_.at(r.id).prompt.size()) - 1};
  };
  // The chunk from `start` cut so that its prompt-logprob rows fit the step's budget.
  auto cap_chunk = [&](const Running& r, int start, int chunk) {
    const auto [from, to] = logprob_span(r);
    if (from >= to || start >= to) return chunk;
    return std::min(chunk, std::max(0, from - start) + logprob_budget);
  };
  auto add_run = [&](const Running& r, int start, const std::vector<int64_t>& slots) {
    const int64_t id = r.id;
    const int n = int(slots.size());
    const auto [from, to] = logprob_span(r);
    const int first = std::max(start, from), count = std::min(start + n, to) - first;
    if (count > 0) {
      logprob_runs.push_back({id, first, count, b.num_tokens() + (first - start), 0});
      logprob_budget -= count;
    }
    for (int k = 0; k < n; ++k) {
      b.tokens.push_back(token_at(id, start + k));
      b.positions.push_back(start + k);
      b.slots.push_back(slots[size_t(k)]);
    }
    b.cu_seqlens.push_back(b.num_tokens());
    if (start > 0) any_prefix = true;
    budget -= n;
    seqs.push_back(id);
  };
  // 1. The next chunk of requests already admitted but not fully prefilled (oldest first).
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    if (running_[i].prefilled) continue;
    const int64_t id = running_[i].id;
    const int done = cache_->seq_len(id);
    const int chunk = cap_chunk(running_[i], done, std::min(prefill_target(id) - done, budget));
    if (chunk == 0) continue;  // its prompt logprobs wait for the next step's budget
    std::vector<int64_t> slots;
    if (!append_or_preempt(i, chunk, &slots)) break;  // it was the newest: nothing newer runs
    add_run(running_[i], done, slots);
  }
  // 2. Admissions from the front of the queue: a batch slot and blocks for the first chunk,
  //    plus one block of headroom for decode unless nothing else is running.
  //    Whole blocks of its tokens already cached are taken as they are (prefix caching): not the
  //    last token, whose logits it needs, nor with prompt logprobs, which need every row. A
  //    request whose next blocks an admission of this step is about to write waits one step and
  //    takes them from the cache then (n samples of a prompt, prompts sharing a system prompt).
  struct Admitted {
    std::vector<int32_t> tokens;
    int written = 0;  // its tokens this step's forward leaves in the cache
  };
  std::vector<Admitted> admitted;  // this step's admissions (prefix caching)
  while (!waiting_.empty() && int(running_.size()) < opt_.max_batch && budget > 0) {
    const int64_t id = waiting_.front().id;
    const int target = prefill_target(id);
    std::vector<int32_t> tokens;
    PrefixHit hit;
    if (opt_.prefix_caching && !waiting_.front().logprobs.prompt) {
      tokens = sequence_tokens(id);
      hit = cache_->find_prefix(tokens, target - 1);
      int pending = 0;  // tokens of whole blocks that this step's admissions will have cached
      for (const Admitted& a : admitted) {
        const int limit = std::min(a.written, target - 1);
        int common = 0;
        while (common < limit && a.tokens[size_t(common)] == tokens[size_t(common)]) ++common;
        pending = std::max(pending, common / opt_.kv_block_size * opt_.kv_block_size);
      }
      if (pending > hit.tokens) break;
    }
    const int chunk = cap_chunk(waiting_.front(), hit.tokens, std::min(target - hit.tokens, budget));
    if (chunk == 0) break;  // prompt logprobs over budget: admitted next step
    const int need = hit.unheld + ceil_div(chunk, opt_.kv_block_size) + (running_.empty() ? 0 : 1);
    if (need > cache_->free_blocks()) break;
    Running r = std::move(waiting_.front());
    waiting_.pop_front();
    r.admitted = next_admission_++;
    cache_->add_sequence_with_prefix(id, tokens, hit);
    stats_.prefix_cached_tokens += hit.tokens;
    running_.push_back(std::move(r));
    std::vector<int64_t> slots;
    const bool ok = append_or_preempt(running_.size() - 1, chunk, &slots);
    TETRA_CHECK(ok, "engine: admission of request ", id, " found fewer free blocks than counted");
    add_run(running_.back(), hit.tokens, slots);
    if (!tokens.empty()) admitted.push_back({std::move(tokens), hit.tokens + chunk});
  }
  if (seqs.empty()) return false;
  // Logit rows, ascending: a run's prompt-logprob positions, then, for a sequence that reached
  // its target, its last row (it samples the next token).
  std::vector<Running*> rows;
  std::vector<int32_t> sample_rows;  // [rows] their logit rows
  auto next_logprob_run = logprob_runs.begin();
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t id = seqs[s];
    if (next_logprob_run != logprob_runs.end() && next_logprob_run->id == id) {
      next_logprob_run->row = b.num_logit_rows();
      for (int k = 0; k < next_logprob_run->count; ++k) b.logit_rows.push_back(next_logprob_run->token + k);
      ++next_logprob_run;
    }
    if (cache_->seq_len(id) < prefill_target(id)) continue;
    sample_rows.push_back(b.num_logit_rows());
    b.logit_rows.push_back(b.cu_seqlens[s + 1] - 1);
    for (Running& r : running_)
      if (r.id == id) rows.push_back(&r);
  }
  if (any_prefix) {
    b.max_blocks_per_seq = ceil_div(opt_.max_context, opt_.kv_block_size);
    b.block_tables.resize(seqs.size() * size_t(b.max_blocks_per_seq));
    b.seq_lens.resize(seqs.size());
    cache_->fill_block_tables(seqs, b.max_blocks_per_seq, b.block_tables.data(), b.seq_lens.data());
  }
  const auto t0 = std::chrono::steady_clock::now();
  model_->forward(b);
  register_written_blocks(seqs);
  std::vector<TokenEvent> sampled;
  if (!logprob_runs.empty()) record_prompt_logprobs(logprob_runs);
  if (!rows.empty()) sampled = sample_and_record(rows, sample_rows);
  stats_.prefill_seconds += seconds_since(t0);
  stats_.prefill_tokens += b.num_tokens();
  stats_.prefill_chunks += int64_t(seqs.size());
  for (Running* r : rows) r->prefilled = true;
  events.insert(events.end(), sampled.begin(), sampled.end());
  stepped->insert(stepped->end(), seqs.begin(), seqs.end());
  return true;
}

bool Engine::decode_step(std::vector<TokenEvent>& events, const std::vector<int64_t>& skip) {
  model::StepBatch b;
  b.kind = model::StepKind::Decode;
  b.cu_seqlens = {0};
  b.max_blocks_per_seq = ceil_div(opt_.max_context, opt_.kv_block_size);
  std::vector<int64_t> seqs;
  for (size_t i = 0; i < running_.size(); ++i) {
    const Running& r = running_[i];
    if (!r.prefilled || std::find(skip.begin(), skip.end(), r.id) != skip.end()) continue;
    const int64_t id = r.id;
    std::vector<int64_t> slot;
    if (!append_or_preempt(i, 1, &slot)) break;  // it was the newest: nothing after it is left
    b.tokens.push_back(requests_[id].output.back());
    b.positions.push_back(cache_->seq_len(id) - 1);
    b.slots.push_back(slot[0]);
    b.cu_seqlens.push_back(b.num_tokens());
    b.logit_rows.push_back(b.num_tokens() - 1);
    seqs.push_back(id);
  }
  if (seqs.empty()) return false;
  // Pointers only now: preemption above pops running_'s tail.
  std::vector<Running*> rows;
  for (int64_t id : seqs)
    for (Running& r : running_)
      if (r.id == id) rows.push_back(&r);
  b.block_tables.resize(seqs.size() * size_t(b.max_blocks_per_seq));
  b.seq_lens.resize(seqs.size());
  cache_->fill_block_tables(seqs, b.max_blocks_per_seq, b.block_tables.data(), b.seq_lens.data());
  const auto t0 = std::chrono::steady_clock::now();
  model_->forward(b);
  register_written_blocks(seqs);
  std::vector<TokenEvent> sampled = sample_and_record(rows);
  stats_.decode_seconds += seconds_since(t0);
  stats_.decode_steps += 1;
  stats_.decode_tokens += b.num_tokens();
  events.insert(events.end(), sampled.begin(), sampled.end());
  return true;
}

void Engine::retire_finished() {
  for (auto it = running_.begin(); it != running_.end();) {
    if (requests_[it->id].done()) {
      cache_->free_sequence(it->id);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<TokenEvent> Engine::step() {
  std::vector<TokenEvent> events;
  std::vector<int64_t> prefilled_now;
  bool ran = prefill_step(events, &prefilled_now);
  retire_finished();
  // Decode only the requests that were not in this step's prefill.
  ran = decode_step(events, prefilled_now) || ran;
  retire_finished();
  if (!ran && !waiting_.empty() && running_.empty())
    TETRA_FAIL("the next request does not fit the KV cache even alone (",
               prefill_target(waiting_.front().id), " tokens, ", cache_->free_blocks(), " free blocks of ",
               opt_.kv_block_size, ")");
  return events;
}

void Engine::run_to_completion() {
  while (has_work()) step();
}

std::vector<std::vector<float>> Engine::score(const std::vector<std::vector<int32_t>>& prompts,
                                              int decode_steps,
                                              std::vector<std::vector<int32_t>>* generated) {
  if (!running_.empty() || !waiting_.empty())
    TETRA_FAIL("score() needs an idle engine (requests are queued or running)");
  if (prompts.empty()) return {};
  if (int(prompts.size()) > opt_.max_batch)
    TETRA_FAIL("score: ", prompts.size(), " prompts exceed max_batch ", opt_.max_batch);
  if (decode_steps < 0) TETRA_FAIL("decode_steps must be >= 0");
  const int64_t V = config().vocab_size;
  const int S = int(prompts.size());
  // Internal sequence ids are negative so they never meet request ids.
  auto seq_id = [](int s) { return -1 - int64_t(s); };
  std::vector<std::vector<float>> out(static_cast<size_t>(S));
  std::vector<std::vector<int32_t>> gen(static_cast<size_t>(S));
  model::StepBatch b;
  b.kind = model::StepKind::Prefill;
  b.cu_seqlens = {0};
  try {
    for (int s = 0; s < S; ++s) {
      const std::vector<int32_t>& p = prompts[size_t(s)];
      if (p.empty()) TETRA_FAIL("score: prompt ", s, " is empty");
      if (int(p.size()) + decode_steps > opt_.max_context)
        TETRA_FAIL("score: prompt ", s, " (", p.size(), " tokens) + ", decode_steps,
                   " decode steps exceeds the context limit ", opt_.max_context);
      cache_->add_sequence(seq_id(s));
      const std::vector<int64_t> slots = cache_->append(seq_id(s), int(p.size()), nullptr);
      for (size_t i = 0; i < p.size(); ++i) {
        b.tokens.push_back(p[i]);
        b.positions.push_back(int32_t(i));
        b.slots.push_back(slots[i]);
        b.logit_rows.push_back(b.num_tokens() - 1);
      }
      b.cu_seqlens.push_back(b.num_tokens());
    }
    const std::vector<float> logits = model_->forward_logits(b);  // [T, V]
    for (int s = 0; s < S; ++s) {
      const size_t r0 = size_t(b.cu_seqlens[size_t(s)]), r1 = size_t(b.cu_seqlens[size_t(s) + 1]);
      out[size_t(s)].assign(logits.begin() + r0 * V, logits.begin() + r1 * V);
      gen[size_t(s)].push_back(argmax_row(logits.data() + (r1 - 1) * V, V));
    }
    for (int step = 0; step < decode_steps; ++step) {
      model::StepBatch d;
      d.kind = model::StepKind::Decode;
      d.cu_seqlens = {0};
      d.max_blocks_per_seq = ceil_div(opt_.max_context, opt_.kv_block_size);
      std::vector<int64_t> seqs;
      for (int s = 0; s < S; ++s) {
        const std::vector<int64_t> slot = cache_->append(seq_id(s), 1, nullptr);
        d.tokens.push_back(gen[size_t(s)].back());
        d.positions.push_back(cache_->seq_len(seq_id(s)) - 1);
        d.slots.push_back(slot[0]);
        d.cu_seqlens.push_back(s + 1);
        d.logit_rows.push_back(s);
        seqs.push_back(seq_id(s));
      }
      d.block_tables.resize(size_t(S) * size_t(d.max_blocks_per_seq));
      d.seq_lens.resize(size_t(S));
      cache_->fill_block_tables(seqs, d.max_blocks_per_seq, d.block_tables.data(), d.seq_lens.data());
      const std::vector<float> dl = model_->forward_logits(d);  // [S, V]
      for (int s = 0; s < S; ++s) {
        const float* row = dl.data() + size_t(s) * V;
        out[size_t(s)].insert(out[size_t(s)].end(), row, row + V);
        gen[size_t(s)].push_back(argmax_row(row, V));
      }
    }
  } catch (...) {
    for (int s = 0; s < S; ++s)
      if (cache_->has_sequence(seq_id(s))) cache_->free_sequence(seq_id(s));
    throw;
  }
  for (int s = 0; s < S; ++s) {
    cache_->free_sequence(seq_id(s));
    gen[size_t(s)].pop_back();  // the last argmax was never fed back
  }
  if (generated) *generated = std::move(gen);
  return out;
}

}  // namespace tetra::runtime
