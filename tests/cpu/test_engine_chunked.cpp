// Chunked prefill on the CPU backend: a prompt prefilled in chunks of 1, 7 and 64 tokens (each
// chunk a prefill step with a cached prefix, attending to the earlier chunks' paged KV through
// ModelOps::extend_attention) gives bit-identical logits to one prefill, and the engine with a
// small prefill budget generates the same tokens as without, interleaving the long prompt's
// chunks with decode steps of the other requests.
// Why bit-identical: the CPU backend computes every op per token row in the same float order
// whatever the batch (linears, norms, MoE), and the extend attention twin walks the cached keys
// in the same order with the same float math as the one-shot prefill attention; the cache holds
// the very bf16 k/v bits the one-shot prefill reads from its buffers.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "model_fixture.h"
#include "ops/attention/attention.h"
#include "ops/attention/paged_extend_attention_cpu.h"
#include "runtime/engine.h"

namespace tetra {
namespace {

model::OpsLimits chunk_limits() {
  model::OpsLimits l;
  l.max_tokens = 128;
  l.max_seqs = 4;
  l.kv_block_size = 4;
  l.kv_num_blocks = 96;
  l.max_blocks_per_seq = 40;
  return l;
}

// Logits of every prompt row [n, vocab], prefilled `chunk` tokens at a time (chunk >= n: one
// plain prefill without block tables).
std::vector<float> chunked_logits(const std::filesystem::path& dir, const std::vector<int32_t>& prompt,
                                  int chunk) {
  test::ModelUnderTest m(dir, chunk_limits());
  const int n = int(prompt.size());
  const int64_t id = 5;
  m.cache->add_sequence(id);
  std::vector<float> all;
  for (int start = 0; start < n; start += chunk) {
    const int len = std::min(chunk, n - start);
    model::StepBatch b;
    b.kind = model::StepKind::Prefill;
    b.cu_seqlens = {0, len};
    const std::vector<int64_t> slots = m.cache->append(id, len, nullptr);
    for (int i = 0; i < len; ++i) {
      b.tokens.push_back(prompt[size_t(start + i)]);
      b.positions.push_back(start + i);
      b.slots.push_back(slots[size_t(i)]);
      b.logit_rows.push_back(i);
    }
    if (chunk < n) {  // every chunk carries the table, the first one with an empty prefix
      b.max_blocks_per_seq = chunk_limits().max_blocks_per_seq;
      b.block_tables.resize(size_t(b.max_blocks_per_seq));
      b.seq_lens.resize(1);
      m.cache->fill_block_tables({id}, b.max_blocks_per_seq, b.block_tables.data(), b.seq_lens.data());
    }
    const std::vector<float> l = m.model->forward_logits(b);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

TEST(ChunkedPrefill, ChunksGiveTheOneShotLogitsBitForBit) {
  for (const char* preset : {"tiny-glm4.5-air", "tiny-qwen3-30b-a3b", "tiny-deepseek-v3"}) {
    const auto dir = test::tiny_model(preset, "nvfp4");
    const std::vector<int32_t> prompt = test::test_prompt(101, 512, 3);
    const std::vector<float> one = chunked_logits(dir, prompt, 1000);
    ASSERT_EQ(one.size(), 101u * 512u);
    for (int chunk : {1, 7, 64}) {
      const std::vector<float> c = chunked_logits(dir, prompt, chunk);
      ASSERT_EQ(c.size(), one.size());
      EXPECT_EQ(std::memcmp(c.data(), one.data(), one.size() * sizeof(float)), 0)
          << preset << " chunk " << chunk << ": max rel diff "
          << test::rel_max_diff(c.data(), one.data(), int64_t(one.size()));
    }
  }
}

TEST(ChunkedPrefill, ExtendWithEmptyPrefixIsPrefillAttention) {
  // The CPU twins: k/v written to a shuffled paged cache, extend over it == prefill over the
  // buffers, bit for bit (GQA 6:2, two sequences of odd lengths).
  ops::AttentionShape s;
  s.n_heads = 6;
  s.n_kv_heads = 2;
  s.head_dim = 16;
  s.scale = 0.25f;
  const std::vector<int32_t> cu = {0, 13, 30};
  const int T = 30, bs = 4, mb = 8, nb = 20;
  std::vector<uint16_t> q(size_t(T) * 6 * 16), k(size_t(T) * 2 * 16), v(k.size());  // [T, heads, hd]
  uint32_t x = 1;
  auto rnd = [&] { x = x * 1664525u + 1013904223u; return float(int(x >> 9) % 2001 - 1000) / 500.0f; };
  for (auto& e : q) e = float_to_bf16(rnd());
  for (auto& e : k) e = float_to_bf16(rnd());
  for (auto& e : v) e = float_to_bf16(rnd());
  std::vector<int32_t> tables(2 * mb, -1);  // [2, mb]
  const int32_t order[] = {7, 2, 19, 0, 11, 5, 3, 16, 9, 1};
  for (int j = 0; j < 4; ++j) tables[size_t(j)] = order[j];
  for (int j = 0; j < 5; ++j) tables[size_t(mb + j)] = order[4 + j];
  std::vector<int64_t> slots(T);  // [T]
  for (int b = 0; b < 2; ++b)
    for (int t = cu[size_t(b)]; t < cu[size_t(b) + 1]; ++t) {
      const int j = t - cu[size_t(b)];
      slots[size_t(t)] = int64_t(tables[size_t(b * mb + j / bs)]) * bs + j % bs;
    }
  std::vector<uint16_t> kc(size_t(nb) * bs * 2 * 16), vc(kc.size());  // [nb, bs, n_kv, hd]
  ops::write_kv_cache_cpu(k.data(), v.data(), slots.data(), T, s, nb, bs, kc.data(), vc.data());
  const std::vector<int32_t> lens = {13, 17};
  ops::PagedKv kv{kc.data(), vc.data(), tables.data(), lens.data(), nb, bs, mb};
  std::vector<uint16_t> a(q.size()), b(q.size());
  ops::prefill_attention_cpu(q.data(), k.data(), v.data(), cu.data(), 2, s, a.data());
  ops::paged_extend_attention_cpu(q.data(), cu.data(), 2, kv, s, b.data());
  EXPECT_EQ(a, b);
  // A bad block id is refused.
  tables[2] = 99;
  EXPECT_THROW(ops::paged_extend_attention_cpu(q.data(), cu.data(), 2, kv, s, b.data()), Error);
}

TEST(ChunkedPrefill, ValidateChecksThePrefix) {
  const model::OpsLimits lim = chunk_limits();
  model::StepBatch b;
  b.kind = model::StepKind::Prefill;
  b.tokens = {1, 2, 3};
  b.positions = {5, 6, 7};
  b.slots = {5, 6, 7};
  b.cu_seqlens = {0, 3};
  b.logit_rows = {2};
  EXPECT_NO_THROW(b.validate(lim, 512));  // positions may start anywhere without a table
  b.max_blocks_per_seq = 4;
  b.block_tables = {0, 1, -1, -1};
  b.seq_lens = {8};
  EXPECT_NO_THROW(b.validate(lim, 512));
  EXPECT_TRUE(b.has_cached_prefix());
  b.seq_lens = {9};  // the new tokens would not be the last ones
  EXPECT_THROW(b.validate(lim, 512), Error);
  b.seq_lens = {2};  // fewer cached tokens than new ones
  EXPECT_THROW(b.validate(lim, 512), Error);
  b.seq_lens = {8};
  b.block_tables = {0, -1, -1, -1};  // block 1 missing
  EXPECT_THROW(b.validate(lim, 512), Error);
}

// ---- engine ----

using runtime::Engine;
using runtime::EngineOptions;

std::unique_ptr<Engine> engine(int prefill_budget) {
  EngineOptions o;
  o.max_batch = 4;
  o.max_context = 96;
  o.kv_block_size = 4;
  o.max_prefill_tokens = prefill_budget;
  o.prefix_caching = false;  // every chunk of both long prompts runs (counted below)
  return Engine::load(test::tiny_model("tiny-glm4.5-air", "nvfp4"), o);
}

ops::SamplingParams seeded(uint64_t seed) {
  ops::SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 40;
  p.seed = seed;
  return p;
}

TEST(ChunkedPrefill, EngineGeneratesTheSameTokensWithAnyBudget) {
  const std::vector<int32_t> long_prompt = test::test_prompt(70, 512, 8);
  const std::vector<int32_t> short_prompt = test::test_prompt(4, 512, 9);
  ops::SamplingParams greedy;
  greedy.temperature = 0.0f;
  auto run = [&](int budget, int64_t* chunks) {
    auto e = engine(budget);
    const int64_t a = e->add_request(short_prompt, seeded(3), 20);
    const int64_t b = e->add_request(long_prompt, greedy, 12);
    const int64_t c = e->add_request(long_prompt, seeded(11), 12);
    e->run_to_completion();
    *chunks = e->stats().prefill_chunks;
    EXPECT_EQ(e->kv_blocks_used(), 0);
    return std::vector<std::vector<int32_t>>{e->request(a).output, e->request(b).output,
                                             e->request(c).output};
  };
  int64_t chunks_full = 0;
  const auto full = run(0, &chunks_full);
  EXPECT_EQ(chunks_full, 3);
  for (int budget : {1, 7, 64}) {
    int64_t chunks = 0;
    EXPECT_EQ(run(budget, &chunks), full) << "prefill budget " << budget;
    EXPECT_GE(chunks, 1 + 2 * ((70 + budget - 1) / budget)) << "prefill budget " << budget;
  }
}

TEST(ChunkedPrefill, DecodeStepsInterleaveWithTheChunks) {
  auto e = engine(8);
  ops::SamplingParams greedy;
  greedy.temperature = 0.0f;
  const int64_t a = e->add_request(test::test_prompt(5, 512, 12), greedy, 30);
  e->step();  // a prefills and gets its first token
  const int64_t b = e->add_request(test::test_prompt(60, 512, 13), greedy, 3);
  // b needs 8 chunk steps; a decodes in each of them.
  for (int s = 0; s < 8; ++s) {
    bool a_token = false, b_token = false;
    for (const runtime::TokenEvent& ev : e->step()) {
      a_token |= ev.request == a;
      b_token |= ev.request == b;
    }
    EXPECT_TRUE(a_token) << "step " << s;
    EXPECT_EQ(b_token, s == 7) << "step " << s;  // b's first token comes with its last chunk
  }
  e->run_to_completion();
  EXPECT_EQ(e->request(b).output.size(), 3u);
}

}  // namespace
}  // namespace tetra
