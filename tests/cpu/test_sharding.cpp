// The TP/EP sharding plan, checked two ways: (1) bookkeeping over every preset and many splits
// (each weight's slices tile it exactly once per tp group, each routed expert slice lives on one
// rank); (2) N simulated ranks compute attention (GQA with KV-head replication, MLA), a dense MLP
// and a whole MoE layer with only their shards, partial sums are added (the all-reduce), and the
// result must match the single-rank computation (for MoE: the independent moe_layer_cpu).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/sharding_plan.h"
#include "format/model_config.h"
#include "moe/moe_reference.h"

using namespace tetra;
using namespace tetra::dist;

namespace {

using Mat = std::vector<float>;  // row-major

Mat random_mat(int64_t rows, int64_t cols, uint32_t seed, float scale = 0.2f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  Mat m(size_t(rows * cols));
  for (float& v : m) v = d(rng);
  return m;
}

// The block W[rows, cols] of W [*, in].
Mat take(const Mat& w, int64_t in, IndexRange rows, IndexRange cols) {
  Mat out;
  out.reserve(size_t(rows.size * cols.size));
  for (int64_t r = rows.begin; r < rows.end(); ++r)
    for (int64_t c = cols.begin; c < cols.end(); ++c) out.push_back(w[size_t(r * in + c)]);
  return out;
}

// y [T, out] = x [T, in] W^T, W [out, in].
Mat linear(const Mat& x, int64_t T, const Mat& w, int64_t out, int64_t in) {
  Mat y(size_t(T * out), 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t k = 0; k < in; ++k) acc += double(x[size_t(t * in + k)]) * w[size_t(o * in + k)];
      y[size_t(t * out + o)] = float(acc);
    }
  return y;
}

// x [T, n] columns [cols) -> [T, cols.size]
Mat columns(const Mat& x, int64_t T, int64_t n, IndexRange cols) {
  Mat out;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = cols.begin; c < cols.end(); ++c) out.push_back(x[size_t(t * n + c)]);
  return out;
}

float silu(float v) { return v / (1.0f + std::exp(-v)); }

void expect_close(const Mat& got, const Mat& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0, scale = 1e-6;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  EXPECT_LE(worst, 2e-5 * scale) << what << ": max abs diff " << worst << " (scale " << scale << ")";
}

const LinearSpec& find_linear(const ShardingPlan& p, const std::string& module) {
  for (const LinearSpec& s : p.layout().linears)
    if (s.module == module) return s;
  throw Error("no linear " + module);
}

const std::vector<ParallelPlan> kPlans = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 1}, {1, 4},
                                          {4, 2}, {2, 4}, {4, 4}, {8, 1}, {1, 8}, {8, 8}};

// ---------------------------------------------------------------- bookkeeping

TEST(ShardingPlan, RankCoordinates) {
  const RankCoords a = rank_coords({4, 2}, 3);  // world 4, moe_tp 2
  EXPECT_EQ(a.tp_rank, 3);
  EXPECT_EQ(a.tp_group, 0);
  EXPECT_EQ(a.ep_rank, 1);
  EXPECT_EQ(a.moe_tp_rank, 1);
  const RankCoords b = rank_coords({2, 4}, 3);  // world 4, moe_tp 1
  EXPECT_EQ(b.tp_rank, 1);
  EXPECT_EQ(b.tp_group, 1);
  EXPECT_EQ(b.ep_rank, 3);
  EXPECT_EQ(b.moe_tp_rank, 0);
  EXPECT_THROW(rank_coords({2, 2}, 2), Error);
}

// Every linear of every preset that a split divides: within each tp group the Out rows / In
// columns of the ranks tile the weight exactly once (k/v: exactly tp/kv times when KV heads are
// replicated), and over all ranks every (routed expert, intermediate slice) is held once.
TEST(ShardingPlan, SlicesTileEveryWeightOfEveryPreset) {
  int checked_plans = 0;
  for (const std::string& name : preset_names()) {
    const ModelConfig cfg = preset_config(name);
    for (ParallelPlan plan : kPlans) {
      if (!sharding_problems(cfg, QuantConfig{}, plan).empty()) continue;
      ++checked_plans;
      const ShardingPlan sp(cfg, plan);
      std::vector<RankShards> ranks;
      for (int r = 0; r < sp.world(); ++r) ranks.push_back(sp.rank(r));
      const auto& linears = sp.layout().linears;
      for (size_t i = 0; i < linears.size(); ++i) {
        const LinearSpec& s = linears[i];
        // cover[group][range along the split dimension] = how many ranks hold that range
        std::map<int, std::map<std::pair<int64_t, int64_t>, int>> cover;
        int64_t extent = 0;
        Split split = ranks[0].linears[i].split;
        for (const RankShards& rs : ranks) {
          const LinearShard& sh = rs.linears[i];
          ASSERT_EQ(sh.spec, &s);
          if (!sh.held) continue;
          EXPECT_EQ(sh.split, split) << name << " " << s.module;
          const bool by_rows = sh.split != Split::In;
          const IndexRange range = by_rows ? sh.rows : sh.cols;
          const IndexRange other = by_rows ? sh.cols : sh.rows;
          EXPECT_EQ(other, (IndexRange{0, by_rows ? s.in_features : s.out_features}))
              << name << " " << s.module;
          extent = by_rows ? s.out_features : s.in_features;
          const int group = s.kind == ModuleKind::RoutedExpert ? 0 : rs.coords.tp_group;
          ++cover[group][{range.begin, range.size}];
        }
        const std::string_view last = std::string_view(s.module).substr(s.module.rfind('.') + 1);
        int want = 1;
        if (split == Split::Whole && s.kind != ModuleKind::RoutedExpert) want = plan.tp;
        if (s.kind == ModuleKind::Attention && cfg.attention == AttentionKind::GQA &&
            (last == "k_proj" || last == "v_proj") && plan.tp > cfg.num_key_value_heads)
          want = plan.tp / int(cfg.num_key_value_heads);
        if (cfg.attention == AttentionKind::MLA && (last == "q_a_proj" || last == "kv_a_proj_with_mqa"))
          want = plan.tp;
        // Distinct ranges, each held `want` times, lie end to end over [0, extent).
        for (const auto& [group, ranges] : cover) {
          int64_t next = 0;
          for (const auto& [range, count] : ranges) {
            ASSERT_EQ(count, want) << name << " tp=" << plan.tp << " ep=" << plan.ep << " "
                                   << s.module << " range at " << range.first;
            ASSERT_EQ(range.first, next) << name << " tp=" << plan.tp << " ep=" << plan.ep << " "
                                         << s.module << " group " << group;
            next = range.first + range.second;
          }
          ASSERT_EQ(next, extent) << name << " " << s.module << " group " << group;
        }
        if (s.kind == ModuleKind::RoutedExpert) ASSERT_EQ(cover.size(), 1u) << s.module;
      }
    }
  }
  EXPECT_GT(checked_plans, 30);  // the loop really ran over many splits
}

TEST(ShardingPlan, ExpertsInContiguousBlocksAndVocabInTpBlocks) {
  const ModelConfig cfg = preset_config("glm5");  // 256 experts, vocab 154880
  const ShardingPlan sp(cfg, {2, 8});
  EXPECT_EQ(sp.rank(0).experts, (IndexRange{0, 32}));
  EXPECT_EQ(sp.rank(5).experts, (IndexRange{160, 32}));
  EXPECT_EQ(sp.rank(5).vocab, (IndexRange{154880 / 2, 154880 / 2}));  // tp_rank 1
  ModelConfig odd = preset_config("tiny-qwen3-30b-a3b");
  odd.vocab_size = 513;  // not divisible by tp: the last block is shorter
  const ShardingPlan sp4(odd, {4, 1});
  EXPECT_EQ(sp4.rank(0).vocab, (IndexRange{0, 129}));
  EXPECT_EQ(sp4.rank(3).vocab, (IndexRange{387, 126}));
}

TEST(ShardingPlan, DivisibilityErrorsNameTheCause) {
  const ModelConfig glm5 = preset_config("glm5");
  try {
    ShardingPlan(glm5, {3, 1});
    FAIL() << "tp=3 must be refused";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("64 attention heads"), std::string::npos) << m;
  }
  EXPECT_THROW(ShardingPlan(glm5, {1, 3}), Error);  // 256 experts
  EXPECT_THROW(ShardingPlan(glm5, {2, 3}), Error);  // neither divides the other
  // GQA: 8 KV heads (GLM-4.7) at tp=16 is fine (replicated), at tp=12 is not.
  const ModelConfig glm47 = preset_config("glm4.7");
  EXPECT_TRUE(sharding_problems(glm47, QuantConfig{}, {16, 1}).empty());
  EXPECT_FALSE(sharding_problems(glm47, QuantConfig{}, {12, 1}).empty());
}

TEST(ShardingPlan, Nvfp4RowSplitsMustKeepWholeScaleBlocks) {
  // GLM-4.5-Air's dense MLP is 10944 wide: 10944 / 8 = 1368 = 85.5 NVFP4 blocks of 16.
  const ModelConfig air = preset_config("glm4.5-air");
  QuantConfig nvfp4;
  nvfp4.algo = QuantAlgo::NVFP4;
  nvfp4.group_size = 16;
  nvfp4.exclude = {"lm_head"};
  const auto problems = sharding_problems(air, nvfp4, {8, 1});
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("down_proj"), std::string::npos) << problems[0];
  EXPECT_NE(problems[0].find("1368"), std::string::npos) << problems[0];
  EXPECT_TRUE(sharding_problems(air, QuantConfig{}, {8, 1}).empty());  // bf16 splits anywhere
  EXPECT_TRUE(sharding_problems(air, nvfp4, {4, 1}).empty());          // 2736 = 171 blocks
}

// ---------------------------------------------------------------- simulated ranks

constexpr int64_t kTokens = 5;

// Dense MLP of layer 0 of tiny-glm4.5-air, split tp ways.
TEST(ShardedCompute, DenseMlpPartialsSumToTheWhole) {
  const ModelConfig cfg = preset_config("tiny-glm4.5-air");
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size;
  const Mat x = random_mat(kTokens, H, 1, 1.0f);
  const Mat wg = random_mat(I, H, 2), wu = random_mat(I, H, 3), wd = random_mat(H, I, 4);
  auto mlp = [&](const Mat& g, const Mat& u, const Mat& d, int64_t width) {
    Mat a = linear(x, kTokens, g, width, H), b = linear(x, kTokens, u, width, H);
    for (size_t i = 0; i < a.size(); ++i) a[i] = silu(a[i]) * b[i];
    return linear(a, kTokens, d, H, width);
  };
  const Mat full = mlp(wg, wu, wd, I);
  for (int tp : {1, 2, 4}) {
    const ShardingPlan sp(cfg, {tp, 1});
    Mat sum(full.size(), 0.0f);
    for (int r = 0; r < sp.world(); ++r) {
      const LinearShard g = sp.shard(find_linear(sp, "model.layers.0.mlp.gate_proj"), r);
      const LinearShard u = sp.shard(find_linear(sp, "model.layers.0.mlp.up_proj"), r);
      const LinearShard d = sp.shard(find_linear(sp, "model.layers.0.mlp.down_proj"), r);
      EXPECT_EQ(d.split, tp > 1 ? Split::In : Split::Whole);
      const Mat part = mlp(take(wg, H, g.rows, g.cols), take(wu, H, u.rows, u.cols),
                           take(wd, I, d.rows, d.cols), g.rows.size);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    }
    expect_close(sum, full, "dense MLP tp=" + std::to_string(tp));
  }
}

// Causal attention of T tokens; q [T, nq*dq], k [T, nkv*dq], v [T, nkv*dv]; q head h reads KV
// head kv_of(h). Returns [T, nq*dv].
template <typename KvOf>
Mat attention(const Mat& q, const Mat& k, const Mat& v, int64_t nq, int64_t nkv, int64_t dq,
              int64_t dv, KvOf kv_of) {
  Mat out(size_t(kTokens * nq * dv), 0.0f);
  for (int64_t h = 0; h < nq; ++h) {
    const int64_t g = kv_of(h);
    EXPECT_TRUE(g >= 0 && g < nkv) << "q head " << h << " needs KV head " << g;
    if (g < 0 || g >= nkv) return out;
    for (int64_t t = 0; t < kTokens; ++t) {
      std::vector<double> s;
      double mx = -1e30;
      for (int64_t j = 0; j <= t; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < dq; ++e)
          dot += double(q[size_t(t * nq * dq + h * dq + e)]) * k[size_t(j * nkv * dq + g * dq + e)];
        s.push_back(dot / std::sqrt(double(dq)));
        mx = std::max(mx, s.back());
      }
      double z = 0;
      for (double& e : s) z += (e = std::exp(e - mx));
      for (int64_t e = 0; e < dv; ++e) {
        double acc = 0;
        for (int64_t j = 0; j <= t; ++j) acc += s[size_t(j)] / z * v[size_t(j * nkv * dv + g * dv + e)];
        out[size_t(t * nq * dv + h * dv + e)] = float(acc);
      }
    }
  }
  return out;
}

TEST(ShardedCompute, GqaAttentionWithKvHeadReplication) {
  const ModelConfig cfg = preset_config("tiny-glm4.5-air");  // 4 q heads, 2 KV heads, dim 32
  const int64_t H = cfg.hidden_size, nq = cfg.num_attention_heads, nkv = cfg.num_key_value_heads,
                hd = cfg.head_dim;
  const Mat x = random_mat(kTokens, H, 10, 1.0f);
  const Mat wq = random_mat(nq * hd, H, 11), wk = random_mat(nkv * hd, H, 12),
            wv = random_mat(nkv * hd, H, 13), wo = random_mat(H, nq * hd, 14);
  const int64_t group = nq / nkv;
  auto run = [&](const Mat& q_w, const Mat& k_w, const Mat& v_w, const Mat& o_w, int64_t q_heads,
                 int64_t kv_heads, int64_t first_q, int64_t first_kv) {
    const Mat q = linear(x, kTokens, q_w, q_heads * hd, H);
    const Mat k = linear(x, kTokens, k_w, kv_heads * hd, H);
    const Mat v = linear(x, kTokens, v_w, kv_heads * hd, H);
    // Local q head h is global first_q + h; its KV head is global (first_q + h) / group.
    const Mat a = attention(q, k, v, q_heads, kv_heads, hd, hd,
                            [&](int64_t h) { return (first_q + h) / group - first_kv; });
    return linear(a, kTokens, o_w, H, q_heads * hd);
  };
  const Mat full = run(wq, wk, wv, wo, nq, nkv, 0, 0);
  for (int tp : {1, 2, 4}) {  // tp 4 > 2 KV heads: each KV head on 2 ranks
    const ShardingPlan sp(cfg, {tp, 1});
    Mat sum(full.size(), 0.0f);
    for (int r = 0; r < tp; ++r) {
      const std::string p = "model.layers.1.self_attn.";
      const LinearShard q = sp.shard(find_linear(sp, p + "q_proj"), r);
      const LinearShard k = sp.shard(find_linear(sp, p + "k_proj"), r);
      const LinearShard v = sp.shard(find_linear(sp, p + "v_proj"), r);
      const LinearShard o = sp.shard(find_linear(sp, p + "o_proj"), r);
      EXPECT_EQ(k.rows, v.rows);
      const Mat part = run(take(wq, H, q.rows, q.cols), take(wk, H, k.rows, k.cols),
                           take(wv, H, v.rows, v.cols), take(wo, nq * hd, o.rows, o.cols),
                           q.rows.size / hd, k.rows.size / hd, q.rows.begin / hd, k.rows.begin / hd);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    }
    expect_close(sum, full, "GQA attention tp=" + std::to_string(tp));
  }
}

// MLA without RoPE and the latent norms (position-wise and replicated: they do not change which
// rank needs which rows): q = Wqb Wqa x per head [nope | rope]; kv_a = Wkva x = [latent | k_pe];
// Wkvb latent per head [k_nope | v]; score = q_nope.k_nope + q_pe.k_pe; out = Wo concat(v).
TEST(ShardedCompute, MlaAttentionSplitByHeads) {
  const ModelConfig cfg = preset_config("tiny-deepseek-v3");
  const int64_t H = cfg.hidden_size, nh = cfg.num_attention_heads, ql = cfg.q_lora_rank,
                kl = cfg.kv_lora_rank, dn = cfg.qk_nope_head_dim, dr = cfg.qk_rope_head_dim,
                dv = cfg.v_head_dim;
  const Mat x = random_mat(kTokens, H, 20, 1.0f);
  const Mat wqa = random_mat(ql, H, 21), wqb = random_mat(nh * (dn + dr), ql, 22),
            wkva = random_mat(kl + dr, H, 23), wkvb = random_mat(nh * (dn + dv), kl, 24),
            wo = random_mat(H, nh * dv, 25);
  auto run = [&](const Mat& qb, const Mat& kvb, const Mat& o, int64_t heads) {
    const Mat q = linear(linear(x, kTokens, wqa, ql, H), kTokens, qb, heads * (dn + dr), ql);
    const Mat kva = linear(x, kTokens, wkva, kl + dr, H);
    const Mat latent = columns(kva, kTokens, kl + dr, {0, kl});
    const Mat kv = linear(latent, kTokens, kvb, heads * (dn + dv), kl);
    // Per head keys [k_nope | k_pe] (k_pe shared by all heads) and values.
    Mat k(size_t(kTokens * heads * (dn + dr))), v(size_t(kTokens * heads * dv));
    for (int64_t t = 0; t < kTokens; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t e = 0; e < dn; ++e)
          k[size_t((t * heads + h) * (dn + dr) + e)] = kv[size_t(t * heads * (dn + dv) + h * (dn + dv) + e)];
        for (int64_t e = 0; e < dr; ++e)
          k[size_t((t * heads + h) * (dn + dr) + dn + e)] = kva[size_t(t * (kl + dr) + kl + e)];
        for (int64_t e = 0; e < dv; ++e)
          v[size_t((t * heads + h) * dv + e)] = kv[size_t(t * heads * (dn + dv) + h * (dn + dv) + dn + e)];
      }
    const Mat a = attention(q, k, v, heads, heads, dn + dr, dv, [](int64_t h) { return h; });
    return linear(a, kTokens, o, H, heads * dv);
  };
  const Mat full = run(wqb, wkvb, wo, nh);
  for (int tp : {1, 2, 4}) {
    const ShardingPlan sp(cfg, {tp, 1});
    Mat sum(full.size(), 0.0f);
    for (int r = 0; r < tp; ++r) {
      const std::string p = "model.layers.0.self_attn.";
      EXPECT_EQ(sp.shard(find_linear(sp, p + "q_a_proj"), r).split, Split::Whole);
      EXPECT_EQ(sp.shard(find_linear(sp, p + "kv_a_proj_with_mqa"), r).split, Split::Whole);
      const LinearShard qb = sp.shard(find_linear(sp, p + "q_b_proj"), r);
      const LinearShard kvb = sp.shard(find_linear(sp, p + "kv_b_proj"), r);
      const LinearShard o = sp.shard(find_linear(sp, p + "o_proj"), r);
      const Mat part = run(take(wqb, ql, qb.rows, qb.cols), take(wkvb, kl, kvb.rows, kvb.cols),
                           take(wo, nh * dv, o.rows, o.cols), nh / tp);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    }
    expect_close(sum, full, "MLA attention tp=" + std::to_string(tp));
  }
}

// A whole MoE layer (router, routed experts, shared expert) of tiny-glm4.5-air layer 1 against
// moe_layer_cpu: every rank routes (the router is whole everywhere), runs the experts it holds
// on its intermediate slice, adds its shared-expert slice when counted; the sum over ranks is
// the all-reduce.
TEST(ShardedCompute, MoeLayerOverTpAndEpSplits) {
  const ModelConfig cfg = preset_config("tiny-glm4.5-air");
  const int H = int(cfg.hidden_size), I = int(cfg.moe_intermediate_size),
            E = int(cfg.n_routed_experts), K = int(cfg.num_experts_per_tok),
            Is = int(cfg.moe_intermediate_size * cfg.n_shared_experts);
  moe::RouterParams rp;
  rp.scoring = cfg.routing.scoring == RouterScoring::Sigmoid ? moe::Scoring::Sigmoid
                                                             : moe::Scoring::Softmax;
  rp.num_experts = E;
  rp.top_k = K;
  rp.n_group = int(cfg.routing.n_group);
  rp.topk_group = int(cfg.routing.topk_group);
  rp.norm_topk_prob = cfg.routing.norm_topk_prob;
  rp.routed_scaling_factor = float(cfg.routing.routed_scaling_factor);
  const Mat gate = random_mat(E, H, 30, 1.0f), bias = random_mat(1, E, 31, 0.1f);
  const Mat w13 = random_mat(int64_t(E) * 2 * I, H, 32), w2 = random_mat(int64_t(E) * H, I, 33);
  const Mat s13 = random_mat(2 * Is, H, 34), s2 = random_mat(H, Is, 35);
  const Mat x = random_mat(kTokens, H, 36, 1.0f);

  moe::MoeLayerF32 layer;
  layer.gate = gate.data();
  layer.bias = cfg.routing.has_correction_bias ? bias.data() : nullptr;
  layer.router = rp;
  layer.experts = {w13.data(), w2.data(), E, H, I};
  layer.shared = {s13.data(), s2.data(), Is > 0 ? 1 : 0, H, Is};
  Mat full(size_t(kTokens * H));
  std::vector<int32_t> ids(size_t(kTokens * K));
  std::vector<float> weights(size_t(kTokens * K));
  moe::moe_layer_cpu(x.data(), int(kTokens), layer, full.data(), ids.data(), weights.data());

  const std::string p = "model.layers.1.mlp.";
  for (bool shared_tp : {true, false}) {
    for (ParallelPlan plan : std::vector<ParallelPlan>{{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 2},
                                                       {2, 4}, {4, 4}, {1, 16}, {4, 1}}) {
      const ShardingPlan sp(cfg, plan, ShardingOptions{shared_tp});
      Mat sum(full.size(), 0.0f);
      int shared_counted = 0;
      for (int r = 0; r < sp.world(); ++r) {
        const RankShards rs = sp.rank(r);
        // Local routed experts: the held block, each on its intermediate slice.
        const IndexRange ex = rs.experts;
        const LinearShard g0 = sp.shard(find_linear(sp, p + "experts." + std::to_string(ex.begin) + ".gate_proj"), r);
        const LinearShard d0 = sp.shard(find_linear(sp, p + "experts." + std::to_string(ex.begin) + ".down_proj"), r);
        ASSERT_TRUE(g0.held);
        const int Ip = int(g0.rows.size);
        Mat l13, l2;  // [n, 2*Ip, H], [n, H, Ip]
        for (int64_t e = ex.begin; e < ex.end(); ++e) {
          for (int half = 0; half < 2; ++half)
            for (int64_t row = g0.rows.begin; row < g0.rows.end(); ++row)
              for (int h = 0; h < H; ++h)
                l13.push_back(w13[size_t(((e * 2 + half) * I + row) * H + h)]);
          for (int h = 0; h < H; ++h)
            for (int64_t c = d0.cols.begin; c < d0.cols.end(); ++c)
              l2.push_back(w2[size_t((e * H + h) * I + c)]);
        }
        // Routing is replicated: remap held ids, zero the weight of the others.
        std::vector<int32_t> lids(ids.size());
        std::vector<float> lw(weights.size());
        for (size_t j = 0; j < ids.size(); ++j) {
          const bool mine = ex.contains(ids[j]);
          lids[j] = mine ? int32_t(ids[j] - ex.begin) : 0;
          lw[j] = mine ? weights[j] : 0.0f;
        }
        Mat part(full.size(), 0.0f);
        const moe::ExpertMlpF32 local{l13.data(), l2.data(), int(ex.size), H, Ip};
        moe::moe_experts_cpu(x.data(), int(kTokens), lids.data(), lw.data(), K, local, part.data());
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
        // Shared expert slice.
        const LinearShard sg = sp.shard(find_linear(sp, p + "shared_experts.gate_proj"), r);
        const LinearShard sd = sp.shard(find_linear(sp, p + "shared_experts.down_proj"), r);
        if (!sg.counted) continue;
        ++shared_counted;
        Mat ls13 = take(s13, H, sg.rows, sg.cols);
        const Mat up = take(s13, H, {Is + sg.rows.begin, sg.rows.size}, sg.cols);
        ls13.insert(ls13.end(), up.begin(), up.end());
        const Mat ls2 = take(s2, Is, sd.rows, sd.cols);
        const moe::ExpertMlpF32 sh{ls13.data(), ls2.data(), 1, H, int(sg.rows.size)};
        for (int64_t t = 0; t < kTokens; ++t) {
          std::vector<float> y(static_cast<size_t>(H));
          moe::expert_mlp_cpu(sh, 0, x.data() + t * H, y.data());
          for (int h = 0; h < H; ++h) sum[size_t(t * H + h)] += y[size_t(h)];
        }
      }
      EXPECT_EQ(shared_counted, shared_tp ? plan.tp : 1);
      expect_close(sum, full, str("MoE tp=", plan.tp, " ep=", plan.ep, " shared ",
                                  shared_tp ? "tp-split" : "whole"));
    }
  }
}

}  // namespace
