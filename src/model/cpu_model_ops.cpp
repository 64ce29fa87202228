#include "model/cpu_model_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "core/parallel.h"
#include "model/attention_shapes.h"
#include "model/moe_layer_views.h"
#include "model/tensor_to_float.h"
#include "moe/moe_layer.h"
#include "ops/attention/attention.h"
#include "ops/attention/dsa.h"
#include "ops/attention/mla.h"
#include "ops/attention/paged_extend_attention_cpu.h"
#include "ops/norm/rms_norm.h"
#include "ops/rope/rope.h"

namespace tetra::model {
namespace {

// A linear prepared for the CPU: float32 weight and bias.
struct CpuLinear {
  int64_t n = 0, k = 0;
  std::vector<float> w;     // [n, k]
  std::vector<float> bias;  // [n] or empty
};

CpuLinear prepare_linear(const LinearWeight& lw) {
  CpuLinear l;
  l.n = lw.out_features;
  l.k = lw.in_features;
  l.w = linear_to_float(lw);
  if (lw.bias) l.bias = tensor_to_float(*lw.bias);
  return l;
}

struct CpuLayer {
  std::vector<uint16_t> input_norm, post_norm;  // [H] bf16
  std::vector<uint16_t> q_norm, k_norm;         // [head_dim] bf16 or empty
  CpuLinear q, k, v, o;
  // MLA: q_a (q compression, else empty), kv_a, their norms, and kv_b as bf16, the precision the
  // CUDA backend keeps it in (ops/attention/mla.h takes bf16 weights).
  CpuLinear q_a, kv_a;
  std::vector<uint16_t> q_a_norm, kv_a_norm;  // [q_lora], [kv_lora] bf16
  std::vector<uint16_t> kv_b;                 // [n_heads * (nope + v), kv_lora] bf16
  // DSA indexer layers: its linears, the key LayerNorm, and the index-key cache
  // [num_blocks, block_size, index_head_dim] bf16.
  CpuLinear idx_wq_b, idx_wk, idx_wproj;
  std::vector<uint16_t> idx_ln_w, idx_ln_b, idx_cache;
  CpuLinear gate, up, down;  // dense layers only
  std::unique_ptr<moe::MoeLayerRunner> moe;  // the MoE layer runner's cpu backend
  // GQA: k/v [num_blocks, block_size, n_kv, head_dim]; MLA: k [num_blocks, block_size,
  // kv_lora + rope] (the latent rows), v empty. bf16.
  std::vector<uint16_t> k_cache, v_cache;
};

class CpuModelOps final : public ModelOps {
 public:
  explicit CpuModelOps(CpuAllReduceHook hook = {}) : all_reduce_(std::move(hook)) {}
  std::string name() const override { return "cpu"; }

  void all_reduce(Buf b) override {
    if (all_reduce_) all_reduce_(buf(b), size_t(T_) * size_t(buf_width(b, c_)));
  }

  void prepare(const ModelWeights& w, const OpsLimits& lim) override {
    if (lim.moe_backend != "auto" && lim.moe_backend != "cpu")
      TETRA_FAIL("the cpu model backend runs its MoE blocks on the cpu; --moe-backend '",
                 lim.moe_backend, "' needs another backend (use auto or cpu)");
    TETRA_CHECK(lim.max_tokens > 0 && lim.max_seqs > 0 && lim.kv_block_size > 0 &&
                lim.kv_num_blocks > 0 && lim.max_blocks_per_seq > 0, "OpsLimits must be positive");
    c_ = w.config;
    lim_ = lim;
    H_ = int(c_.hidden_size);
    hd_ = int(c_.head_dim);
    nh_ = int(c_.num_attention_heads);
    nkv_ = int(c_.num_key_value_heads);
    embedding_ = tensor_to_bf16(w.embedding);
    final_norm_ = tensor_to_bf16(w.final_norm);
    lm_head_ = prepare_linear(w.lm_head);
    mla_ = c_.attention == AttentionKind::MLA;
    if (mla_) mla_shape_ = mla_shape_of(c_);
    const int64_t cache_elems = int64_t(lim.kv_num_blocks) * lim.kv_block_size * kv_row_elems();
    layers_.clear();
    layers_.resize(w.layers.size());
    for (size_t L = 0; L < w.layers.size(); ++L) {
      const LayerWeights& lw = w.layers[L];
      CpuLayer& cl = layers_[L];
      cl.input_norm = tensor_to_bf16(lw.input_norm);
      cl.post_norm = tensor_to_bf16(lw.post_attention_norm);
      if (lw.attn.q_norm) cl.q_norm = tensor_to_bf16(*lw.attn.q_norm);
      if (lw.attn.k_norm) cl.k_norm = tensor_to_bf16(*lw.attn.k_norm);
      cl.q = prepare_linear(lw.attn.q);
      cl.o = prepare_linear(lw.attn.o);
      if (lw.attn.mla) {
        const MlaWeights& m = *lw.attn.mla;
        if (m.q_a) {
          cl.q_a = prepare_linear(*m.q_a);
          cl.q_a_norm = tensor_to_bf16(*m.q_a_norm);
        }
        cl.kv_a = prepare_linear(m.kv_a);
        cl.kv_a_norm = tensor_to_bf16(m.kv_a_norm);
        for (float x : linear_to_float(m.kv_b)) cl.kv_b.push_back(float_to_bf16(x));
        if (m.indexer) {
          cl.idx_wq_b = prepare_linear(m.indexer->wq_b);
          cl.idx_wk = prepare_linear(m.indexer->wk);
          cl.idx_wproj = prepare_linear(m.indexer->weights_proj);
          cl.idx_ln_w = tensor_to_bf16(m.indexer->k_norm_weight);
          cl.idx_ln_b = tensor_to_bf16(m.indexer->k_norm_bias);
          cl.idx_cache.assign(size_t(lim.kv_num_blocks) * lim.kv_block_size * c_.index_head_dim, 0);
        }
      } else {
        cl.k = prepare_linear(lw.attn.k);
        cl.v = prepare_linear(lw.attn.v);
      }
      if (lw.dense) {
        cl.gate = prepare_linear(lw.dense->gate);
        cl.up = prepare_linear(lw.dense->up);
        cl.down = prepare_linear(lw.dense->down);
      }
      if (lw.moe) {
        // The runner copies what it keeps, so the views may go after construction.
        const auto views = moe_layer_views(*lw.moe, int(L), H_);
        moe::MoeLayerOptions mo;
        mo.backend = "cpu";
        mo.max_tokens = lim.max_tokens;
        cl.moe = moe::make_moe_layer(views->weights, mo);
      }
      cl.k_cache.assign(size_t(cache_elems), 0);
      if (!mla_) cl.v_cache.assign(size_t(cache_elems), 0);
    }
    inv_freq_ = rope_inv_freq_of(c_);
    if (mla_) {
      dsa_ = c_.index_n_heads > 0;
      if (dsa_) {
        dsa_shape_ = dsa_shape_of(c_);
        selection_.assign(size_t(lim.max_tokens) * dsa_shape_.topk, 0);
      }
    } else {
      rope_ = rope_shape_of(c_);
      attn_ = attention_shape_of(c_);
    }
    for (int b = 0; b < int(Buf::Count); ++b)
      bufs_[size_t(b)].assign(size_t(lim.max_tokens) * size_t(buf_width(Buf(b), c_)), 0);
    logits_.assign(size_t(lim.max_tokens) * size_t(c_.vocab_size), 0.0f);
  }

  void begin_step(const StepBatch& step) override {
    step_ = &step;
    T_ = step.num_tokens();
  }

  void embed(Buf out) override {
    uint16_t* o = buf(out);
    for (int t = 0; t < T_; ++t)
      std::memcpy(o + size_t(t) * H_, embedding_.data() + size_t(step_->tokens[size_t(t)]) * H_,
                  size_t(H_) * 2);
  }

  void rms_norm(NormId which, int layer, Buf in, Buf out) override {
    const bool latent = which == NormId::QLatent;
    const int width = latent ? int(c_.q_lora_rank) : H_;
    ops::rms_norm_cpu(buf(in), norm_weight(which, layer), T_, width,
                      latent ? kMlaLatentNormEps : eps(), buf(out));
  }

  void add_rms_norm(NormId which, int layer, Buf x, Buf residual, Buf out) override {
    ops::fused_add_rms_norm_cpu(buf(x), buf(residual), norm_weight(which, layer), T_, H_, eps(),
                                buf(out));
  }

  void linear(LinearId which, int layer, Buf in, Buf out) override {
    const CpuLinear& l = get_linear(which, layer);
    TETRA_CHECK(l.n > 0, "layer ", layer, " has no ", linear_id_name(which));
    TETRA_CHECK_LE(l.k, buf_width(in, c_), "input buffer ", buf_name(in), " too narrow");
    TETRA_CHECK_LE(l.n, buf_width(out, c_), "output buffer ", buf_name(out), " too narrow");
    matmul_bf16(buf(in), buf_width(in, c_), l, buf(out), buf_width(out, c_));
  }

  void head_norm(NormId which, int layer, Buf x) override {
    const bool q = which == NormId::QHead;
    TETRA_CHECK(q || which == NormId::KHead, "head_norm takes QHead or KHead");
    const std::vector<uint16_t>& w = q ? layers_[size_t(layer)].q_norm : layers_[size_t(layer)].k_norm;
    TETRA_CHECK(!w.empty(), "layer ", layer, " has no q/k norm");
    const int heads = q ? nh_ : nkv_;
    ops::head_rms_norm_cpu(buf(x), T_, heads, hd_, int64_t(heads) * hd_, w.data(), eps());
  }

  void rope_write_kv(int layer, Buf q, Buf k, Buf v) override {
    ops::apply_rope_cpu(buf(q), buf(k), step_->positions.data(), T_, inv_freq_.data(), rope_);
    CpuLayer& l = layers_[size_t(layer)];
    ops::write_kv_cache_cpu(buf(k), buf(v), step_->slots.data(), T_, attn_, lim_.kv_num_blocks,
                            lim_.kv_block_size, l.k_cache.data(), l.v_cache.data());
  }

  void prefill_attention(Buf q, Buf k, Buf v, Buf out) override {
    ops::prefill_attention_cpu(buf(q), buf(k), buf(v), step_->cu_seqlens.data(),
                               step_->num_seqs(), attn_, buf(out));
  }

  void decode_attention(int layer, Buf q, Buf out) override {
    ops::paged_decode_attention_cpu(buf(q), paged_kv(layer), step_->num_seqs(), attn_, buf(out));
  }

  void extend_attention(int layer, Buf q, Buf out) override {
    ops::paged_extend_attention_cpu(buf(q), step_->cu_seqlens.data(), step_->num_seqs(),
                                    paged_kv(layer), attn_, buf(out));
  }

  void mla_attention(int layer, Buf q, Buf kv_a, Buf out) override {
    TETRA_CHECK(mla_, "mla_attention on a GQA model");
    CpuLayer& l = layers_[size_t(layer)];
    const int32_t* pos = step_->positions.data();
    const int64_t num_slots = int64_t(lim_.kv_num_blocks) * lim_.kv_block_size;
    ops::mla_cache_write_cpu(buf(kv_a), l.kv_a_norm.data(), kMlaLatentNormEps, pos,
                             step_->slots.data(), T_, inv_freq_.data(), mla_shape_, num_slots,
                             l.k_cache.data());
    ops::mla_absorb_q_cpu(buf(q), l.kv_b.data(), pos, T_, inv_freq_.data(), mla_shape_,
                          buf(Buf::QAbsorbed));
    ops::MlaKeys keys = mla_keys();
    if (dsa_) {  // the keys the last indexer layer picked (this one or the one before "shared")
      keys.selected = selection_.data();
      keys.selected_stride = dsa_shape_.topk;
    }
    ops::mla_attention_cpu(buf(Buf::QAbsorbed), l.k_cache.data(), num_slots,
                           step_->cu_seqlens.data(), step_->num_seqs(), pos, keys, mla_shape_,
                           buf(Buf::AttnLatent));
    ops::mla_up_v_cpu(buf(Buf::AttnLatent), l.kv_b.data(), T_, mla_shape_, buf(out));
  }

  void dsa_select(int layer, Buf q_idx, Buf k_idx, Buf w_idx) override {
    TETRA_CHECK(dsa_, "dsa_select on a model without a DSA indexer");
    CpuLayer& l = layers_[size_t(layer)];
    TETRA_CHECK(!l.idx_cache.empty(), "layer ", layer, " has no indexer");
    const int32_t* pos = step_->positions.data();
    const int64_t num_slots = int64_t(lim_.kv_num_blocks) * lim_.kv_block_size;
    ops::dsa_index_keys_cpu(buf(k_idx), l.idx_ln_w.data(), l.idx_ln_b.data(), kDsaKeyNormEps, pos,
                            step_->slots.data(), T_, inv_freq_.data(), dsa_shape_, num_slots,
                            l.idx_cache.data());
    ops::dsa_select_cpu(buf(q_idx), buf(w_idx), l.idx_cache.data(), num_slots,
                        step_->cu_seqlens.data(), step_->num_seqs(), pos, mla_keys(),
                        inv_freq_.data(), dsa_shape_, selection_.data());
  }

  void silu_mul(Buf gate, Buf up, int64_t width, Buf out) override {
    const int64_t gw = buf_width(gate, c_), uw = buf_width(up, c_), ow = buf_width(out, c_);
    TETRA_CHECK(width <= gw && width <= uw && width <= ow, "silu_mul width ", width, " too wide");
    const uint16_t* g = buf(gate);
    const uint16_t* u = buf(up);
    uint16_t* o = buf(out);
    for (int t = 0; t < T_; ++t)
      for (int64_t i = 0; i < width; ++i) {
        const float a = bf16_to_float(g[t * gw + i]);
        const float b = bf16_to_float(u[t * uw + i]);
        o[t * ow + i] = float_to_bf16(a / (1.0f + std::exp(-a)) * b);
      }
  }

  void moe(int layer, Buf in, Buf out) override {
    moe::MoeLayerRunner* m = layers_[size_t(layer)].moe.get();
    TETRA_CHECK(m != nullptr, "layer ", layer, " is not a MoE layer");
    m->forward(buf(in), T_, buf(out), nullptr, nullptr);
  }

  void logits(Buf in) override {
    const int R = step_->num_logit_rows();
    const int64_t K = lm_head_.k, iw = buf_width(in, c_);
    std::vector<float> x(size_t(R) * K);  // [R, K] selected rows
    const uint16_t* src = buf(in);
    for (int r = 0; r < R; ++r)
      for (int64_t k = 0; k < K; ++k)
        x[size_t(r) * K + k] = bf16_to_float(src[step_->logit_rows[size_t(r)] * iw + k]);
    matmul_f32(x.data(), R, lm_head_, logits_.data());
  }

  void read_logits(float* out) override {
    std::memcpy(out, logits_.data(),
                size_t(step_->num_logit_rows()) * size_t(c_.vocab_size) * sizeof(float));
  }

  void sample(const SampleBatch& s, int32_t* tokens) override {
    const int R = step_->num_logit_rows();
    const size_t V = size_t(c_.vocab_size);
    if (s.logit_rows == nullptr) {
      TETRA_CHECK(s.rows <= R, "sample: ", s.rows, " rows of a step with ", R, " logit rows");
      ops::sample_cpu(logits_.data(), s.rows, int(V), s.params, s.history, tokens, s.bias);
      return logprobs_of_sampled(*this, s, tokens);
    }
    std::vector<float> picked(size_t(s.rows) * V);  // [rows, vocab] the sampled logit rows
    for (int i = 0; i < s.rows; ++i) {
      const int r = s.logit_rows[i];
      TETRA_CHECK(r >= 0 && r < R, "sample: logit row ", r, " outside [0, ", R, ")");
      std::copy_n(logits_.data() + size_t(r) * V, V, picked.data() + size_t(i) * V);
    }
    ops::sample_cpu(picked.data(), s.rows, int(V), s.params, s.history, tokens, s.bias);
    logprobs_of_sampled(*this, s, tokens);
  }

  void logprobs(const ops::LogprobQuery* queries, int n, ops::PositionLogprobs* out) override {
    for (int i = 0; i < n; ++i)
      ops::check_logprob_query(queries[i], step_->num_logit_rows(), c_.vocab_size);
    parallel_for(n, 4, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const ops::LogprobQuery& q = queries[i];
        out[i] = ops::position_logprobs(logits_.data() + size_t(q.row) * size_t(c_.vocab_size),
                                        c_.vocab_size, q.token, q.top);
      }
    });
  }

  void copy_kv_blocks(const std::vector<runtime::BlockCopy>& copies) override {
    if (copies.empty()) return;
    std::vector<int32_t> pairs;  // [n, 2] (src, dst)
    for (const runtime::BlockCopy& c : copies) {
      pairs.push_back(c.src);
      pairs.push_back(c.dst);
    }
    const int64_t block_elems = int64_t(lim_.kv_block_size) * kv_row_elems();
    for (CpuLayer& l : layers_) {
      ops::copy_kv_blocks_cpu(l.k_cache.data(), mla_ ? nullptr : l.v_cache.data(), pairs.data(),
                              int(copies.size()), lim_.kv_num_blocks, block_elems);
      if (!l.idx_cache.empty())
        ops::copy_kv_blocks_cpu(l.idx_cache.data(), nullptr, pairs.data(), int(copies.size()),
                                lim_.kv_num_blocks, int64_t(lim_.kv_block_size) * c_.index_head_dim);
    }
  }

 private:
  const CpuLinear& get_linear(LinearId which, int layer) const {
    const CpuLayer& l = layers_.at(size_t(layer));
    switch (which) {
      case LinearId::Q: return l.q;
      case LinearId::K: return l.k;
      case LinearId::V: return l.v;
      case LinearId::O: return l.o;
      case LinearId::DenseGate: return l.gate;
      case LinearId::DenseUp: return l.up;
      case LinearId::DenseDown: return l.down;
      case LinearId::QA: return l.q_a;
      case LinearId::KvA: return l.kv_a;
      case LinearId::IdxQ: return l.idx_wq_b;
      case LinearId::IdxK: return l.idx_wk;
      case LinearId::IdxW: return l.idx_wproj;
    }
    TETRA_FAIL("unknown linear");
  }

  const uint16_t* norm_weight(NormId which, int layer) const {
    switch (which) {
      case NormId::Input: return layers_.at(size_t(layer)).input_norm.data();
      case NormId::PostAttention: return layers_.at(size_t(layer)).post_norm.data();
      case NormId::Final: return final_norm_.data();
      case NormId::QLatent: {
        const std::vector<uint16_t>& w = layers_.at(size_t(layer)).q_a_norm;
        TETRA_CHECK(!w.empty(), "layer ", layer, " has no q_a_layernorm");
        return w.data();
      }
      default: TETRA_FAIL("rms_norm takes Input, PostAttention, QLatent or Final (head norms: head_norm)");
    }
  }

  // y [T, n] (row stride ys) = bf16(x [T, k] (row stride xs) . W^T + b).
  void matmul_bf16(const uint16_t* x, int64_t xs, const CpuLinear& l, uint16_t* y, int64_t ys) {
    std::vector<float> xf(size_t(T_) * l.k);  // [T, k]
    for (int t = 0; t < T_; ++t)
      for (int64_t i = 0; i < l.k; ++i) xf[size_t(t * l.k + i)] = bf16_to_float(x[t * xs + i]);
    std::vector<float> yf(size_t(T_) * l.n);  // [T, n]
    matmul_f32(xf.data(), T_, l, yf.data());
    for (int t = 0; t < T_; ++t)
      for (int64_t j = 0; j < l.n; ++j) y[t * ys + j] = float_to_bf16(yf[size_t(t * l.n + j)]);
  }

  // y [rows, n] = x [rows, k] . W^T + b, float32, parallel over output features.
  static void matmul_f32(const float* x, int rows, const CpuLinear& l, float* y) {
    const int64_t per_feature = std::max<int64_t>(1, int64_t(rows) * l.k);
    parallel_for(l.n, std::max<int64_t>(1, 200000 / per_feature), [&](int64_t n0, int64_t n1) {
      for (int r = 0; r < rows; ++r) {
        const float* xr = x + size_t(r) * l.k;
        for (int64_t j = n0; j < n1; ++j) {
          const float* wr = l.w.data() + size_t(j) * l.k;
          float acc = 0.0f;
          for (int64_t i = 0; i < l.k; ++i) acc += xr[i] * wr[i];
          y[size_t(r) * l.n + j] = acc + (l.bias.empty() ? 0.0f : l.bias[size_t(j)]);
        }
      }
    });
  }

  // Elements per token of one layer's cache (of each of k and v for GQA).
  int64_t kv_row_elems() const { return mla_ ? mla_shape_.row() : int64_t(nkv_) * hd_; }

  // Where the MLA attention's keys live: the step's own slots for a prefill without a cached
  // prefix, else the block tables.
  ops::MlaKeys mla_keys() const {
    ops::MlaKeys k;
    if (step_->kind == StepKind::Prefill && !step_->has_cached_prefix()) {
      k.step_slots = step_->slots.data();
      return k;
    }
    k.block_tables = step_->block_tables.data();
    k.max_blocks_per_seq = step_->max_blocks_per_seq;
    k.block_size = lim_.kv_block_size;
    return k;
  }

  // Layer's cache with the step's block tables (decode, prefix prefill).
  ops::PagedKv paged_kv(int layer) const {
    const CpuLayer& l = layers_[size_t(layer)];
    ops::PagedKv kv;
    kv.k_cache = l.k_cache.data();
    kv.v_cache = l.v_cache.data();
    kv.block_tables = step_->block_tables.data();
    kv.seq_lens = step_->seq_lens.data();
    kv.num_blocks = lim_.kv_num_blocks;
    kv.block_size = lim_.kv_block_size;
    kv.max_blocks_per_seq = step_->max_blocks_per_seq;
    return kv;
  }

  uint16_t* buf(Buf b) { return bufs_[size_t(b)].data(); }
  float eps() const { return float(c_.rms_norm_eps); }

  ModelConfig c_;
  OpsLimits lim_;
  int H_ = 0, hd_ = 0, nh_ = 0, nkv_ = 0;
  std::vector<uint16_t> embedding_;   // [vocab, H] bf16
  std::vector<uint16_t> final_norm_;  // [H] bf16
  CpuLinear lm_head_;                 // [vocab, H]
  std::vector<CpuLayer> layers_;
  std::vector<float> inv_freq_;       // [rotary_dim / 2]
  ops::RopeShape rope_;        // GQA
  ops::AttentionShape attn_;   // GQA
  bool mla_ = false;
  ops::MlaShape mla_shape_;    // MLA
  bool dsa_ = false;           // GLM-5's DSA indexer
  ops::DsaShape dsa_shape_;
  std::vector<int32_t> selection_;  // [max_tokens, index_topk] the keys each token reads
  std::array<std::vector<uint16_t>, size_t(Buf::Count)> bufs_;  // each [max_tokens, width] bf16
  std::vector<float> logits_;         // [max_tokens, vocab] f32, first R rows valid
  const StepBatch* step_ = nullptr;
  int T_ = 0;
  CpuAllReduceHook all_reduce_;  // tensor parallel sum, or empty
};

}  // namespace

std::unique_ptr<ModelOps> make_cpu_model_ops() { return std::make_unique<CpuModelOps>(); }
std::unique_ptr<ModelOps> make_cpu_model_ops(CpuAllReduceHook hook) {
  return std::make_unique<CpuModelOps>(std::move(hook));
}

}  // namespace tetra::model
