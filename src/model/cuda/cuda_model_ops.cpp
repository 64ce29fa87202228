// CudaModelOps: see cuda_model_ops.h.
#include "model/cuda/cuda_model_ops.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/half.h"
#include "model/cuda/cuda_moe_block.h"
#include "model/cuda/device_mem.h"
#include "model/cuda/device_sampler.h"
#include "model/attention_shapes.h"
#include "model/moe_layer_views.h"
#include "model/cuda/split_decode_attention.h"
#include "model/cuda/split_decode_plan.h"
#include "model/tensor_to_float.h"
#include "moe/moe_layer.h"
#include "ops/attention/attention_cuda.h"
#include "ops/attention/dsa_cuda.h"
#include "ops/attention/mla_cuda.h"
#include "ops/attention/paged_extend_attention.h"
#include "ops/elementwise/elementwise_cuda.h"
#include "ops/linear/linear_cuda.h"
#include "ops/moe/moe_ops_cuda.h"
#include "ops/norm/rms_norm_cuda.h"
#include "ops/rope/rope_cuda.h"
#include "ops/rope/rope_kv_cuda.h"
#include "ops/sampling/sampling.h"

namespace tetra::model::cuda {
namespace {

namespace lin = ::tetra::ops::cuda;

// ---- random fills (prepare_random) --------------------------------------------------------
// ue5m3 codes (moe/expert_weights.h): (e + 10) << 3 | m is 2^e (1 + m/8); e in [-3, -2].
constexpr uint8_t kRandomScaleLo = 7 << 3, kRandomScaleHi = (8 << 3) | 7;

void fill_random_nvfp4(lin::Nvfp4LinearBuffer& b, int k, uint64_t& seed, cudaStream_t s) {
  const auto& v = b.view();
  TETRA_CUDA_CHECK(lin::fill_random_bytes(b.weight_mut(), int64_t(packed_weight_bytes(v.n, v.k)),
                                          seed++, s));
  TETRA_CUDA_CHECK(lin::fill_random_byte_range(b.scale_mut(), int64_t(packed_scale_bytes(v.n, v.k)),
                                               kRandomScaleLo, kRandomScaleHi, seed++, s));
  // |E2M1| averages ~2.6 and the scales ~0.2: alpha 2^10 * 1/(0.5 sqrt(k)) keeps |y| ~ |x|.
  const float alpha = 1024.0f * float(2.0 / std::sqrt(double(k)));
  TETRA_CUDA_CHECK(lin::fill_f32(b.alpha_mut(), v.gated ? 2 : 1, alpha, s));
}

// ---- one linear on the device -------------------------------------------------------------
struct DevLinear {
  int n = 0, k = 0;
  bool nvfp4 = false;
  bool gated = false;          // NVFP4 gate/up pair packed together (dense MLP)
  lin::Nvfp4LinearBuffer q;    // NVFP4
  DeviceMem w;                 // BF16 [n, k]
  DeviceMem bias;              // BF16 [n] or empty
  size_t bytes() const { return q.bytes() + w.bytes() + bias.bytes(); }
};

DeviceMem upload_bf16(const TensorView& t) {
  const std::vector<uint16_t> h = tensor_to_bf16(t);
  DeviceMem d(h.size() * 2);
  d.upload(h.data(), h.size() * 2);
  return d;
}

// A linear's weight [n, k] as bf16, NVFP4 dequantized on the host (MLA's kv_b: the absorbed
// attention reads it per head as bf16, ops/attention/mla.h).
DeviceMem upload_as_bf16(const LinearWeight& lw) {
  std::vector<uint16_t> h;
  for (float x : linear_to_float(lw)) h.push_back(float_to_bf16(x));
  DeviceMem d(h.size() * 2);
  d.upload(h.data(), h.size() * 2);
  return d;
}

DeviceMem random_bf16(int64_t n, float a, uint64_t& seed, cudaStream_t s) {
  DeviceMem d(size_t(n) * 2);
  TETRA_CUDA_CHECK(lin::fill_random_bf16(d.as<uint16_t>(), n, a, seed++, s));
  return d;
}

DeviceMem const_bf16(int64_t n, float v, cudaStream_t s) {
  DeviceMem d(size_t(n) * 2);
  TETRA_CUDA_CHECK(lin::fill_bf16(d.as<uint16_t>(), n, v, s));
  return d;
}

std::unique_ptr<DevLinear> make_linear(const LinearWeight& lw, bool random, uint64_t& seed,
                                       cudaStream_t s) {
  auto l = std::make_unique<DevLinear>();
  l->n = int(lw.out_features);
  l->k = int(lw.in_features);
  // An NVFP4 shape the W4A16 kernels lack (k not a multiple of 64, n of 32: only tiny models'
  // MLA projections, e.g. kv_a's kv_lora + rope = 48) runs as bf16, dequantized on the host.
  l->nvfp4 = lw.quantized && lin::nvfp4_linear_unsupported_reason(l->n, l->k, false).empty();
  if (lw.quantized && !l->nvfp4) {
    l->w = random ? random_bf16(int64_t(l->n) * l->k, float(1.0 / std::sqrt(double(l->k))), seed, s)
                  : upload_as_bf16(lw);
  } else if (lw.quantized) {
    if (random) {
      l->q = lin::Nvfp4LinearBuffer::allocate(l->n, l->k, false);
      fill_random_nvfp4(l->q, l->k, seed, s);
    } else {
      l->q = lin::Nvfp4LinearBuffer(nvfp4_view(lw));
    }
  } else {
    l->w = random ? random_bf16(int64_t(l->n) * l->k, float(1.0 / std::sqrt(double(l->k))), seed, s)
                  : upload_bf16(lw.weight);
  }
  if (lw.bias) l->bias = random ? random_bf16(l->n, 0.1f, seed, s) : upload_bf16(*lw.bias);
  return l;
}

// Dense MLP gate+up: NVFP4 packed as one gated matrix when both are NVFP4 without bias.
std::unique_ptr<DevLinear> make_gate_up(const MlpWeights& m, bool random, uint64_t& seed,
                                        cudaStream_t s) {
  if (!(m.gate.quantized && m.up.quantized) || m.gate.bias || m.up.bias) return nullptr;
  auto l = std::make_unique<DevLinear>();
  l->n = int(m.gate.out_features);
  l->k = int(m.gate.in_features);
  l->nvfp4 = true;
  l->gated = true;
  if (random) {
    l->q = lin::Nvfp4LinearBuffer::allocate(l->n, l->k, true);
    fill_random_nvfp4(l->q, l->k, seed, s);
  } else {
    l->q = lin::Nvfp4LinearBuffer(nvfp4_view(m.gate), nvfp4_view(m.up));
  }
  return l;
}

struct DevLayer {
  DeviceMem input_norm, post_norm;  // [H] bf16
  DeviceMem q_norm, k_norm;         // [head_dim] bf16 or empty
  std::unique_ptr<DevLinear> q, k, v, o;
  // MLA: q_a (q compression, else null), kv_a, their norms, kv_b as bf16 (ops/attention/mla.h).
  std::unique_ptr<DevLinear> q_a, kv_a;
  DeviceMem q_a_norm, kv_a_norm;  // [q_lora], [kv_lora] bf16
  DeviceMem kv_b;                 // [n_heads * (nope + v), kv_lora] bf16
  // DSA indexer layers: its linears, the key LayerNorm [D] and the index-key cache
  // [num_blocks, block_size, index_head_dim] bf16.
  std::unique_ptr<DevLinear> idx_wq_b, idx_wk, idx_wproj;
  DeviceMem idx_ln_w, idx_ln_b, idx_cache;
  std::unique_ptr<DevLinear> gate_up;          // fused NVFP4 gate/up (dense), or null
  std::unique_ptr<DevLinear> gate, up, down;   // dense (gate/up null when fused)
  std::unique_ptr<moe::MoeLayerRunner> moe;
  // GQA: k/v [num_blocks, block_size, n_kv, head_dim]; MLA: k [num_blocks, block_size,
  // kv_lora + rope] (the latent rows), v empty. bf16.
  DeviceMem k_cache, v_cache;
};

// Step arrays: one pinned host block and one device block with the same offsets, one copy.
struct StepArrays {
  // plan: the decode attention's (split_decode_plan.h), last, so a step copies only its part.
  size_t tokens = 0, positions = 0, slots = 0, cu = 0, tables = 0, lens = 0, rows = 0, plan = 0,
         end = 0;
  void layout(int max_tokens, int max_seqs, int mbps) {
    auto take = [&](size_t bytes) {
      const size_t at = end;
      end += (bytes + 255) / 256 * 256;
      return at;
    };
    slots = take(size_t(max_tokens) * 8);
    tokens = take(size_t(max_tokens) * 4);
    positions = take(size_t(max_tokens) * 4);
    cu = take(size_t(max_seqs + 1) * 4);
    tables = take(size_t(max_seqs) * mbps * 4);
    lens = take(size_t(max_seqs) * 4);
    rows = take(size_t(max_tokens) * 4);
    plan = take(split_decode_plan_ints(max_seqs, kMaxSplits) * 4);
  }
};

class CudaModelOps final : public CudaModelOpsApi {
 public:
  CudaModelOps() = default;
  ~CudaModelOps() override {
    for (auto& [b, g] : graphs_) cudaGraphExecDestroy(g);
    if (staged_) cudaEventDestroy(staged_);
    if (host_) cudaFreeHost(host_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }
  void set_options(const CudaOpsOptions& o) override { opt_ = o; }
  size_t weight_bytes() const override { return weight_bytes_; }
  size_t device_bytes() const override {
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    return total - free_b;
  }
  void synchronize() override { TETRA_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  int graphs_captured() const override { return int(graphs_.size()); }
  int64_t folded_post_norms() const override { return folded_post_norms_; }
  int64_t folded_routers() const override { return folded_routers_; }
  int64_t folded_input_norms() const override { return folded_input_norms_; }
  void* stream() const override { return stream_; }

  void prepare(const ModelWeights& w, const OpsLimits& lim) override { setup(w, lim, false, 0); }
  void prepare_random(const ModelWeights& w, const OpsLimits& lim, uint64_t seed) override {
    setup(w, lim, true, seed);
  }

  void begin_step(const StepBatch& step) override {
    TETRA_CHECK(stream_ != nullptr, "cuda model ops used before prepare()");
    step_ = &step;
    folded_norm_layer_ = -1;
    S_ = step.num_seqs();
    R_ = step.num_logit_rows();
    mode_ = Mode::Eager;
    int bucket = 0;
    if (opt_.graphs && !host_moe_ && step.kind == StepKind::Decode && R_ > 0) bucket = bucket_of(S_);
    T_ = bucket > 0 ? bucket : step.num_tokens();
    const int S_run = bucket > 0 ? bucket : S_;
    const int R_run = bucket > 0 ? bucket : R_;
    S_run_ = S_run;
    R_run_ = R_run;
    // Decode attention splits for this step's longest context; graphs are kept per (bucket,
    // splits), so a context crossing a split threshold captures one more graph (at most five
    // per bucket) instead of replaying a split count chosen for another length.
    attn_splits_ = 0;
    if (split_decode_ && step.kind == StepKind::Decode) {
      int max_len = 0;
      for (int s = 0; s < S_; ++s) max_len = std::max(max_len, step.seq_lens[size_t(s)]);
      attn_splits_ = split_decode_auto_splits(S_run, attn_, max_len);
    }
    stage(step, S_run, R_run);
    max_seqlen_ = 0;
    for (int s = 0; s < S_; ++s)
      max_seqlen_ = std::max(max_seqlen_, step.cu_seqlens[s + 1] - step.cu_seqlens[s]);
    if (bucket > 0) {
      const GraphKey key{bucket, attn_splits_};
      auto it = graphs_.find(key);
      if (it != graphs_.end()) {
        mode_ = Mode::Replay;
        replay_ = it->second;
      } else {
        mode_ = Mode::Capture;
        capture_key_ = key;
        TETRA_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      }
    }
  }

  void embed(Buf out) override {
    if (skip()) return;
    ck(lin::embedding_gather(embedding_.as<uint16_t>(), int(c_.vocab_size), H_, d_tokens(), T_,
                             buf(out), stream_));
  }
  void rms_norm(NormId which, int layer, Buf in, Buf out) override {
    if (skip()) return;
    const bool latent = which == NormId::QLatent;
    ck(ops::cuda::rms_norm(buf(in), norm_weight(which, layer), T_,
                           latent ? int(c_.q_lora_rank) : H_, latent ? kMlaLatentNormEps : eps(),
                           buf(out), stream_));
  }
  void add_rms_norm(NormId which, int layer, Buf x, Buf residual, Buf out) override {
    if (skip()) return;
    ck(ops::cuda::fused_add_rms_norm(buf(x), buf(residual), norm_weight(which, layer), T_, H_,
                                     eps(), buf(out), stream_));
  }
  void linear(LinearId which, int layer, Buf in, Buf out) override {
    if (skip()) return;
    expect_normalised(in);
    const DevLinear* l = get_linear(layers_.at(size_t(layer)), which);
    TETRA_CHECK(l != nullptr, "layer ", layer, " has no ", linear_id_name(which));
    run_linear(*l, buf(in), T_, buf(out), DType::BF16);
  }
  // NVFP4 q/k/v: one launch writes all three with their biases (the GEMVs up to 64 rows, the
  // wgmma kernel from lin::kNvfp4WgmmaOutputsMinRows).
  // With the layer's input norm folded into the MoE combine before it (input_norm_fold), `in`
  // holds gx and the GEMV applies 1/rms.
  void qkv(int layer, Buf in, Buf q, Buf k, Buf v) override {
    if (skip()) return;
    DevLayer& L = layers_.at(size_t(layer));
    if (!nvfp4_qkv(L)) {
      expect_normalised(in);
      return ModelOps::qkv(layer, in, q, k, v);
    }
    const std::array<lin::Nvfp4GemvOutput, 3> outs = qkv_outputs(L, buf(q), buf(k), buf(v));
    if (folded_norm_layer_ >= 0) {
      TETRA_CHECK(folded_norm_layer_ == layer && in == Buf::Normed, "q/k/v of layer ", layer,
                  " after the input norm of layer ", folded_norm_layer_, " was folded");
      folded_norm_layer_ = -1;
      return ck(lin::linear_nvfp4_gemv_norm_folded(outs.data(), 3, buf(in), T_, folded_norm_,
                                                   stream_));
    }
    if (!x_wgmma_.empty() && lin::nvfp4_wgmma_outputs_unsupported_reason(outs.data(), 3, T_).empty())
      return ck(lin::linear_nvfp4_wgmma(outs.data(), 3, buf(in), T_, *rows_,
                                        x_wgmma_.as<uint16_t>(), stream_));
    if (lin::nvfp4_gemv_unsupported_reason(outs.data(), 3, T_).empty())
      return ck(lin::linear_nvfp4_gemv(outs.data(), 3, buf(in), T_, stream_));
    ModelOps::qkv(layer, in, q, k, v);
  }
  // A fused NVFP4 gate/up matrix: one launch writes silu(gate) * up into `gate`.
  void dense_gate_up(int layer, Buf in, Buf gate, Buf up, int64_t width) override {
    if (skip()) return;
    expect_normalised(in);
    DevLayer& L = layers_.at(size_t(layer));
    if (!L.gate_up) return ModelOps::dense_gate_up(layer, in, gate, up, width);
    TETRA_CHECK(width == buf_width(gate, c_), "dense_gate_up over a part of a row (width ",
                width, ")");
    ck(lin::gate_up_silu_nvfp4(L.gate_up->q.view(), buf(in), T_, *rows_, buf(gate), stream_));
  }
  void head_norm(NormId which, int layer, Buf x) override {
    if (skip()) return;
    const bool q = which == NormId::QHead;
    const DevLayer& L = layers_.at(size_t(layer));
    const DeviceMem& w = q ? L.q_norm : L.k_norm;
    TETRA_CHECK(!w.empty(), "layer ", layer, " has no q/k norm");
    const int heads = q ? nh_ : nkv_;
    ck(ops::cuda::head_rms_norm(buf(x), T_, heads, hd_, int64_t(heads) * hd_, w.as<uint16_t>(),
                                eps(), stream_));
  }
  // Both head norms as one programmatic-dependent launch (bit-identical to the two launches):
  // at batch 1 each separate launch cost ~3 us per layer (Qwen3-30B-A3B, GLM-4.7).
  void qk_head_norm(int layer, Buf q, Buf k) override {
    if (skip()) return;
    const DevLayer& L = layers_.at(size_t(layer));
    TETRA_CHECK(!L.q_norm.empty() && !L.k_norm.empty(), "layer ", layer, " has no q/k norm");
    ck(ops::cuda::head_rms_norm_qk(buf(q), int64_t(nh_) * hd_, nh_, L.q_norm.as<uint16_t>(),
                                   buf(k), int64_t(nkv_) * hd_, nkv_, L.k_norm.as<uint16_t>(), T_,
                                   hd_, eps(), stream_));
  }
  // RoPE and the KV-cache write as one kernel (bit-identical to apply_rope + write_kv_cache).
  void rope_write_kv(int layer, Buf q, Buf k, Buf v) override {
    if (skip()) return;
    TETRA_CHECK(q != k && q != v && k != v, "rope_write_kv takes three distinct buffers");
    DevLayer& L = layers_.at(size_t(layer));
    ck(ops::cuda::rope_and_write_kv(buf(q), buf(k), buf(v), attn_.kv_step(), d_positions(),
                                    d_slots(), T_, inv_freq_.as<float>(), rope_,
                                    int64_t(lim_.kv_num_blocks) * lim_.kv_block_size,
                                    L.k_cache.as<uint16_t>(), L.v_cache.as<uint16_t>(), stream_));
  }
  void prefill_attention(Buf q, Buf k, Buf v, Buf out) override {
    if (skip()) return;
    ck(ops::cuda::prefill_attention(buf(q), buf(k), buf(v), d_cu(), S_, max_seqlen_, attn_,
                                    buf(out), stream_));
  }
  // Chunked prefill / recompute: the step's tokens attend to their sequence's cached prefix and
  // to themselves (rope_write_kv already put them in the cache).
  void extend_attention(int layer, Buf q, Buf out) override {
    if (skip()) return;
    ck(ops::cuda::paged_extend_attention(buf(q), d_cu(), S_, T_, paged_kv(layer), attn_, buf(out),
                                         stream_));
  }
  // The split kernel starts its cache reads before the kernel right before it on the stream
  // ends (PredecessorWrites::QAndNewKvRow). That holds here: run_forward calls decode_attention
  // right after rope_write_kv, one rope_and_write_kv launch that writes q in place and, of this
  // layer's cache, only the step's token slots; a decode step has one token per sequence at
  // position seq_lens[s] - 1 (StepBatch::validate) whose slot the engine takes from the same
  // block table (PagedKvCache::append; copy-on-write makes the written block the sequence's
  // own, and copy_kv_blocks synchronizes before the step). Graph padding rows write nothing and
  // padded sequences repeat sequence 0. Tables and lengths come from stage()'s copy, which the
  // step's first kernel waits for; earlier layers and steps write other layers or older rows.
  void decode_attention(int layer, Buf q, Buf out) override {
    if (skip()) return;
    const ops::PagedKv kv = paged_kv(layer);
    if (split_decode_)
      ck(split_decode_attention(buf(q), kv, S_run_, attn_, buf(out), stream_, attn_splits_,
                                PredecessorWrites::QAndNewKvRow, nullptr, d_plan()));
    else
      ck(ops::cuda::paged_decode_attention(buf(q), kv, S_run_, attn_, attn_ws_.as(),
                                           attn_ws_.bytes(), buf(out), stream_));
  }
  // RoPE, the KV write and the attention as one launch (DecodeRope): the attention turns q and
  // the new k row itself and stores the new rows at the step's slots, as rope_and_write_kv would.
  // Its predecessor is then the q/k/v projection, which writes only q, k and v.
  void rope_decode_attention(int layer, Buf q, Buf k, Buf v, Buf out) override {
    if (skip()) return;
    if (!rope_in_attention_) return ModelOps::rope_decode_attention(layer, q, k, v, out);
    TETRA_CHECK(q != k && q != v && k != v, "rope_decode_attention takes three distinct buffers");
    DevLayer& L = layers_.at(size_t(layer));
    DecodeRope r;
    r.k_new = buf(k);
    r.v_new = buf(v);
    r.k_stride = rope_.k_stride;
    r.v_stride = attn_.kv_step();
    r.positions = d_positions();
    r.slots = d_slots();
    r.num_slots = int64_t(lim_.kv_num_blocks) * lim_.kv_block_size;
    r.k_cache = L.k_cache.as<uint16_t>();
    r.v_cache = L.v_cache.as<uint16_t>();
    r.inv_freq = inv_freq_.as<float>();
    r.rotary_dim = rope_.rotary_dim;
    r.neox = rope_.style == ops::RopeStyle::NeoX;
    ck(split_decode_attention(buf(q), paged_kv(layer), S_run_, attn_, buf(out), stream_,
                              attn_splits_, PredecessorWrites::QAndNewKvRow, &r, d_plan()));
  }
  void mla_attention(int layer, Buf q, Buf kv_a, Buf out) override {
    if (skip()) return;
    TETRA_CHECK(mla_, "mla_attention on a GQA model");
    DevLayer& L = layers_.at(size_t(layer));
    const int64_t num_slots = int64_t(lim_.kv_num_blocks) * lim_.kv_block_size;
    const float* inv = inv_freq_.as<float>();
    uint16_t* cache = L.k_cache.as<uint16_t>();
    const uint16_t* kv_b = L.kv_b.as<uint16_t>();
    ck(ops::cuda::mla_cache_write(buf(kv_a), L.kv_a_norm.as<uint16_t>(), kMlaLatentNormEps,
                                  d_positions(), d_slots(), T_, inv, mla_shape_, num_slots, cache,
                                  stream_));
    ck(ops::cuda::mla_absorb_q(buf(q), kv_b, d_positions(), T_, inv, mla_shape_,
                               buf(Buf::QAbsorbed), stream_));
    ops::MlaKeys keys = mla_keys();
    if (dsa_) {  // the keys the last indexer layer picked (this one or the one before "shared")
      keys.selected = selection_.as<int32_t>();
      keys.selected_stride = dsa_shape_.topk;
    }
    ck(ops::cuda::mla_attention(buf(Buf::QAbsorbed), cache, num_slots, d_cu(), S_run_, T_,
                                d_positions(), keys, mla_shape_, buf(Buf::AttnLatent),
                                mla_ws_.as<void>(), mla_ws_.bytes(), stream_));
    ck(ops::cuda::mla_up_v(buf(Buf::AttnLatent), kv_b, T_, mla_shape_, buf(out), stream_));
  }
  void dsa_select(int layer, Buf q_idx, Buf k_idx, Buf w_idx) override {
    if (skip()) return;
    TETRA_CHECK(dsa_, "dsa_select on a model without a DSA indexer");
    DevLayer& L = layers_.at(size_t(layer));
    TETRA_CHECK(!L.idx_cache.empty(), "layer ", layer, " has no indexer");
    const int64_t num_slots = int64_t(lim_.kv_num_blocks) * lim_.kv_block_size;
    const float* inv = inv_freq_.as<float>();
    uint16_t* cache = L.idx_cache.as<uint16_t>();
    ck(ops::cuda::dsa_index_keys(buf(k_idx), L.idx_ln_w.as<uint16_t>(), L.idx_ln_b.as<uint16_t>(),
                                 kDsaKeyNormEps, d_positions(), d_slots(), T_, inv, dsa_shape_,
                                 num_slots, cache, stream_));
    ck(ops::cuda::dsa_select(buf(q_idx), buf(w_idx), cache, num_slots, d_cu(), S_run_,
                             d_positions(), mla_keys(), inv, dsa_shape_,
                             selection_.as<int32_t>(), T_, dsa_max_keys_, dsa_ws_.as(),
                             dsa_ws_.bytes(), stream_));
  }
  void silu_mul(Buf gate, Buf up, int64_t width, Buf out) override {
    if (skip()) return;
    // Gate, Up and out rows are [T, width] with no padding, so the op runs over T * width.
    TETRA_CHECK(width == buf_width(gate, c_) && width == buf_width(up, c_) &&
                    width == buf_width(out, c_),
                "silu_mul over a part of a row is not supported (width ", width, ")");
    ck(lin::silu_mul_split(buf(gate), buf(up), int64_t(T_) * width, buf(out), stream_));
  }
  void moe(int layer, Buf in, Buf out) override {
    if (skip()) return;
    DevLayer& L = layers_.at(size_t(layer));
    TETRA_CHECK(L.moe != nullptr, "layer ", layer, " is not a MoE layer");
    const int chunk = L.moe->max_tokens();
    if (!L.moe->on_device()) {  // host runner: copy in, run, copy out (never inside a graph)
      host_x_.resize(size_t(chunk) * H_);
      host_y_.resize(size_t(chunk) * H_);
    }
    for (int t0 = 0; t0 < T_; t0 += chunk) {
      const int n = std::min(chunk, T_ - t0);
      const uint16_t* x = buf(in) + size_t(t0) * H_;
      uint16_t* y = buf(out) + size_t(t0) * H_;
      if (L.moe->on_device()) {
        L.moe->forward(x, n, y, nullptr, stream_);
        continue;
      }
      const size_t bytes = size_t(n) * H_ * 2;
      TETRA_CUDA_CHECK(cudaMemcpyAsync(host_x_.data(), x, bytes, cudaMemcpyDeviceToHost, stream_));
      synchronize();
      L.moe->forward(host_x_.data(), n, host_y_.data(), nullptr, nullptr);
      TETRA_CUDA_CHECK(cudaMemcpyAsync(y, host_y_.data(), bytes, cudaMemcpyHostToDevice, stream_));
      synchronize();  // host_y_ is reused by the next chunk / layer
    }
  }
  // One launch less per MoE layer: the combine also runs the add + RMSNorm that follows, where
  // nothing sits between them (no all-reduce hook) and the layer takes T in one forward.
  void moe_add_rms_norm(int layer, Buf in, Buf out, NormId which, int norm_layer, Buf residual,
                        Buf normed) override {
    if (skip()) return;
    DevLayer& L = layers_.at(size_t(layer));
    if (!all_reduce_ && L.moe != nullptr && L.moe->on_device() && T_ <= L.moe->max_tokens()) {
      const std::optional<moe::NormFold> fold = norm_fold_for(L, which, norm_layer, normed);
      const moe::AddRmsNormStep n{buf(residual), norm_weight(which, norm_layer), eps(),
                                  buf(normed), fold ? &*fold : nullptr};
      if (L.moe->forward_add_rms_norm(buf(in), T_, buf(out), n, stream_)) {
        if (fold) note_norm_folded(norm_layer, *fold);
        return;
      }
    }
    ModelOps::moe_add_rms_norm(layer, in, out, which, norm_layer, residual, normed);
  }
  // One token without an all-reduce hook, NVFP4 o_proj on the GEMV, a MoE block that folds the
  // norm (CudaMoeLayer::takes_pre_norm): o_proj adds into the residual, the MoE token path
  // normalises. One launch less per layer: GLM-4.5-Air's batch-1 decode step 1.5-1.8% faster
  // (bench/results/2026-12-02-session33-h200.md). TETRA_FOLD_POST_NORM=0 keeps the separate
  // launch (A/B runs).
  bool o_proj_folded_norm_moe(int layer, NormId which, int norm_layer) override {
    if (!folds_post_norm(layer)) return false;
    if (skip()) return true;
    ++folded_post_norms_;
    DevLayer& L = layers_.at(size_t(layer));
    const DevLinear* o = get_linear(L, LinearId::O);
    const lin::Nvfp4GemvOutput out{&o->q.view(), bias_of(*o), nullptr, buf(Buf::Residual)};
    // The router too where the block takes it (moe/router_fold.h): no token path launch.
    const std::optional<moe::RouterFold> fold = router_fold_of(L, out);
    if (fold) {
      ++folded_routers_;
      ck(lin::linear_nvfp4_gemv_router_fold(out, buf(Buf::Attn), *fold, stream_));
    } else {
      ck(lin::linear_nvfp4_gemv(&out, 1, buf(Buf::Attn), T_, stream_));
    }
    const moe::PreRmsNormStep pre{norm_weight(NormId::PostAttention, layer), eps(),
                                  buf(Buf::Normed), fold.has_value()};
    const std::optional<moe::NormFold> next = norm_fold_for(L, which, norm_layer, Buf::Normed);
    const moe::AddRmsNormStep n{buf(Buf::Residual), norm_weight(which, norm_layer), eps(),
                                buf(Buf::Normed), next ? &*next : nullptr};
    TETRA_CHECK(L.moe->forward_add_rms_norm(buf(Buf::Residual), T_, buf(Buf::Out), n, stream_, &pre),
                "layer ", layer, ": the MoE block refused the folded post-attention norm");
    if (next) note_norm_folded(norm_layer, *next);
    return true;
  }
  void logits(Buf in) override {
    if (mode_ == Mode::Replay) {
      TETRA_CUDA_CHECK(cudaGraphLaunch(replay_, stream_));
      return;
    }
    // Gather the logit rows of `in`, then lm_head -> f32 logits.
    expect_normalised(in);
    ck(lin::embedding_gather(buf(in), T_, H_, d_rows(), R_run_, logit_in_.as<uint16_t>(), stream_));
    run_linear(*lm_head_, logit_in_.as<uint16_t>(), R_run_, logits_.as(), DType::F32);
    if (mode_ == Mode::Capture) {
      cudaGraph_t g = nullptr;
      TETRA_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
      cudaGraphExec_t exec = nullptr;
      const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
      cudaGraphDestroy(g);
      TETRA_CUDA_CHECK(e);
      graphs_[capture_key_] = exec;
      TETRA_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
      mode_ = Mode::Eager;
    }
  }
  void read_logits(float* out) override {
    TETRA_CUDA_CHECK(cudaMemcpyAsync(out, logits_.as(), size_t(R_) * c_.vocab_size * 4,
                                     cudaMemcpyDeviceToHost, stream_));
    TETRA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void sample(const SampleBatch& batch, int32_t* tokens) override {
    sampler_.sample(logits_.as<float>(), R_, int(c_.vocab_size), batch, tokens, stream_);
  }
  void logprobs(const ops::LogprobQuery* queries, int n, ops::PositionLogprobs* out) override {
    sampler_.logprobs(logits_.as<float>(), R_, int(c_.vocab_size), queries, n, out, stream_);
  }
  void set_all_reduce_hook(AllReduceHook hook) override { all_reduce_ = std::move(hook); }
  void all_reduce(Buf b) override {
    if (skip()) return;
    if (!all_reduce_) return;
    all_reduce_(buf(b), size_t(T_) * size_t(buf_width(b, c_)), stream_);
  }
  void copy_kv_blocks(const std::vector<runtime::BlockCopy>& copies) override {
    if (copies.empty()) return;
    TETRA_CHECK_LE(copies.size(), size_t(lim_.kv_num_blocks));
    std::vector<int32_t> pairs;  // [n, 2] (src, dst)
    for (const runtime::BlockCopy& c : copies) {
      pairs.push_back(c.src);
      pairs.push_back(c.dst);
    }
    TETRA_CUDA_CHECK(cudaMemcpy(pairs_.as(), pairs.data(), pairs.size() * 4, cudaMemcpyHostToDevice));
    const int64_t block_elems = int64_t(lim_.kv_block_size) * kv_row_elems();
    for (DevLayer& l : layers_) {
      if (!l.idx_cache.empty())
        ck(ops::cuda::copy_kv_blocks(l.idx_cache.as<uint16_t>(), nullptr, pairs_.as<int32_t>(),
                                     int(copies.size()), lim_.kv_num_blocks,
                                     int64_t(lim_.kv_block_size) * c_.index_head_dim, stream_));
      ck(ops::cuda::copy_kv_blocks(l.k_cache.as<uint16_t>(),
                                   mla_ ? nullptr : l.v_cache.as<uint16_t>(),
                                   pairs_.as<int32_t>(), int(copies.size()), lim_.kv_num_blocks,
                                   block_elems, stream_));
    }
    synchronize();
  }

 private:
  enum class Mode { Eager, Capture, Replay };

  void setup(const ModelWeights& w, const OpsLimits& lim, bool random, uint64_t seed) {
    const std::vector<std::string> why = cuda_model_unsupported_reasons(w.config);
    if (!why.empty()) TETRA_FAIL("the cuda model backend cannot run this model: ", why.front());
    if (!cuda_available()) TETRA_FAIL("the cuda model backend needs a CUDA GPU; none is usable here");
    TETRA_CHECK(lim.max_tokens > 0 && lim.max_seqs > 0 && lim.kv_block_size > 0 &&
                    lim.kv_num_blocks > 0 && lim.max_blocks_per_seq > 0,
                "OpsLimits must be positive");
    if (!stream_) TETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    c_ = w.config;
    lim_ = lim;
    H_ = int(c_.hidden_size);
    hd_ = int(c_.head_dim);
    nh_ = int(c_.num_attention_heads);
    nkv_ = int(c_.num_key_value_heads);
    mla_ = c_.attention == AttentionKind::MLA;
    if (mla_) mla_shape_ = mla_shape_of(c_);
    dsa_ = mla_ && c_.index_n_heads > 0;
    if (dsa_) {
      dsa_shape_ = dsa_shape_of(c_);
      dsa_max_keys_ = lim.max_blocks_per_seq * lim.kv_block_size;
      selection_ = DeviceMem(size_t(lim.max_tokens) * dsa_shape_.topk * 4);
      dsa_ws_ = DeviceMem(std::max<size_t>(
          256, ops::cuda::dsa_select_workspace_bytes(lim.max_tokens, dsa_max_keys_)));
    }
    seed = seed * 0x9E3779B97F4A7C15ull + 1;

    embedding_ = random ? random_bf16(c_.vocab_size * H_, 1.0f, seed, stream_)
                        : upload_bf16(w.embedding);
    final_norm_ = random ? const_bf16(H_, 1.0f, stream_) : upload_bf16(w.final_norm);
    lm_head_ = make_linear(w.lm_head, random, seed, stream_);
    TETRA_CHECK(lm_head_->n == c_.vocab_size && lm_head_->k == H_, "lm_head shape");

    const int64_t cache_elems = int64_t(lim.kv_num_blocks) * lim.kv_block_size * kv_row_elems();
    layers_.clear();
    layers_.resize(w.layers.size());
    host_moe_ = false;
    moe_bytes_ = 0;
    const int moe_tokens = std::max(1, std::min(lim.max_tokens, opt_.moe_chunk_tokens));
    for (size_t i = 0; i < w.layers.size(); ++i) {
      const LayerWeights& lw = w.layers[i];
      DevLayer& L = layers_[i];
      L.input_norm = random ? const_bf16(H_, 1.0f, stream_) : upload_bf16(lw.input_norm);
      L.post_norm = random ? const_bf16(H_, 1.0f, stream_) : upload_bf16(lw.post_attention_norm);
      if (lw.attn.q_norm) L.q_norm = random ? const_bf16(hd_, 1.0f, stream_) : upload_bf16(*lw.attn.q_norm);
      if (lw.attn.k_norm) L.k_norm = random ? const_bf16(hd_, 1.0f, stream_) : upload_bf16(*lw.attn.k_norm);
      L.q = make_linear(lw.attn.q, random, seed, stream_);
      L.o = make_linear(lw.attn.o, random, seed, stream_);
      if (lw.attn.mla) {
        const MlaWeights& m = *lw.attn.mla;
        if (m.q_a) {
          L.q_a = make_linear(*m.q_a, random, seed, stream_);
          L.q_a_norm = random ? const_bf16(int(c_.q_lora_rank), 1.0f, stream_) : upload_bf16(*m.q_a_norm);
        }
        L.kv_a = make_linear(m.kv_a, random, seed, stream_);
        L.kv_a_norm = random ? const_bf16(int(c_.kv_lora_rank), 1.0f, stream_) : upload_bf16(m.kv_a_norm);
        L.kv_b = random ? random_bf16(m.kv_b.out_features * m.kv_b.in_features,
                                      float(1.0 / std::sqrt(double(m.kv_b.in_features))), seed, stream_)
                        : upload_as_bf16(m.kv_b);
        if (m.indexer) {
          const IndexerWeights& ix = *m.indexer;
          const int D = int(c_.index_head_dim);
          L.idx_wq_b = make_linear(ix.wq_b, random, seed, stream_);
          L.idx_wk = make_linear(ix.wk, random, seed, stream_);
          L.idx_wproj = make_linear(ix.weights_proj, random, seed, stream_);
          L.idx_ln_w = random ? const_bf16(D, 1.0f, stream_) : upload_bf16(ix.k_norm_weight);
          L.idx_ln_b = random ? const_bf16(D, 0.0f, stream_) : upload_bf16(ix.k_norm_bias);
          L.idx_cache = DeviceMem(size_t(lim.kv_num_blocks) * lim.kv_block_size * D * 2);
          TETRA_CUDA_CHECK(cudaMemsetAsync(L.idx_cache.as(), 0, L.idx_cache.bytes(), stream_));
        }
      } else {
        L.k = make_linear(lw.attn.k, random, seed, stream_);
        L.v = make_linear(lw.attn.v, random, seed, stream_);
      }
      if (lw.dense) {
        L.gate_up = make_gate_up(*lw.dense, random, seed, stream_);
        if (!L.gate_up) {
          L.gate = make_linear(lw.dense->gate, random, seed, stream_);
          L.up = make_linear(lw.dense->up, random, seed, stream_);
        }
        L.down = make_linear(lw.dense->down, random, seed, stream_);
      }
      if (lw.moe) {
        CudaMoeBlockSpec spec;
        spec.layer = int(i);
        spec.hidden = H_;
        spec.max_tokens = moe_tokens;
        spec.backend = lim.moe_backend;
        spec.random = random;
        spec.seed = &seed;
        CudaMoeBlock block = make_cuda_moe_block(*lw.moe, spec);
        if (!block.runner->on_device()) host_moe_ = true;
        moe_bytes_ += block.weight_bytes;
        L.moe = std::move(block.runner);
        if (L.moe->on_device() && !L.post_norm.empty()) {  // the router fold's constants
          TETRA_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the norm weight is uploaded
          L.moe->prepare_router_fold(L.post_norm.as<uint16_t>());
        }
      }
      L.k_cache = DeviceMem(size_t(cache_elems) * 2);
      TETRA_CUDA_CHECK(cudaMemsetAsync(L.k_cache.as(), 0, L.k_cache.bytes(), stream_));
      if (!mla_) {
        L.v_cache = DeviceMem(size_t(cache_elems) * 2);
        TETRA_CUDA_CHECK(cudaMemsetAsync(L.v_cache.as(), 0, L.v_cache.bytes(), stream_));
      }
    }

    const std::vector<float> inv = rope_inv_freq_of(c_);
    inv_freq_ = DeviceMem(inv.size() * 4);
    inv_freq_.upload(inv.data(), inv.size() * 4);
    if (!mla_) {
      rope_ = rope_shape_of(c_);
      attn_ = attention_shape_of(c_);
    }

    for (int b = 0; b < int(Buf::Count); ++b)
      bufs_[size_t(b)] = DeviceMem(size_t(lim.max_tokens) * size_t(buf_width(Buf(b), c_)) * 2);
    logits_ = DeviceMem(size_t(lim.max_tokens) * size_t(c_.vocab_size) * 4);
    norm_fold_sums_ = DeviceMem(size_t(moe::kNormFoldMaxSums) * 4);
    logit_in_ = DeviceMem(size_t(lim.max_tokens) * H_ * 2);
    rows_ = std::make_unique<lin::RowCountTable>(lim.max_tokens);
    ops::PagedKv kv;
    kv.num_blocks = lim.kv_num_blocks;
    kv.block_size = lim.kv_block_size;
    kv.max_blocks_per_seq = lim.max_blocks_per_seq;
    split_decode_ = !mla_ && opt_.split_decode && split_decode_unsupported_reason(attn_).empty();
    rope_in_attention_ =
        split_decode_ && opt_.rope_in_attention &&
        split_decode_rope_unsupported_reason(attn_, rope_.rotary_dim,
                                             rope_.style == ops::RopeStyle::NeoX)
            .empty();
    // The split kernel needs no scratch; the fallback kernel's partials live here.
    attn_ws_ = DeviceMem(std::max<size_t>(
        256, split_decode_ || mla_ ? 0
                                   : ops::cuda::paged_decode_workspace_bytes(lim.max_seqs, attn_, kv)));
    // MLA attention's key-split partials (decode), sized for the largest step (0: none).
    mla_ws_ = DeviceMem(
        mla_ ? ops::cuda::mla_attention_workspace_bytes(mla_shape_, lim.max_tokens) : 0);
    pairs_ = DeviceMem(size_t(lim.kv_num_blocks) * 8);
    arrays_ = {};
    arrays_.layout(lim.max_tokens, lim.max_seqs, lim.max_blocks_per_seq);
    dev_arrays_ = DeviceMem(arrays_.end);
    if (host_) cudaFreeHost(host_);
    TETRA_CUDA_CHECK(cudaMallocHost(&host_, arrays_.end));
    if (!staged_) TETRA_CUDA_CHECK(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming));
    for (auto& [b, g] : graphs_) cudaGraphExecDestroy(g);
    graphs_.clear();
    synchronize();
    weight_bytes_ = lm_head_->bytes() + embedding_.bytes();
    int max_nvfp4_k = 0;  // widest NVFP4 linear input: the wgmma kernel's reordered-x scratch
    for (const DevLayer& L : layers_) {
      weight_bytes_ += L.kv_b.bytes();
      for (const auto* l : {L.q.get(), L.k.get(), L.v.get(), L.o.get(), L.q_a.get(), L.kv_a.get(),
                            L.idx_wq_b.get(), L.idx_wk.get(), L.idx_wproj.get(), L.gate_up.get(),
                            L.gate.get(), L.up.get(), L.down.get()})
        if (l) {
          weight_bytes_ += l->bytes();
          if (l->nvfp4) max_nvfp4_k = std::max(max_nvfp4_k, l->k);
        }
    }
    if (lm_head_->nvfp4) max_nvfp4_k = std::max(max_nvfp4_k, lm_head_->k);
    const int wgmma_min_rows = std::min(lin::kNvfp4WgmmaMinRows, lin::kNvfp4WgmmaOutputsMinRows);
    x_wgmma_ = lim.max_tokens >= wgmma_min_rows && max_nvfp4_k > 0
                   ? DeviceMem(size_t(lim.max_tokens) * size_t(max_nvfp4_k) * 2)
                   : DeviceMem();
    weight_bytes_ += moe_bytes_;
  }

  // Uploads the step's arrays (padded to S_run sequences / R_run logit rows for graphs).
  void stage(const StepBatch& st, int S_run, int R_run) {
    TETRA_CUDA_CHECK(cudaEventSynchronize(staged_));  // the previous copy left the staging area
    uint8_t* h = static_cast<uint8_t*>(host_);
    auto* tok = reinterpret_cast<int32_t*>(h + arrays_.tokens);
    auto* pos = reinterpret_cast<int32_t*>(h + arrays_.positions);
    auto* slot = reinterpret_cast<int64_t*>(h + arrays_.slots);
    auto* cu = reinterpret_cast<int32_t*>(h + arrays_.cu);
    auto* tab = reinterpret_cast<int32_t*>(h + arrays_.tables);
    auto* lens = reinterpret_cast<int32_t*>(h + arrays_.lens);
    auto* rows = reinterpret_cast<int32_t*>(h + arrays_.rows);
    const int T = st.num_tokens();
    TETRA_CHECK_LE(T_, lim_.max_tokens);
    for (int t = 0; t < T_; ++t) {
      const bool pad = t >= T;  // padded decode rows copy row 0 and skip the KV write
      tok[t] = st.tokens[size_t(pad ? 0 : t)];
      pos[t] = st.positions[size_t(pad ? 0 : t)];
      slot[t] = pad ? -1 : st.slots[size_t(t)];
    }
    const int S = st.num_seqs();
    for (int s = 0; s <= S_run; ++s) cu[s] = s <= S ? st.cu_seqlens[size_t(s)] : st.cu_seqlens[size_t(S)] + (s - S);
    const int mb = lim_.max_blocks_per_seq;
    if (st.kind == StepKind::Decode || st.has_cached_prefix()) {
      TETRA_CHECK_LE(st.max_blocks_per_seq, mb, "step block table wider than the limits");
      for (int s = 0; s < S_run; ++s) {
        const int src = s < S ? s : 0;
        for (int b = 0; b < mb; ++b)
          tab[size_t(s) * mb + b] =
              b < st.max_blocks_per_seq ? st.block_tables[size_t(src) * st.max_blocks_per_seq + b] : -1;
        lens[s] = st.seq_lens[size_t(src)];
      }
    }
    for (int r = 0; r < R_run; ++r) rows[r] = r < R_ ? st.logit_rows[size_t(r)] : 0;
    // The decode attention's plan for these lengths and tables (same for every layer).
    size_t bytes = arrays_.plan;
    if (attn_splits_ > 0) {
      build_split_decode_plan(lens, tab, mb, lim_.kv_block_size, S_run, attn_splits_,
                              reinterpret_cast<int32_t*>(h + arrays_.plan));
      bytes += split_decode_plan_ints(S_run, attn_splits_) * 4;
    }
    TETRA_CUDA_CHECK(cudaMemcpyAsync(dev_arrays_.as(), host_, bytes, cudaMemcpyHostToDevice,
                                     stream_));
    TETRA_CUDA_CHECK(cudaEventRecord(staged_, stream_));
  }

  int bucket_of(int S) const {
    int b = 1;
    while (b < S) b *= 2;
    if (b > lim_.max_seqs || b > lim_.max_tokens) return 0;  // cannot pad: run eagerly
    return b;
  }

  // Layer's cache with the step's block tables (stage() writes them at the limits' width).
  ops::PagedKv paged_kv(int layer) const {
    const DevLayer& L = layers_.at(size_t(layer));
    ops::PagedKv kv;
    kv.k_cache = L.k_cache.as<uint16_t>();
    kv.v_cache = L.v_cache.as<uint16_t>();
    kv.block_tables = d_tables();
    kv.seq_lens = d_lens();
    kv.num_blocks = lim_.kv_num_blocks;
    kv.block_size = lim_.kv_block_size;
    kv.max_blocks_per_seq = lim_.max_blocks_per_seq;
    return kv;
  }

  bool skip() const { return mode_ == Mode::Replay; }
  // Where MLA attention's and the DSA indexer's keys live: the step's own slots for a prefill
  // without a cached prefix, else the block tables (stage() writes them max_blocks_per_seq wide).
  ops::MlaKeys mla_keys() const {
    ops::MlaKeys keys;
    if (step_->kind == StepKind::Prefill && !step_->has_cached_prefix()) {
      keys.step_slots = d_slots();
      return keys;
    }
    keys.block_tables = d_tables();
    keys.max_blocks_per_seq = lim_.max_blocks_per_seq;
    keys.block_size = lim_.kv_block_size;
    return keys;
  }
  // Elements per token of one layer's cache (of each of k and v for GQA).
  int64_t kv_row_elems() const { return mla_ ? mla_shape_.row() : int64_t(nkv_) * hd_; }
  // o_proj_folded_norm_moe's condition: a function of the layer and T_ only, so a captured step
  // and its replays decide alike.
  bool folds_post_norm(int layer) const {
    static const bool off = [] {
      const char* e = std::getenv("TETRA_FOLD_POST_NORM");
      return e != nullptr && e[0] == '0';
    }();
    if (off || !opt_.fold_post_norm || T_ != 1 || all_reduce_) return false;
    const DevLayer& L = layers_.at(size_t(layer));
    const DevLinear* o = get_linear(L, LinearId::O);
    if (L.moe == nullptr || !L.moe->on_device() || o == nullptr || !o->nvfp4) return false;
    // The GEMV's shape rules (its residual add holds at one row).
    const lin::Nvfp4GemvOutput out{&o->q.view(), bias_of(*o)};
    return lin::nvfp4_gemv_unsupported_reason(&out, 1, T_).empty() && L.moe->takes_pre_norm(T_);
  }
  bool nvfp4_qkv(const DevLayer& L) const {
    return L.q && L.k && L.v && L.q->nvfp4 && L.k->nvfp4 && L.v->nvfp4;
  }
  std::array<lin::Nvfp4GemvOutput, 3> qkv_outputs(const DevLayer& L, uint16_t* q, uint16_t* k,
                                                  uint16_t* v) const {
    return {{{&L.q->q.view(), bias_of(*L.q), q},
             {&L.k->q.view(), bias_of(*L.k), k},
             {&L.v->q.view(), bias_of(*L.v), v}}};
  }
  // The input norm of `layer` left to its q/k/v GEMV (moe/add_rms_norm_step.h NormFold) with the
  // producer's `parts` per row, or none: a function of the layers and T_ (a captured step and
  // its replays decide alike). Up to kNvfp4GemvKernelRows tokens without an all-reduce hook, GQA
  // layers whose NVFP4 q/k/v are all that reads the normalised row. TETRA_FOLD_INPUT_NORM=0
  // turns it off (A/B runs).
  std::optional<moe::NormFold> input_norm_fold(int layer, int parts) const {
    static const bool off = [] {
      const char* e = std::getenv("TETRA_FOLD_INPUT_NORM");
      return e != nullptr && e[0] == '0';
    }();
    if (off || !opt_.fold_input_norm || all_reduce_ || mla_ || T_ > lin::kNvfp4GemvKernelRows ||
        parts < 1)
      return std::nullopt;
    const DevLayer& L = layers_.at(size_t(layer));
    if (!nvfp4_qkv(L)) return std::nullopt;
    const moe::NormFold f{norm_fold_sums_.as<float>(), parts, H_, eps()};
    const std::array<lin::Nvfp4GemvOutput, 3> outs = qkv_outputs(L, nullptr, nullptr, nullptr);
    if (!lin::nvfp4_gemv_norm_folded_unsupported_reason(outs.data(), 3, T_, f).empty())
      return std::nullopt;
    return f;
  }
  // The fold for the add + RMSNorm `which` of `norm_layer` writing `normed` after the MoE block
  // of `producer`, where it is the next layer's input norm into the step's Buf::Normed.
  std::optional<moe::NormFold> norm_fold_for(const DevLayer& producer, NormId which,
                                             int norm_layer, Buf normed) const {
    if (which != NormId::Input || normed != Buf::Normed || producer.moe == nullptr)
      return std::nullopt;
    return input_norm_fold(norm_layer, producer.moe->norm_fold_parts());
  }
  void note_norm_folded(int layer, const moe::NormFold& fold) {
    folded_norm_layer_ = layer;
    folded_norm_ = fold;
    ++folded_input_norms_;
  }
  // Buf::Normed holds gx between a folded input norm and its q/k/v: nothing else may read it.
  void expect_normalised(Buf in) const {
    TETRA_CHECK(in != Buf::Normed || folded_norm_layer_ < 0, "the input norm of layer ",
                folded_norm_layer_, " is folded into its q/k/v; another op reads it");
  }
  // The router fold o_proj_folded_norm_moe runs with o_proj's output `out` (its gx:
  // Buf::Normed), or none (a function of the layer and T_).
  std::optional<moe::RouterFold> router_fold_of(const DevLayer& L,
                                                const lin::Nvfp4GemvOutput& out) {
    if (!opt_.router_fold) return std::nullopt;
    const moe::RouterFold* f = L.moe->router_fold(T_);
    if (f == nullptr) return std::nullopt;
    moe::RouterFold fold = *f;
    fold.gx = buf(Buf::Normed);
    if (!lin::nvfp4_gemv_router_fold_unsupported_reason(out, T_, fold).empty()) return std::nullopt;
    return fold;
  }
  void ck(cudaError_t e) const { TETRA_CUDA_CHECK(e); }


  static const uint16_t* bias_of(const DevLinear& l) {
    return l.bias.empty() ? nullptr : l.bias.as<uint16_t>();
  }
  void run_linear(const DevLinear& l, const uint16_t* x, int M, void* y, DType out_dtype) {
    if (l.nvfp4 && out_dtype == DType::BF16) {
      const lin::Nvfp4GemvOutput out{&l.q.view(), bias_of(l), static_cast<uint16_t*>(y)};
      if (lin::nvfp4_gemv_unsupported_reason(&out, 1, M).empty()) {
        ck(lin::linear_nvfp4_gemv(&out, 1, x, M, stream_));  // bias in the epilogue
        return;
      }
    }
    if (l.nvfp4)
      ck(lin::linear_nvfp4(l.q.view(), x, M, *rows_, y, out_dtype, stream_,
                           x_wgmma_.empty() ? nullptr : x_wgmma_.as<uint16_t>()));
    else
      bf16_.run(l.w.as<uint16_t>(), l.n, l.k, x, M, y, out_dtype, stream_);
    if (!l.bias.empty())
      ck(lin::add_bias(y, out_dtype == DType::F32, M, l.n, l.bias.as<uint16_t>(), stream_));
  }

  const DevLinear* get_linear(const DevLayer& L, LinearId which) const {
    switch (which) {
      case LinearId::Q: return L.q.get();
      case LinearId::K: return L.k.get();
      case LinearId::V: return L.v.get();
      case LinearId::O: return L.o.get();
      case LinearId::DenseGate: return L.gate.get();
      case LinearId::DenseUp: return L.up.get();
      case LinearId::DenseDown: return L.down.get();
      case LinearId::QA: return L.q_a.get();
      case LinearId::KvA: return L.kv_a.get();
      case LinearId::IdxQ: return L.idx_wq_b.get();
      case LinearId::IdxK: return L.idx_wk.get();
      case LinearId::IdxW: return L.idx_wproj.get();
    }
    return nullptr;
  }
  const uint16_t* norm_weight(NormId which, int layer) const {
    switch (which) {
      case NormId::Input: return layers_.at(size_t(layer)).input_norm.as<uint16_t>();
      case NormId::PostAttention: return layers_.at(size_t(layer)).post_norm.as<uint16_t>();
      case NormId::Final: return final_norm_.as<uint16_t>();
      case NormId::QLatent: {
        const DeviceMem& w = layers_.at(size_t(layer)).q_a_norm;
        TETRA_CHECK(!w.empty(), "layer ", layer, " has no q_a_layernorm");
        return w.as<uint16_t>();
      }
      default: TETRA_FAIL("rms_norm takes Input, PostAttention, QLatent or Final (head norms: head_norm)");
    }
  }

  uint16_t* buf(Buf b) { return bufs_[size_t(b)].as<uint16_t>(); }
  float eps() const { return float(c_.rms_norm_eps); }
  uint8_t* dev_base() const { return dev_arrays_.as<uint8_t>(); }
  const int32_t* d_tokens() const { return reinterpret_cast<const int32_t*>(dev_base() + arrays_.tokens); }
  const int32_t* d_positions() const { return reinterpret_cast<const int32_t*>(dev_base() + arrays_.positions); }
  const int64_t* d_slots() const { return reinterpret_cast<const int64_t*>(dev_base() + arrays_.slots); }
  const int32_t* d_cu() const { return reinterpret_cast<const int32_t*>(dev_base() + arrays_.cu); }
  const int32_t* d_tables() const { return reinterpret_cast<const int32_t*>(dev_base() + arrays_.tables); }
  const int32_t* d_lens() const { return reinterpret_cast<const int32_t*>(dev_base() + arrays_.lens); }
  const int32_t* d_rows() const { return reinterpret_cast<const int32_t*>(dev_base() + arrays_.rows); }
  // The step's decode attention plan (stage() writes it when the step has a split count).
  const int32_t* d_plan() const {
    return attn_splits_ > 0 ? reinterpret_cast<const int32_t*>(dev_base() + arrays_.plan) : nullptr;
  }

  CudaOpsOptions opt_;
  int64_t folded_post_norms_ = 0;
  int64_t folded_routers_ = 0;
  int64_t folded_input_norms_ = 0;
  int folded_norm_layer_ = -1;  // whose input norm the last combine folded (its q/k/v is next)
  moe::NormFold folded_norm_;   // and how
  DeviceMem norm_fold_sums_;    // [kNormFoldMaxSums] f32: a NormFold's [T, parts] sums
  AllReduceHook all_reduce_;  // tensor parallel sum, or empty
  ModelConfig c_;
  OpsLimits lim_;
  int H_ = 0, hd_ = 0, nh_ = 0, nkv_ = 0;
  cudaStream_t stream_ = nullptr;
  DeviceMem embedding_;   // [vocab, H] bf16
  DeviceMem final_norm_;  // [H] bf16
  std::unique_ptr<DevLinear> lm_head_;  // [vocab, H]
  std::vector<DevLayer> layers_;
  DeviceMem inv_freq_;    // [rotary_dim / 2] f32
  ops::RopeShape rope_;        // GQA
  ops::AttentionShape attn_;   // GQA
  bool mla_ = false;
  ops::MlaShape mla_shape_;    // MLA
  bool dsa_ = false;           // GLM-5's DSA indexer
  ops::DsaShape dsa_shape_;
  int dsa_max_keys_ = 0;       // the longest context the tables hold: the score rows' stride
  DeviceMem selection_;        // [max_tokens, index_topk] int32: the keys each token reads
  DeviceMem dsa_ws_;           // dsa_select's score rows, f32 [rows <= max_tokens, dsa_max_keys_]
  std::array<DeviceMem, size_t(Buf::Count)> bufs_;  // each [max_tokens, width] bf16
  DeviceMem logits_;      // [max_tokens, vocab] f32, first R rows valid
  DeviceMem logit_in_;    // [max_tokens, H] bf16: the logit rows gathered for lm_head
  DeviceMem attn_ws_;     // the fallback paged decode kernel's split partials
  DeviceMem mla_ws_;      // mla_attention's key-split partials (MLA), or empty
  DeviceMem pairs_;       // [kv_num_blocks, 2] int32 copy-on-write pairs
  std::unique_ptr<lin::RowCountTable> rows_;
  lin::Bf16Linear bf16_;
  StepArrays arrays_;
  DeviceMem dev_arrays_;  // StepArrays on the device
  void* host_ = nullptr;  // StepArrays, pinned
  cudaEvent_t staged_ = nullptr;
  DeviceMem x_wgmma_;  // [max_tokens, widest NVFP4 input] bf16: x reordered for the wgmma kernel
  DeviceSampler sampler_;  // the step's tokens from logits_, on the device
  size_t weight_bytes_ = 0, moe_bytes_ = 0;
  bool split_decode_ = false;        // decode attention by split_decode_attention.h
  bool rope_in_attention_ = false;   // and the step's RoPE + KV write inside it (DecodeRope)
  bool host_moe_ = false;            // some MoE layer runs on the host runner: no graphs
  std::vector<uint16_t> host_x_, host_y_;  // [chunk, H] bf16 staging for host MoE layers

  const StepBatch* step_ = nullptr;
  int T_ = 0, S_ = 0, R_ = 0, S_run_ = 0, R_run_ = 0, max_seqlen_ = 0;
  Mode mode_ = Mode::Eager;
  using GraphKey = std::pair<int, int>;  // (batch bucket, decode attention splits)
  GraphKey capture_key_{};
  int attn_splits_ = 0;  // decode steps: split_decode_auto_splits for the longest sequence
  cudaGraphExec_t replay_ = nullptr;
  std::map<GraphKey, cudaGraphExec_t> graphs_;  // decode step graphs
};

std::unique_ptr<ModelOps> make_cuda_ops() { return std::make_unique<CudaModelOps>(); }
const ModelOpsRegistration kRegistration{"cuda", &make_cuda_ops};

}  // namespace

std::vector<std::string> cuda_model_unsupported_reasons(const ModelConfig& c) {
  std::vector<std::string> why;
  namespace att = ::tetra::ops::cuda;  // the attention kernels' own statement of their limits
  if (c.attention == AttentionKind::MLA) {
    const std::string r = att::mla_unsupported_reason(mla_shape_of(c));
    if (!r.empty()) why.push_back(r);
    if (c.index_n_heads > 0) {
      const std::string d = att::dsa_unsupported_reason(dsa_shape_of(c));
      if (!d.empty()) why.push_back("DSA indexer: " + d);
    }
    return why;
  }
  if (!att::attention_head_dim_supported(int(c.head_dim)))
    why.push_back(str("head_dim ", c.head_dim,
                      ": the CUDA prefill and decode attention kernels take 64 or 128"));
  if (c.num_key_value_heads > 0 && c.num_attention_heads / c.num_key_value_heads > att::kDecodeMaxGroup)
    why.push_back(str(c.num_attention_heads / c.num_key_value_heads,
                      " query heads per kv head: the CUDA decode attention takes at most 16"));
  return why;
}

std::unique_ptr<CudaModelOpsApi> make_cuda_model_ops_api() {
  return std::make_unique<CudaModelOps>();
}

void link_cuda_model_ops() { (void)&kRegistration; }

}  // namespace tetra::model::cuda
