// shard_weights: see shard_weights.h.
#include "model/parallel/shard_weights.h"

#include <cstring>
#include <map>

#include "core/error.h"

namespace tetra::model::parallel {
namespace {

using dist::LinearShard;
using dist::Split;

class Sharder {
 public:
  Sharder(const dist::ShardingPlan& plan, int rank, RankWeights& out)
      : out_(out), shards_(plan.rank(rank)) {
    for (const LinearShard& s : shards_.linears) by_module_[s.spec->module] = &s;
  }

  const dist::RankShards& shards() const { return shards_; }

  const LinearShard& shard_of(const LinearWeight& l) const {
    auto it = by_module_.find(l.module);
    if (it == by_module_.end())
      TETRA_FAIL("sharding: ", l.module, " is not a linear of the model layout");
    return *it->second;
  }

  // `zero`: this replica's output must not count in the sum (see the header).
  LinearWeight cut(const LinearWeight& l, bool zero) {
    const LinearShard& sh = shard_of(l);
    TETRA_CHECK(sh.held, "sharding: ", l.module, " is not held by rank ", shards_.coords.rank);
    LinearWeight r = l;
    r.out_features = sh.rows.size;
    r.in_features = sh.cols.size;
    r.weight = cut_matrix(l.weight, l, sh, l.quantized ? 2 : 1, zero);
    if (l.weight_scale) r.weight_scale = cut_matrix(*l.weight_scale, l, sh, 16, zero);
    if (l.bias) {
      if (sh.split == Split::In && (zero || shards_.coords.rank != 0))
        r.bias.reset();  // a partial-sum layer's bias joins the sum once
      else
        r.bias = cut_rows(*l.bias, sh.rows);
    }
    return r;
  }

  MlpWeights cut_mlp(const MlpWeights& m, bool zero_down) {
    return MlpWeights{cut(m.gate, false), cut(m.up, false), cut(m.down, zero_down)};
  }

  // The whole linear (a replica), zeroed when it must not count.
  LinearWeight whole(const LinearWeight& l, bool zero) {
    LinearShard sh = shard_of(l);
    sh.split = Split::Whole;
    sh.rows = {0, l.out_features};
    sh.cols = {0, l.in_features};
    LinearWeight r = l;
    r.weight = cut_matrix(l.weight, l, sh, l.quantized ? 2 : 1, zero);
    if (l.weight_scale) r.weight_scale = cut_matrix(*l.weight_scale, l, sh, 16, zero);
    if (l.bias && zero) r.bias.reset();
    return r;
  }

 private:
  // Bytes of one row of t, whose rows are l's out_features.
  static size_t row_bytes(const TensorView& t, const LinearWeight& l) {
    TETRA_CHECK(t.shape.size() == 2 && t.shape[0] == l.out_features, "sharding: ", t.name,
                " is not a [", l.out_features, ", .] matrix");
    return size_t(t.shape[1]) * dtype_size(t.dtype);
  }

  // Rows `rows` of a [N, *] (or [N]) tensor: an in-place view.
  TensorView cut_rows(const TensorView& t, dist::IndexRange rows) const {
    TensorView v = t;
    const size_t rb = t.shape.size() >= 2 ? size_t(t.shape[1]) * dtype_size(t.dtype)
                                          : dtype_size(t.dtype);
    v.shape[0] = rows.size;
    v.nbytes = rb * size_t(rows.size);
    if (t.data) v.data = t.data + rb * size_t(rows.begin);
    return v;
  }

  // The shard of a [N, K / per] matrix (per = 1 plain, 2 NVFP4 codes, 16 NVFP4 scales).
  TensorView cut_matrix(const TensorView& t, const LinearWeight& l, const LinearShard& sh,
                        int per, bool zero) {
    const size_t rb = row_bytes(t, l);
    const int64_t K = l.in_features;
    TETRA_CHECK(t.shape[1] * per == K, "sharding: ", t.name, " has ", t.shape[1],
                " columns, expected ", K, " / ", per);
    TETRA_CHECK(sh.cols.begin % per == 0 && sh.cols.size % per == 0, "sharding: ", t.name,
                ": column block [", sh.cols.begin, ", ", sh.cols.end(), ") cuts a ", per,
                "-wide group");
    TensorView v = cut_rows(t, sh.rows);
    if (sh.cols.size == K && !zero) return v;
    const size_t esize = dtype_size(t.dtype);
    const size_t col0 = size_t(sh.cols.begin / per) * esize, cb = size_t(sh.cols.size / per) * esize;
    v.shape[1] = sh.cols.size / per;
    v.nbytes = cb * size_t(sh.rows.size);
    if (!t.data) return v;  // shape only
    std::vector<uint8_t>& buf = out_.owned.emplace_back(v.nbytes, uint8_t(0));
    // Zero replicas: NVFP4 code 0 is +0, bf16/f16/f32 all-zero bits are +0; scales stay real
    // (finite, so 0 * scale = 0).
    const bool copy = !zero || per == 16;
    if (copy)
      for (int64_t r = 0; r < sh.rows.size; ++r)
        std::memcpy(buf.data() + size_t(r) * cb, t.data + size_t(sh.rows.begin + r) * rb + col0,
                    cb);
    v.data = buf.data();
    return v;
  }

  RankWeights& out_;
  dist::RankShards shards_;
  std::map<std::string, const LinearShard*> by_module_;
};

}  // namespace

bool dense_mlp_split(const ModelConfig& c, ParallelPlan plan) {
  return plan.tp == 1 || (c.intermediate_size / plan.tp) % 64 == 0;
}

dist::ShardingOptions runnable_sharding(const ModelConfig& c, ParallelPlan plan,
                                        dist::ShardingOptions requested) {
  const int64_t shared_width = c.moe_intermediate_size * c.n_shared_experts;
  if (plan.tp > 1 && shared_width > 0 && (shared_width / plan.tp) % 64 != 0)
    requested.shared_expert_tp = false;
  return requested;
}

ModelConfig rank_config(const ModelConfig& c, const dist::ShardingPlan& plan, int rank) {
  (void)rank;  // every rank holds equal shares
  const ParallelPlan p = plan.plan();
  ModelConfig r = c;
  r.num_attention_heads = c.num_attention_heads / p.tp;
  r.num_key_value_heads =
      c.num_key_value_heads >= p.tp ? c.num_key_value_heads / p.tp : 1;  // replicated KV head
  if (dense_mlp_split(c, p)) r.intermediate_size = c.intermediate_size / p.tp;
  r.moe_intermediate_size = c.moe_intermediate_size / p.moe_tp();
  // n_routed_experts stays global: the router scores all of them on every rank.
  return r;
}

std::unique_ptr<RankWeights> shard_weights(const ModelWeights& w, const dist::ShardingPlan& plan,
                                           int rank) {
  auto out = std::make_unique<RankWeights>();
  Sharder s(plan, rank, *out);
  const dist::RankCoords& rc = s.shards().coords;
  // Attention and dense MLPs are tp-split; with tp < world, tp groups beyond the first replicate
  // them and must add nothing to the all-rank sum.
  const bool tp_replica = rc.tp_group != 0;
  ModelWeights& r = out->weights;
  r.config = rank_config(w.config, plan, rank);
  r.embedding = w.embedding;
  r.final_norm = w.final_norm;
  r.lm_head = w.lm_head;  // replicated (see the header)
  r.layers.reserve(w.layers.size());
  for (const LayerWeights& lw : w.layers) {
    LayerWeights l;
    l.index = lw.index;
    l.input_norm = lw.input_norm;
    l.post_attention_norm = lw.post_attention_norm;
    l.is_moe = lw.is_moe;
    l.attn.q = s.cut(lw.attn.q, false);
    l.attn.o = s.cut(lw.attn.o, tp_replica);
    if (lw.attn.mla) {
      // MLA: the latent projections whole on every rank (each rank caches the whole latent its
      // heads read), q_b / kv_b cut by heads (the plan's attention_shard).
      const MlaWeights& m = *lw.attn.mla;
      MlaWeights mm;
      if (m.q_a) {
        mm.q_a = s.cut(*m.q_a, false);
        mm.q_a_norm = m.q_a_norm;
      }
      mm.kv_a = s.cut(m.kv_a, false);
      mm.kv_a_norm = m.kv_a_norm;
      mm.kv_b = s.cut(m.kv_b, false);
      if (m.indexer) {  // whole on every rank: its scores sum over all its heads
        const IndexerWeights& i = *m.indexer;
        mm.indexer = IndexerWeights{s.cut(i.wq_b, false), s.cut(i.wk, false), i.k_norm_weight,
                                    i.k_norm_bias, s.cut(i.weights_proj, false)};
      }
      l.attn.mla = std::move(mm);
    } else {
      l.attn.k = s.cut(lw.attn.k, false);
      l.attn.v = s.cut(lw.attn.v, false);
    }
    l.attn.q_norm = lw.attn.q_norm;
    l.attn.k_norm = lw.attn.k_norm;
    if (lw.dense && dense_mlp_split(w.config, plan.plan())) {
      l.dense = s.cut_mlp(*lw.dense, tp_replica);
    } else if (lw.dense) {  // replicated: rank 0's copy counts
      const MlpWeights& d = *lw.dense;
      l.dense = MlpWeights{s.whole(d.gate, false), s.whole(d.up, false), s.whole(d.down, rank != 0)};
    }
    if (lw.moe) {
      const MoeWeights& m = *lw.moe;
      MoeWeights mm;
      mm.router = m.router;
      mm.correction_bias = m.correction_bias;
      mm.router_params = m.router_params;
      const dist::IndexRange ex = s.shards().experts;
      TETRA_CHECK(ex.end() <= int64_t(m.experts.size()), "layer ", lw.index, " has ",
                  m.experts.size(), " experts, the plan expects ", w.config.n_routed_experts);
      mm.expert_begin = int(ex.begin);
      mm.global_experts = int(m.experts.size());
      for (int64_t e = ex.begin; e < ex.end(); ++e) mm.experts.push_back(s.cut_mlp(m.experts[size_t(e)], false));
      if (m.shared) {
        const bool counted = s.shard_of(m.shared->down).counted;
        mm.shared = s.cut_mlp(*m.shared, !counted);
      }
      l.moe = std::move(mm);
    }
    r.layers.push_back(std::move(l));
  }
  return out;
}

}  // namespace tetra::model::parallel
