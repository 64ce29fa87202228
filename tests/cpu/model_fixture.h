// Tiny checkpoints for the model runtime tests (made once per test binary, in a temp dir), and
// step builders that do the KV-cache bookkeeping the engine would do.
#pragma once
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "model/model.h"
#include "ops/sampling/sampling.h"
#include "runtime/kv_cache.h"
#include "tools/model_writer.h"

namespace tetra::test {

// Path of a tiny checkpoint of `preset` in dtype "bf16" or "nvfp4" (seed 7), made on first use.
inline std::filesystem::path tiny_model(const std::string& preset, const std::string& dtype) {
  static TempDir root("model-tests");
  static std::map<std::string, std::filesystem::path> made;
  const std::string key = preset + "-" + dtype;
  auto it = made.find(key);
  if (it != made.end()) return it->second;
  const std::filesystem::path dir = root.path() / key;
  MakeModelOptions opt;
  opt.preset = preset;
  opt.dtype = dtype;
  opt.seed = 7;
  make_model(dir, opt);
  made[key] = dir;
  return dir;
}

inline model::OpsLimits small_limits() {
  model::OpsLimits l;
  l.max_tokens = 96;
  l.max_seqs = 4;
  l.kv_block_size = 4;  // small blocks: short prompts already span several
  l.kv_num_blocks = 128;
  l.max_blocks_per_seq = 32;
  return l;
}

// A model plus the host-side cache bookkeeping for it.
struct ModelUnderTest {
  std::unique_ptr<model::Model> model;
  std::unique_ptr<runtime::PagedKvCache> cache;

  ModelUnderTest(const std::filesystem::path& dir, model::OpsLimits lim = small_limits()) {
    model::ModelOptions o;
    o.backend = "cpu";
    o.limits = lim;
    model = model::Model::load(dir, o);
    cache = std::make_unique<runtime::PagedKvCache>(lim.kv_num_blocks, lim.kv_block_size);
  }
  int64_t vocab() const { return model->config().vocab_size; }

  // Prefills new sequences (ids) with their prompts; logits of every row: [T, vocab].
  std::vector<float> prefill(const std::vector<int64_t>& ids,
                             const std::vector<std::vector<int32_t>>& prompts) {
    model::StepBatch b;
    b.kind = model::StepKind::Prefill;
    b.cu_seqlens = {0};
    for (size_t s = 0; s < ids.size(); ++s) {
      cache->add_sequence(ids[s]);
      const std::vector<int64_t> slots = cache->append(ids[s], int(prompts[s].size()), nullptr);
      for (size_t i = 0; i < prompts[s].size(); ++i) {
        b.tokens.push_back(prompts[s][i]);
        b.positions.push_back(int32_t(i));
        b.slots.push_back(slots[i]);
        b.logit_rows.push_back(b.num_tokens() - 1);
      }
      b.cu_seqlens.push_back(b.num_tokens());
    }
    return model->forward_logits(b);
  }

  // One decode step: sequence ids[s] takes token tokens[s]; logits [S, vocab].
  std::vector<float> decode(const std::vector<int64_t>& ids, const std::vector<int32_t>& tokens) {
    model::StepBatch b;
    b.kind = model::StepKind::Decode;
    b.cu_seqlens = {0};
    b.max_blocks_per_seq = model->limits().max_blocks_per_seq;
    for (size_t s = 0; s < ids.size(); ++s) {
      const std::vector<int64_t> slot = cache->append(ids[s], 1, nullptr);
      b.tokens.push_back(tokens[s]);
      b.positions.push_back(cache->seq_len(ids[s]) - 1);
      b.slots.push_back(slot[0]);
      b.cu_seqlens.push_back(int32_t(s + 1));
      b.logit_rows.push_back(int32_t(s));
    }
    b.block_tables.resize(ids.size() * size_t(b.max_blocks_per_seq));
    b.seq_lens.resize(ids.size());
    cache->fill_block_tables(ids, b.max_blocks_per_seq, b.block_tables.data(), b.seq_lens.data());
    return model->forward_logits(b);
  }
};

// Deterministic pseudo-random prompt of n ids in [0, vocab).
inline std::vector<int32_t> test_prompt(int n, int64_t vocab, uint32_t salt) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  uint32_t x = 2463534242u ^ (salt * 2654435761u);
  for (int i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p[size_t(i)] = int32_t(x % uint32_t(vocab));
  }
  return p;
}

// Sampling params of a temperature (<= 0: greedy) and seed (0: the engine picks one).
inline ops::SamplingParams sampling(float temperature, uint64_t seed = 0) {
  ops::SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  return p;
}

// max |a - b| / max |b| over two equally long rows.
inline double rel_max_diff(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, std::fabs(double(a[i]) - double(b[i])));
    den = std::max(den, std::fabs(double(b[i])));
  }
  return den > 0 ? num / den : num;
}

}  // namespace tetra::test
