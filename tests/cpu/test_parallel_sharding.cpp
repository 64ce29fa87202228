// Tensor / expert parallel sharding without GPUs: the tiny checkpoints run on the cpu backend
// split over N ranks (one thread each, all-reduce = float32 sum in rank order rounded to bf16 once, like the
// GPU one-shot kernel) must give the logits of the unsplit model, through Model::load's tp path.
//
// Bound: relative L2 error of each logits row <= 2e-2 for at least 95% of the rows, median row
// <= 1e-2, worst <= 0.5 (the rule test_model_cuda uses for CPU vs CUDA). Why the split differs at
// all: each rank rounds its partial o_proj / down output to bf16 before the sum (one extra bf16
// rounding of each partial, ~2^-9 relative), and routing may flip on near-ties. A wrong slice
// (a head, a column block, a scale block, a bias added twice, a replica or an expert counted on
// two ranks) breaks every row by O(1).
// Also checked directly: the column blocks cut from o_proj / down_proj (NVFP4 codes and scales,
// BF16 values) are the parent's columns, and rank_config divides heads and widths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>

#include "format/checkpoint.h"
#include "format/presets.h"
#include "model/model.h"
#include "dist/rank_workers.h"
#include "model/parallel/shard_weights.h"
#include "model_fixture.h"
#include "runtime/engine.h"

using namespace tetra;
using namespace tetra::model;

namespace {

struct SplitCase {
  std::string preset, dtype;
  int tp = 1, ep = 1;
};

std::string case_name(const ::testing::TestParamInfo<SplitCase>& i) {
  std::string n = i.param.preset + "_" + i.param.dtype + "_tp" + std::to_string(i.param.tp) +
                  "_ep" + std::to_string(i.param.ep);
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

std::unique_ptr<test::ModelUnderTest> load(const std::filesystem::path& dir, int tp, int ep) {
  auto m = std::make_unique<test::ModelUnderTest>(dir);  // cpu, one rank
  if (tp == 1 && ep == 1) return m;
  ModelOptions o;
  o.backend = "cpu";
  o.limits = test::small_limits();
  o.tp = tp;
  o.ep = ep;
  m->model = Model::load(dir, o);
  return m;
}

// Relative L2 error per row of got vs want [rows, vocab].
void collect_rows(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab,
                  std::vector<double>& rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r * size_t(vocab) < want.size(); ++r) {
    double err = 0, ref = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      const double g = got[r * size_t(vocab) + size_t(i)], w = want[r * size_t(vocab) + size_t(i)];
      ASSERT_TRUE(std::isfinite(g));
      err += (g - w) * (g - w);
      ref += w * w;
    }
    rel.push_back(std::sqrt(err / std::max(ref, 1e-30)));
  }
}

int argmax_row(const std::vector<float>& v, int64_t vocab, int row) {
  const float* p = v.data() + int64_t(row) * vocab;
  return int(std::max_element(p, p + vocab) - p);
}

class ParallelSharding : public ::testing::TestWithParam<SplitCase> {};

TEST_P(ParallelSharding, LogitsMatchOneRank) {
  const SplitCase c = GetParam();
  const auto dir = test::tiny_model(c.preset, c.dtype);
  auto one = load(dir, 1, 1);
  auto split = load(dir, c.tp, c.ep);
  const int64_t V = one->vocab();
  const std::vector<int64_t> ids = {1, 2};
  const std::vector<std::vector<int32_t>> prompts = {test::test_prompt(29, V, 3),
                                                     test::test_prompt(13, V, 4)};
  std::vector<double> rel;
  const std::vector<float> a = one->prefill(ids, prompts);
  const std::vector<float> b = split->prefill(ids, prompts);
  collect_rows(b, a, V, rel);
  std::vector<int32_t> next = {argmax_row(a, V, 0), argmax_row(a, V, 1)};
  for (int step = 0; step < 6; ++step) {
    const std::vector<float> x = one->decode(ids, next);
    const std::vector<float> y = split->decode(ids, next);
    collect_rows(y, x, V, rel);
    next = {argmax_row(x, V, 0), argmax_row(x, V, 1)};
  }
  std::sort(rel.begin(), rel.end());
  const size_t over = size_t(std::count_if(rel.begin(), rel.end(), [](double r) { return r > 2e-2; }));
  EXPECT_LE(double(over), 0.05 * double(rel.size()));
  EXPECT_LE(rel[rel.size() / 2], 1e-2);
  EXPECT_LE(rel.back(), 0.5);
  std::printf("%s %s tp%d ep%d: %zu rows, median relative L2 %.3g, worst %.3g\n",
              c.preset.c_str(), c.dtype.c_str(), c.tp, c.ep, rel.size(), rel[rel.size() / 2],
              rel.back());
}

std::vector<SplitCase> cases() {
  std::vector<SplitCase> v;
  // MLA through tiny-deepseek-v3 (latent projections whole, q_b / kv_b / o_proj by heads).
  // tiny-glm5 runs the same MLA code; it is not here because its random router (no group
  // limit) has near-tied experts on a few rows, which flip under any change of summation order:
  // the same rows exceed 2e-2 at tp2, tp4 and with only the experts split (ep2), 3 of 54.
  for (const char* p : {"tiny-glm4.5-air", "tiny-glm4.7", "tiny-qwen3-30b-a3b",
                        "tiny-deepseek-v3"})
    for (const char* d : {"bf16", "nvfp4"}) {
      v.push_back({p, d, 2, 1});
      // 4 heads, 2 KV heads: each KV head on two ranks; dense MLP 128 / 4 = 32 (not a multiple
      // of 64): replicated, rank 0's counts
      v.push_back({p, d, 4, 1});
      v.push_back({p, d, 1, 2});  // attention and shared expert replicated: rank 1's zeroed
      v.push_back({p, d, 2, 2});  // heads split, whole experts in two blocks
      v.push_back({p, d, 2, 4});  // 4 expert blocks, attention in two tp groups
    }
  return v;
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, ParallelSharding, ::testing::ValuesIn(cases()), case_name);

// ---- the cut itself ----

TEST(ShardWeights, ColumnBlocksAreTheParentsColumns) {
  for (const char* dtype : {"nvfp4", "bf16"}) {
    const Checkpoint ck = Checkpoint::open(test::tiny_model("tiny-glm4.5-air", dtype));
    const ModelWeights w = ModelWeights::load(ck);
    const dist::ShardingPlan plan(w.config, ParallelPlan{2, 1});
    for (int r = 0; r < 2; ++r) {
      const auto s = parallel::shard_weights(w, plan, r);
      for (size_t L = 0; L < w.layers.size(); ++L) {
        const LinearWeight& full = w.layers[L].attn.o;
        const LinearWeight& part = s->weights.layers[L].attn.o;
        const int64_t K = full.in_features, k = K / 2, N = full.out_features;
        ASSERT_EQ(part.in_features, k);
        ASSERT_EQ(part.out_features, N);
        // Bytes per column group: NVFP4 codes hold 2 columns per byte, scales 16 per byte.
        auto check = [&](const TensorView& f, const TensorView& p, int64_t cols_per_elem) {
          const size_t es = dtype_size(f.dtype);
          const size_t fb = size_t(K / cols_per_elem) * es, pb = size_t(k / cols_per_elem) * es;
          ASSERT_EQ(p.nbytes, pb * size_t(N)) << f.name;
          for (int64_t n = 0; n < N; ++n)
            ASSERT_EQ(0, std::memcmp(p.data + size_t(n) * pb,
                                     f.data + size_t(n) * fb + size_t(r) * pb, pb))
                << f.name << " rank " << r << " row " << n;
        };
        check(full.weight, part.weight, full.quantized ? 2 : 1);
        if (full.quantized) check(*full.weight_scale, *part.weight_scale, 16);
        // Row split: q_proj rows [r * N/2, (r+1) * N/2) viewed in place, bias rows with it.
        const LinearWeight& q = w.layers[L].attn.q;
        const LinearWeight& qp = s->weights.layers[L].attn.q;
        ASSERT_EQ(qp.out_features, q.out_features / 2);
        EXPECT_EQ(qp.weight.data, q.weight.data + q.weight.nbytes / 2 * size_t(r));
        ASSERT_EQ(q.bias.has_value(), qp.bias.has_value());  // glm4.5-air: attention_bias
        if (q.bias) EXPECT_EQ(qp.bias->data, q.bias->data + q.bias->nbytes / 2 * size_t(r));
      }
    }
  }
}

TEST(ShardWeights, RankConfigDividesHeadsAndWidths) {
  const ModelConfig c = preset_config("glm4.7");  // 96 heads, 8 KV heads
  const ModelConfig r2 = parallel::rank_config(c, dist::ShardingPlan(c, {2, 1}), 0);
  EXPECT_EQ(r2.num_attention_heads, 48);
  EXPECT_EQ(r2.num_key_value_heads, 4);
  EXPECT_EQ(r2.intermediate_size, c.intermediate_size / 2);
  EXPECT_EQ(r2.moe_intermediate_size, c.moe_intermediate_size / 2);
  EXPECT_EQ(r2.n_routed_experts, c.n_routed_experts);  // the router keeps every expert
  const ModelConfig r16 = parallel::rank_config(c, dist::ShardingPlan(c, {16, 1}), 3);
  EXPECT_EQ(r16.num_attention_heads, 6);
  EXPECT_EQ(r16.num_key_value_heads, 1);  // 8 KV heads over 16 ranks: each replicated twice
  const ModelConfig air = preset_config("glm4.5-air");  // dense MLP 10944: 5472 per rank at tp2
  EXPECT_FALSE(parallel::dense_mlp_split(air, {2, 1}));
  EXPECT_EQ(parallel::rank_config(air, dist::ShardingPlan(air, {2, 1}), 0).intermediate_size,
            air.intermediate_size);
  EXPECT_TRUE(parallel::dense_mlp_split(c, {2, 1}));  // 12288 / 2 = 6144 = 96 x 64
  const ModelConfig e2 = parallel::rank_config(c, dist::ShardingPlan(c, {2, 2}), 1);
  EXPECT_EQ(e2.moe_intermediate_size, c.moe_intermediate_size);  // EP: whole experts
}

TEST(ShardWeights, SharedExpertReplicatedWhenItsSlicesLoseAlignment) {
  // GLM-4.7: shared expert 1536 wide -> 768 per rank at tp2: split.
  const ModelConfig big = preset_config("glm4.7");
  EXPECT_TRUE(parallel::runnable_sharding(big, ParallelPlan{2, 2}, {}).shared_expert_tp);
  // Tiny presets: 64 wide -> 32 per rank: the expert GEMMs read 64-wide chunks, so replicate.
  const ModelConfig tiny = preset_config("tiny-glm4.5-air");
  EXPECT_FALSE(parallel::runnable_sharding(tiny, ParallelPlan{2, 1}, {}).shared_expert_tp);
  EXPECT_TRUE(parallel::runnable_sharding(tiny, ParallelPlan{1, 2}, {}).shared_expert_tp);  // nothing cut
}

TEST(ParallelModelLoad, RefusesSplitsTheModelDoesNotDivide) {
  ModelOptions o;
  o.backend = "cpu";
  o.limits = test::small_limits();
  o.tp = 3;  // 4 heads
  try {
    Model::load(test::tiny_model("tiny-glm4.5-air", "bf16"), o);
    FAIL() << "tp=3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tp=3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("attention heads"), std::string::npos) << e.what();
  }
}

// The engine over 2 CPU ranks (scheduling, sampling on rank 0, batched decode): greedy
// generation of three requests. Only the first 2 tokens of each (the prefill's and the first
// decode step's) must equal one rank's: a random tiny model's logits have near-ties, and the
// greedy paths were seen to part at them (request 3's 6th token at tp2: top-2 gap 0.005; request
// 2's 3rd at tp2+ep2: gap 0.017; the split's max logit difference is ~0.015). The logits
// themselves are compared above. A wiring fault (wrong rank's logits, a stale step, a lost KV
// write, a garbage sample) changes the first tokens.
TEST(ParallelEngine, GreedyTokensMatchOneRank) {
  const auto dir = test::tiny_model("tiny-glm4.5-air", "nvfp4");
  const int64_t vocab = preset_config("tiny-glm4.5-air").vocab_size;
  auto generate = [&](int tp, int ep) {
    runtime::EngineOptions o;
    o.backend = "cpu";
    o.max_batch = 4;
    o.max_context = 64;
    o.tp = tp;
    o.ep = ep;
    auto e = runtime::Engine::load(dir, o);
    ops::SamplingParams greedy;
    greedy.temperature = 0.0f;
    std::vector<int64_t> ids;
    for (uint32_t salt = 1; salt <= 3; ++salt)
      ids.push_back(e->add_request(test::test_prompt(int(5 + 4 * salt), vocab, salt), greedy, 12));
    e->run_to_completion();
    std::vector<std::vector<int32_t>> out;
    for (int64_t id : ids) out.push_back(e->request(id).output);
    return out;
  };
  auto head = [](std::vector<std::vector<int32_t>> v) {
    for (auto& o : v) {
      EXPECT_EQ(o.size(), 12u);
      o.resize(2);
    }
    return v;
  };
  const auto one = head(generate(1, 1));
  ASSERT_EQ(one.size(), 3u);
  EXPECT_EQ(head(generate(2, 1)), one);
  EXPECT_EQ(head(generate(2, 2)), one);
  EXPECT_EQ(head(generate(4, 1)), one);
}

TEST(RankWorkers, RunsEveryRankOnItsOwnThreadAndRethrows) {
  dist::RankWorkers w(3, {});
  std::vector<std::thread::id> seen(3);
  w.run_all([&](int r) { seen[size_t(r)] = std::this_thread::get_id(); });
  EXPECT_NE(seen[0], seen[1]);
  EXPECT_NE(seen[1], seen[2]);
  EXPECT_NE(seen[0], std::this_thread::get_id());
  std::vector<std::thread::id> again(3);
  w.run_all([&](int r) { again[size_t(r)] = std::this_thread::get_id(); });
  EXPECT_EQ(again, seen);  // persistent: the same thread per rank every time
  int ran = 0;
  std::thread::id one_thread;
  w.run_one(2, [&] { ++ran; one_thread = std::this_thread::get_id(); });
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(one_thread, seen[2]);
  EXPECT_THROW(w.run_all([](int r) { if (r == 1) TETRA_FAIL("rank 1 failed"); }), Error);
  int after = 0;
  std::mutex mu;
  w.run_all([&](int) { std::lock_guard<std::mutex> l(mu); ++after; });  // still usable
  EXPECT_EQ(after, 3);
}

}  // namespace
