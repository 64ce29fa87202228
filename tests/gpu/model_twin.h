// Shared by the model-level gpu tests: tiny random checkpoints written like `tetra make-model`,
// and a twin runner that feeds identical steps to several ModelOps backends with one host-side
// KV-cache bookkeeping (the engine's job), so their logits can be compared row by row.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "format/checkpoint.h"
#include "format/model_layout.h"
#include "format/presets.h"
#include "model/model.h"
#include "model/model_ops.h"
#include "runtime/kv_cache.h"
#include "tools/checkpoint_writer.h"
#include "tools/model_writer.h"
#include "tools/tensor_source.h"

namespace tetra::model::test_twin {

namespace fs = std::filesystem;

// A checkpoint of the model `cfg` (called `name`) in dtype "bf16" or "nvfp4" from random weights
// of `seed`, made once per process under the temp dir (tag names the test binary's folder).
inline fs::path checkpoint_of(const std::string& tag, const std::string& name,
                              const ModelConfig& cfg, const std::string& dtype, uint64_t seed) {
  static std::map<std::string, fs::path> made;
  const std::string key = tag + "/" + name + "-" + dtype;
  if (auto it = made.find(key); it != made.end()) return it->second;
  const fs::path dir = fs::temp_directory_path() /
                       ("tetra-" + tag + "-" + std::to_string(::getpid())) / (name + "-" + dtype);
  const bool quantized = dtype == "nvfp4";
  const ModelLayout layout = model_layout(cfg);
  RandomSource source(layout, cfg.num_layers, DType::BF16, seed);
  std::unique_ptr<WeightQuantizer> quantizer;
  if (quantized) quantizer = make_weight_quantizer("auto");
  WriteOptions wopt;
  wopt.quantizer = quantizer.get();
  wopt.progress = false;
  fs::create_directories(dir);
  const WriteResult result = write_checkpoint_tensors(source, layout, wopt, dir);
  write_model_configs(dir, model_config_to_json(cfg), result, {}, quantized);
  made[key] = dir;
  return dir;
}

// The same for a tiny preset.
inline fs::path tiny_checkpoint(const std::string& tag, const std::string& preset,
                                const std::string& dtype, uint64_t seed) {
  return checkpoint_of(tag, preset, preset_config(preset), dtype, seed);
}

inline OpsLimits twin_limits(const std::string& moe_backend = "auto") {
  OpsLimits l;
  l.max_tokens = 64;
  l.max_seqs = 8;
  l.kv_block_size = 4;
  l.kv_num_blocks = 160;
  l.max_blocks_per_seq = 20;
  l.moe_backend = moe_backend;
  return l;
}

inline std::vector<int32_t> prompt(int n, int64_t vocab, std::mt19937& rng) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = int32_t(rng() % uint64_t(vocab));
  return p;
}

inline int argmax(const float* r, int64_t n) { return int(std::max_element(r, r + n) - r); }

// Backends fed identical steps; one host-side cache bookkeeping for all of them.
struct Twin {
  Checkpoint ckpt;
  ModelWeights w;
  OpsLimits lim;
  std::vector<std::unique_ptr<ModelOps>> ops;
  runtime::PagedKvCache cache;

  explicit Twin(const fs::path& dir, OpsLimits l = twin_limits())
      : ckpt(Checkpoint::open(dir)), w(ModelWeights::load(ckpt)), lim(l),
        cache(l.kv_num_blocks, l.kv_block_size) {}
  void add(std::unique_ptr<ModelOps> o) {
    o->prepare(w, lim);
    ops.push_back(std::move(o));
  }
  int64_t vocab() const { return w.config.vocab_size; }

  // Runs the step on every backend; logits per backend [R, vocab].
  std::vector<std::vector<float>> run(const StepBatch& b) {
    b.validate(lim, vocab());
    std::vector<std::vector<float>> out;
    for (auto& o : ops) {
      run_forward(*o, w, b);
      out.emplace_back(size_t(b.num_logit_rows()) * size_t(vocab()));
      o->read_logits(out.back().data());
    }
    return out;
  }
  // New sequences with their whole prompts; logits of every row.
  StepBatch prefill(const std::vector<int64_t>& ids, const std::vector<std::vector<int32_t>>& p) {
    StepBatch b;
    b.kind = StepKind::Prefill;
    b.cu_seqlens = {0};
    for (size_t s = 0; s < ids.size(); ++s) {
      cache.add_sequence(ids[s]);
      const std::vector<int64_t> slots = cache.append(ids[s], int(p[s].size()), nullptr);
      for (size_t i = 0; i < p[s].size(); ++i) {
        b.tokens.push_back(p[s][i]);
        b.positions.push_back(int32_t(i));
        b.slots.push_back(slots[i]);
        b.logit_rows.push_back(b.num_tokens() - 1);
      }
      b.cu_seqlens.push_back(b.num_tokens());
    }
    return b;
  }
  // Chunked prefill: tokens [start, start + chunk) of each prompt that has them, attending to
  // the earlier chunks through the cache (block tables and seq_lens: a cached-prefix prefill).
  StepBatch prefill_chunk(const std::vector<int64_t>& ids,
                          const std::vector<std::vector<int32_t>>& p, int start, int chunk) {
    StepBatch b;
    b.kind = StepKind::Prefill;
    b.cu_seqlens = {0};
    b.max_blocks_per_seq = lim.max_blocks_per_seq;
    std::vector<int64_t> in_step;
    for (size_t s = 0; s < ids.size(); ++s) {
      const int len = std::min(chunk, int(p[s].size()) - start);
      if (len <= 0) continue;
      if (start == 0) cache.add_sequence(ids[s]);
      in_step.push_back(ids[s]);
      const std::vector<int64_t> slots = cache.append(ids[s], len, nullptr);
      for (int i = 0; i < len; ++i) {
        b.tokens.push_back(p[s][size_t(start + i)]);
        b.positions.push_back(start + i);
        b.slots.push_back(slots[size_t(i)]);
        b.logit_rows.push_back(b.num_tokens() - 1);
      }
      b.cu_seqlens.push_back(b.num_tokens());
    }
    b.block_tables.resize(in_step.size() * size_t(b.max_blocks_per_seq));
    b.seq_lens.resize(in_step.size());
    cache.fill_block_tables(in_step, b.max_blocks_per_seq, b.block_tables.data(), b.seq_lens.data());
    return b;
  }
  StepBatch decode(const std::vector<int64_t>& ids, const std::vector<int32_t>& tokens) {
    StepBatch b;
    b.kind = StepKind::Decode;
    b.cu_seqlens = {0};
    b.max_blocks_per_seq = lim.max_blocks_per_seq;
    for (size_t s = 0; s < ids.size(); ++s) {
      const std::vector<int64_t> slot = cache.append(ids[s], 1, nullptr);
      b.tokens.push_back(tokens[s]);
      b.positions.push_back(cache.seq_len(ids[s]) - 1);
      b.slots.push_back(slot[0]);
      b.cu_seqlens.push_back(int32_t(s + 1));
      b.logit_rows.push_back(int32_t(s));
    }
    b.block_tables.resize(ids.size() * size_t(b.max_blocks_per_seq));
    b.seq_lens.resize(ids.size());
    cache.fill_block_tables(ids, b.max_blocks_per_seq, b.block_tables.data(), b.seq_lens.data());
    return b;
  }
};

}  // namespace tetra::model::test_twin
