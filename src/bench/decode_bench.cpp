// `tetra bench decode` (see decode_bench.h).
#include "bench/decode_bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <iomanip>
#include <map>
#include <optional>
#include <random>
#include <sstream>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/version.h"
#include "format/checkpoint.h"
#include "format/presets.h"
#include "format/quant_config.h"
#include "dist/sharding_plan.h"
#include "model/cuda/cuda_model_ops.h"
#include "model/model.h"
#include "model/parallel/parallel_model_ops.h"
#include "moe/moe_layer.h"
#include "ops/sampling/sampling.h"
#include "perf/block_stamps.h"
#include "perf/gpu_spec.h"
#include "perf/roofline.h"
#include "server/kernel_tracer.h"

namespace tetra::bench {
namespace {

using model::Buf;
using model::LinearId;
using model::NormId;

QuantConfig quant_of(bool nvfp4) {
  QuantConfig q;
  if (!nvfp4) return q;
  q.algo = QuantAlgo::NVFP4;
  q.exclude = {"lm_head", "*.mlp.gate", "model.embed_tokens"};
  return q;
}

TensorView shape_view(std::string name, DType d, std::vector<int64_t> shape) {
  TensorView t;
  t.name = std::move(name);
  t.dtype = d;
  t.shape = std::move(shape);
  return t;
}

model::LinearWeight shape_linear(const QuantConfig& q, const std::string& module, int64_t n,
                                 int64_t k, bool bias) {
  model::LinearWeight l;
  l.module = module;
  l.out_features = n;
  l.in_features = k;
  l.quantized = q.algo_for(module) != QuantAlgo::None;
  l.weight = shape_view(module + ".weight", l.quantized ? DType::U8 : DType::BF16,
                        {n, l.quantized ? k / 2 : k});
  if (l.quantized) l.weight_scale = shape_view(module + ".weight_scale", DType::F8_E4M3, {n, k / 16});
  if (bias) l.bias = shape_view(module + ".bias", DType::BF16, {n});
  return l;
}

model::MlpWeights shape_mlp(const QuantConfig& q, const std::string& prefix, int64_t H, int64_t I) {
  model::MlpWeights m;
  m.gate = shape_linear(q, prefix + ".gate_proj", I, H, false);
  m.up = shape_linear(q, prefix + ".up_proj", I, H, false);
  m.down = shape_linear(q, prefix + ".down_proj", H, I, false);
  return m;
}

// ---- per-op timing: a ModelOps that forwards every call and brackets it with CUDA events ----
class TimedOps final : public model::ModelOps {
 public:
  TimedOps(model::ModelOps& inner, cudaStream_t s) : in_(inner), s_(s) {}
  ~TimedOps() override {
    for (auto& m : marks_) {
      cudaEventDestroy(m.a);
      cudaEventDestroy(m.b);
    }
  }
  std::string name() const override { return in_.name(); }
  void prepare(const model::ModelWeights& w, const model::OpsLimits& l) override { in_.prepare(w, l); }
  void begin_step(const model::StepBatch& s) override { in_.begin_step(s); }
  void embed(Buf o) override { timed("embed", [&] { in_.embed(o); }); }
  void rms_norm(NormId w, int l, Buf i, Buf o) override { timed("norms", [&] { in_.rms_norm(w, l, i, o); }); }
  void add_rms_norm(NormId w, int l, Buf x, Buf r, Buf o) override {
    timed("norms", [&] { in_.add_rms_norm(w, l, x, r, o); });
  }
  void linear(LinearId id, int l, Buf i, Buf o) override {
    const bool attention_in = id == LinearId::Q || id == LinearId::K || id == LinearId::V ||
                              id == LinearId::QA || id == LinearId::KvA;
    const bool indexer = id == LinearId::IdxQ || id == LinearId::IdxK || id == LinearId::IdxW;
    const char* what = indexer        ? "dsa indexer"
                       : attention_in ? "qkv linears"
                       : id == LinearId::O                                         ? "o linear"
                                                                                   : "dense mlp";
    timed(what, [&] { in_.linear(id, l, i, o); });
  }
  void qkv(int l, Buf i, Buf q, Buf k, Buf v) override {
    timed("qkv linears", [&] { in_.qkv(l, i, q, k, v); });
  }
  void dense_gate_up(int l, Buf i, Buf g, Buf u, int64_t w) override {
    timed("dense mlp", [&] { in_.dense_gate_up(l, i, g, u, w); });
  }
  void head_norm(NormId w, int l, Buf x) override { timed("norms", [&] { in_.head_norm(w, l, x); }); }
  void qk_head_norm(int l, Buf q, Buf k) override {
    timed("norms", [&] { in_.qk_head_norm(l, q, k); });
  }
  void rope_write_kv(int l, Buf q, Buf k, Buf v) override {
    timed("rope + kv write", [&] { in_.rope_write_kv(l, q, k, v); });
  }
  void prefill_attention(Buf q, Buf k, Buf v, Buf o) override {
    timed("attention", [&] { in_.prefill_attention(q, k, v, o); });
  }
  void decode_attention(int l, Buf q, Buf o) override {
    timed("attention", [&] { in_.decode_attention(l, q, o); });
  }
  // (Where the backend fuses them, RoPE's time is in "attention".)
  void rope_decode_attention(int l, Buf q, Buf k, Buf v, Buf o) override {
    timed("attention", [&] { in_.rope_decode_attention(l, q, k, v, o); });
  }
  void dsa_select(int l, Buf q, Buf k, Buf w) override {
    timed("dsa indexer", [&] { in_.dsa_select(l, q, k, w); });
  }
  // MLA: cache write, absorbed q, attention and the value up-projection.
  void mla_attention(int l, Buf q, Buf kv_a, Buf o) override {
    timed("attention", [&] { in_.mla_attention(l, q, kv_a, o); });
  }
  void silu_mul(Buf g, Buf u, int64_t w, Buf o) override { timed("dense mlp", [&] { in_.silu_mul(g, u, w, o); }); }
  void moe(int l, Buf i, Buf o) override { timed("moe", [&] { in_.moe(l, i, o); }); }
  void logits(Buf i) override { timed("lm_head", [&] { in_.logits(i); }); }
  void read_logits(float* o) override { in_.read_logits(o); }
  void sample(const model::SampleBatch& b, int32_t* t) override {
    timed("sampling", [&] { in_.sample(b, t); });
  }
  void logprobs(const ops::LogprobQuery* q, int n, ops::PositionLogprobs* o) override {
    in_.logprobs(q, n, o);
  }
  void copy_kv_blocks(const std::vector<runtime::BlockCopy>& c) override { in_.copy_kv_blocks(c); }

  // Sums per op kind (synchronises).
  std::vector<DecodeOpTime> results() {
    TETRA_CUDA_CHECK(cudaStreamSynchronize(s_));
    std::map<std::string, DecodeOpTime> by;
    for (auto& m : marks_) {
      float ms = 0;
      TETRA_CUDA_CHECK(cudaEventElapsedTime(&ms, m.a, m.b));
      DecodeOpTime& t = by[m.op];
      t.op = m.op;
      t.us += 1e3 * ms;
      t.calls += 1;
    }
    std::vector<DecodeOpTime> v;
    for (auto& [k, t] : by) v.push_back(t);
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.us > b.us; });
    return v;
  }

 private:
  struct Mark {
    std::string op;
    cudaEvent_t a, b;
  };
  template <typename F>
  void timed(const char* op, F&& f) {
    Mark m{op, nullptr, nullptr};
    TETRA_CUDA_CHECK(cudaEventCreate(&m.a));
    TETRA_CUDA_CHECK(cudaEventCreate(&m.b));
    TETRA_CUDA_CHECK(cudaEventRecord(m.a, s_));
    f();
    TETRA_CUDA_CHECK(cudaEventRecord(m.b, s_));
    marks_.push_back(m);
  }
  model::ModelOps& in_;
  cudaStream_t s_;
  std::vector<Mark> marks_;
};

// A decode step of B sequences at context C: sequence s owns blocks [s*mb, (s+1)*mb).
model::StepBatch decode_step(int B, int C, int block_size, int mb, int width, int64_t vocab,
                             std::mt19937& rng) {
  model::StepBatch st;
  st.kind = model::StepKind::Decode;
  st.max_blocks_per_seq = width;
  st.cu_seqlens.push_back(0);
  for (int s = 0; s < B; ++s) {
    st.tokens.push_back(int32_t(rng() % uint64_t(vocab)));
    st.positions.push_back(C);
    const int block = s * mb + C / block_size;
    st.slots.push_back(int64_t(block) * block_size + C % block_size);
    st.cu_seqlens.push_back(s + 1);
    for (int b = 0; b < width; ++b)
      st.block_tables.push_back(b <= C / block_size && b < mb ? s * mb + b : -1);
    st.seq_lens.push_back(C + 1);
    st.logit_rows.push_back(s);
  }
  return st;
}

model::StepBatch prefill_step(int T, int64_t vocab, std::mt19937& rng) {
  model::StepBatch st;
  st.kind = model::StepKind::Prefill;
  st.cu_seqlens = {0, T};
  for (int t = 0; t < T; ++t) {
    st.tokens.push_back(int32_t(rng() % uint64_t(vocab)));
    st.positions.push_back(t);
    st.slots.push_back(t);
  }
  st.logit_rows = {T - 1};
  return st;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, size_t(std::floor(p * double(v.size() - 1) + 0.5)));
  return v[i];
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

}  // namespace

model::ModelWeights shape_only_weights(const ModelConfig& c, bool nvfp4) {
  const QuantConfig q = quant_of(nvfp4);
  model::check_runtime_supports(c, "preset");
  model::ModelWeights w;
  w.config = c;
  const int64_t H = c.hidden_size, hd = c.head_dim;
  w.embedding = shape_view("model.embed_tokens.weight", DType::BF16, {c.vocab_size, H});
  w.final_norm = shape_view("model.norm.weight", DType::BF16, {H});
  w.lm_head = shape_linear(q, "lm_head", c.vocab_size, H, false);
  for (int64_t L = 0; L < c.num_layers; ++L) {
    const std::string p = str("model.layers.", L);
    model::LayerWeights lw;
    lw.index = int(L);
    lw.input_norm = shape_view(p + ".input_layernorm.weight", DType::BF16, {H});
    lw.post_attention_norm = shape_view(p + ".post_attention_layernorm.weight", DType::BF16, {H});
    const std::string a = p + ".self_attn";
    if (c.attention == AttentionKind::MLA) {
      const int64_t heads = c.num_attention_heads, b = c.attention_bias;
      model::MlaWeights m;
      if (c.q_lora_rank > 0) {
        m.q_a = shape_linear(q, a + ".q_a_proj", c.q_lora_rank, H, b);
        m.q_a_norm = shape_view(a + ".q_a_layernorm.weight", DType::BF16, {c.q_lora_rank});
        lw.attn.q = shape_linear(q, a + ".q_b_proj", heads * hd, c.q_lora_rank, false);
      } else {
        lw.attn.q = shape_linear(q, a + ".q_proj", heads * hd, H, false);
      }
      m.kv_a = shape_linear(q, a + ".kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, H, b);
      m.kv_a_norm = shape_view(a + ".kv_a_layernorm.weight", DType::BF16, {c.kv_lora_rank});
      m.kv_b = shape_linear(q, a + ".kv_b_proj", heads * (c.qk_nope_head_dim + c.v_head_dim),
                            c.kv_lora_rank, false);
      lw.attn.o = shape_linear(q, a + ".o_proj", H, heads * c.v_head_dim, b);
      if (c.layer_has_indexer(L)) {
        const std::string i = a + ".indexer";
        const int64_t D = c.index_head_dim;
        m.indexer = model::IndexerWeights{
            shape_linear(q, i + ".wq_b", c.index_n_heads * D, c.q_lora_rank, false),
            shape_linear(q, i + ".wk", D, H, false),
            shape_view(i + ".k_norm.weight", DType::BF16, {D}),
            shape_view(i + ".k_norm.bias", DType::BF16, {D}),
            shape_linear(q, i + ".weights_proj", c.index_n_heads, H, false)};
      }
      lw.attn.mla = std::move(m);
    } else {
      lw.attn.q = shape_linear(q, a + ".q_proj", c.num_attention_heads * hd, H, c.attention_bias);
      lw.attn.k = shape_linear(q, a + ".k_proj", c.num_key_value_heads * hd, H, c.attention_bias);
      lw.attn.v = shape_linear(q, a + ".v_proj", c.num_key_value_heads * hd, H, c.attention_bias);
      lw.attn.o = shape_linear(q, a + ".o_proj", H, c.num_attention_heads * hd, false);
    }
    if (c.use_qk_norm) {
      lw.attn.q_norm = shape_view(a + ".q_norm.weight", DType::BF16, {hd});
      lw.attn.k_norm = shape_view(a + ".k_norm.weight", DType::BF16, {hd});
    }
    lw.is_moe = c.layer_is_moe.at(size_t(L));
    if (lw.is_moe) {
      model::MoeWeights m;
      const int64_t E = c.n_routed_experts;
      m.router = shape_view(p + ".mlp.gate.weight", DType::BF16, {E, H});
      m.router_params = moe::router_params_of(c);
      if (m.router_params.scoring == moe::Scoring::Sigmoid)
        m.correction_bias = shape_view(p + ".mlp.gate.e_score_correction_bias", DType::F32, {E});
      for (int64_t e = 0; e < E; ++e)
        m.experts.push_back(shape_mlp(q, str(p, ".mlp.experts.", e), H, c.moe_intermediate_size));
      if (c.n_shared_experts > 0)
        m.shared = shape_mlp(q, p + ".mlp.shared_experts", H,
                             c.n_shared_experts * c.moe_intermediate_size);
      lw.moe = std::move(m);
    } else {
      lw.dense = shape_mlp(q, p + ".mlp", H, c.intermediate_size);
    }
    w.layers.push_back(std::move(lw));
  }
  return w;
}

DecodeBenchReport run_decode_bench(const DecodeBenchOptions& o) {
  if (!cuda_available()) TETRA_FAIL("tetra bench decode needs a CUDA GPU; none is usable here");
  if (o.batches.empty() || o.contexts.empty()) TETRA_FAIL("--batch and --context need values");
  for (int b : o.batches)
    if (b < 1) TETRA_FAIL("--batch values must be >= 1, got ", b);
  for (int c : o.contexts)
    if (c < 1) TETRA_FAIL("--context values must be >= 1, got ", c);
  if (o.iters < 1) TETRA_FAIL("--iters must be >= 1");
  const bool from_file = !o.model_dir.empty();
  std::optional<Checkpoint> ckpt;  // owns the mapped files the loaded views point into
  model::ModelWeights w;
  QuantConfig quant;
  if (from_file) {
    ckpt.emplace(Checkpoint::open(o.model_dir));
    w = model::ModelWeights::load(*ckpt);
    quant = ckpt->quant();
  } else {
    ModelConfig pc = preset_config(o.preset);
    if (o.layers > 0) pc = with_num_layers(pc, o.layers);
    w = shape_only_weights(pc, o.nvfp4);
    quant = quant_of(o.nvfp4);
  }
  const ModelConfig& c = w.config;

  const int Bmax = *std::max_element(o.batches.begin(), o.batches.end());
  const int Cmax = *std::max_element(o.contexts.begin(), o.contexts.end());
  model::OpsLimits lim;
  lim.kv_block_size = 16;
  lim.max_seqs = Bmax;
  lim.max_tokens = std::max(Bmax, o.prefill_tokens);
  // Decode sequence s owns blocks [s * mb_decode, (s + 1) * mb_decode); the prefill's one
  // sequence takes blocks from 0. The table width covers both.
  const int mb_decode = (Cmax + 2 + 15) / 16, mb_prefill = (o.prefill_tokens + 15) / 16;
  lim.max_blocks_per_seq = std::max(mb_decode, mb_prefill);
  lim.kv_num_blocks = std::max(Bmax * mb_decode, mb_prefill);
  lim.moe_backend = "cuda-w4a16";
  if (o.tp < 1 || o.ep < 1) TETRA_FAIL("--tp and --ep must be at least 1");
  const ParallelPlan plan{o.tp, o.ep};
  const bool parallel = plan.world() > 1;
  if (parallel) {
    const std::vector<std::string> problems = dist::sharding_problems(c, quant, plan);
    if (!problems.empty()) {
      std::string list;
      for (const std::string& p : problems) list += "\n  - " + p;
      TETRA_FAIL("cannot split at tp=", o.tp, " ep=", o.ep, ":", list);
    }
  }
  // One GPU's KV heads (replicated when tp exceeds the KV heads).
  const int64_t kv_heads = std::max<int64_t>(1, c.num_key_value_heads / o.tp);
  // Elements per token and layer: k and v per KV head, or MLA's one latent row.
  // (GLM-5's indexer layers add an index key of index_head_dim.)
  const double kv_row = c.attention == AttentionKind::MLA
                            ? double(c.kv_lora_rank + c.qk_rope_head_dim +
                                     (c.index_n_heads > 0 ? c.index_head_dim : 0))
                            : double(kv_heads * c.head_dim * 2);
  const double kv_bytes = double(lim.kv_num_blocks) * lim.kv_block_size * kv_row * 2 *
                          double(c.num_layers);
  size_t free_b = 0, total_b = 0;
  TETRA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (kv_bytes > 0.5 * double(free_b))
    TETRA_FAIL("the KV cache for batch ", Bmax, " x context ", Cmax, " needs ", kv_bytes / 1e9,
               " GB; this GPU has ", double(free_b) / 1e9, " GB free: ask for less");

  auto ops = parallel ? model::parallel::make_parallel_cuda_model_ops(plan)
                      : model::cuda::make_cuda_model_ops_api();
  model::cuda::CudaOpsOptions copt;
  copt.graphs = o.graphs;
  copt.rope_in_attention = o.rope_in_attention;
  ops->set_options(copt);
  if (from_file)
    ops->prepare(w, lim);
  else
    ops->prepare_random(w, lim, o.seed);

  DecodeBenchReport r;
  r.preset = from_file ? o.model_dir : o.preset;
  r.config = c;
  r.nvfp4 = quant.quantized();
  r.commit = git_commit();
  r.date = today();
  r.command_line = o.command_line;
  r.logprobs_top = o.logprobs_top;
  cudaDeviceProp prop{};
  TETRA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  r.gpu = prop.name;
  r.weight_gb = double(ops->weight_bytes()) / 1e9;
  r.tp = o.tp;
  r.ep = o.ep;
  std::mt19937 rng(uint32_t(o.seed));
  using clock = std::chrono::steady_clock;
  // A timed step is what the runtime runs per token: the forward, then greedy sampling of its
  // logit rows on the GPU (with --logprobs each row's logprobs in the same call) with the tokens
  // copied to the host.
  std::vector<ops::SamplingParams> greedy;
  std::vector<int32_t> sampled, logprob_top;
  std::vector<ops::PositionLogprobs> answers;  // [rows] with --logprobs
  auto timed_forward = [&](model::ModelOps& m, const model::StepBatch& st) {
    greedy.assign(st.logit_rows.size(), ops::SamplingParams{.temperature = 0.0f});
    sampled.resize(st.logit_rows.size());
    model::SampleBatch batch{.rows = int(greedy.size()), .params = greedy.data()};
    if (o.logprobs_top >= 0) {
      logprob_top.assign(greedy.size(), o.logprobs_top);
      answers.resize(greedy.size());
      batch.logprob_top = logprob_top.data(), batch.logprobs = answers.data();
    }
    const auto t0 = clock::now();
    model::run_forward(m, w, st);
    m.sample(batch, sampled.data());
    ops->synchronize();  // every GPU's stream
    return std::chrono::duration<double, std::micro>(clock::now() - t0).count();
  };

  if (o.prefill_tokens > 0) {
    const model::StepBatch st = prefill_step(o.prefill_tokens, c.vocab_size, rng);
    st.validate(lim, c.vocab_size);
    std::vector<double> t;
    for (int i = 0; i < 4; ++i) t.push_back(timed_forward(*ops, st));
    t.erase(t.begin());  // first run warms up
    r.prefill_tokens = o.prefill_tokens;
    r.prefill_us = percentile(t, 0.5);
    r.prefill_tokens_per_s = o.prefill_tokens / (r.prefill_us * 1e-6);
    r.prefill_model_flops = prefill_flops(c, quant, o.prefill_tokens, int64_t(st.logit_rows.size()));
    if (o.per_op && !parallel) {  // prefill never runs as a graph: the same path, per op
      TimedOps timed(*ops, static_cast<cudaStream_t>(ops->stream()));
      r.prefill_eager_us = timed_forward(timed, st);
      r.prefill_ops = timed.results();
    }
  }

  // Stamps need their buffer before the first decode graph is captured (launches keep it).
  if (!o.block_stamps_path.empty()) perf::enable_block_stamps();
  // The floor's bandwidth: this GPU's table row (measured on the H200), else the driver's figure.
  const std::optional<GpuSpec> gpu = detect_local_gpu();
  TETRA_CHECK(gpu.has_value(), "tetra bench decode: no CUDA GPU detected");
  r.bandwidth_bytes_per_s = o.bandwidth > 0 ? o.bandwidth : gpu->bandwidth_bytes_per_s;
  r.bandwidth_source = o.bandwidth > 0 ? "given" : gpu->sources.bandwidth;
  for (int C : o.contexts)
    for (int B : o.batches) {
      const model::StepBatch st = decode_step(B, C, lim.kv_block_size, mb_decode,
                                              lim.max_blocks_per_seq, c.vocab_size, rng);
      st.validate(lim, c.vocab_size);
      DecodeBenchRow row;
      row.batch = B;
      row.context = C;
      for (int i = 0; i < o.warmup; ++i) timed_forward(*ops, st);
      std::vector<double> t;
      for (int i = 0; i < o.iters; ++i) t.push_back(timed_forward(*ops, st));
      if (!o.block_stamps_path.empty()) {  // one more step, its records alone
        perf::reset_block_stamps();
        timed_forward(*ops, st);
        perf::dump_block_stamps(o.block_stamps_path + ".b" + std::to_string(B) + ".c" +
                                std::to_string(C) + ".bin");
      }
      row.median_us = percentile(t, 0.5);
      row.p90_us = percentile(t, 0.9);
      row.tokens_per_s = B / (row.median_us * 1e-6);
      RooflineOptions ro;
      ro.batch = B;
      ro.context = C + 1;
      ro.bandwidth_bytes_per_s = o.bandwidth;
      ro.tp = o.tp;
      ro.ep = o.ep;
      const DecodeRoofline f = decode_roofline(c, quant, *gpu, ro);
      row.floor_us = f.memory_seconds * 1e6;
      row.floor_bytes = f.memory_bytes;
      row.unique_experts_per_layer = f.unique_experts_per_layer;
      row.comm_us = f.comm_seconds * 1e6;
      row.efficiency = row.floor_us / row.median_us;
      if (o.timeline_steps > 0 && !parallel) {
        server::CuptiKernelSource cupti;
        cupti.start();
        std::vector<perf::TimelineWindow> windows;
        std::vector<double> traced;
        for (int i = 0; i < o.timeline_steps; ++i) {
          perf::TimelineWindow win;
          win.begin_ns = cupti.now_ns();
          traced.push_back(timed_forward(*ops, st));
          win.end_ns = cupti.now_ns();
          windows.push_back(win);
        }
        std::vector<perf::TimelineKernel> kernels;
        for (server::KernelRecord& k : cupti.stop())
          kernels.push_back({std::move(k.name), k.start_ns, k.end_ns});
        row.timeline = perf::analyse_step_timeline(kernels, windows);
        row.traced_median_us = percentile(traced, 0.5);
      }
      if (o.per_op && !parallel) {
        const auto stream = static_cast<cudaStream_t>(ops->stream());
        copt.graphs = false;
        ops->set_options(copt);
        TimedOps timed(*ops, stream);
        row.eager_us = timed_forward(timed, st);
        row.ops = timed.results();
        copt.graphs = o.graphs;
        ops->set_options(copt);
      }
      r.rows.push_back(row);
    }
  r.folded_post_norms = ops->folded_post_norms();
  r.folded_routers = ops->folded_routers();
  r.folded_input_norms = ops->folded_input_norms();
  return r;
}

std::string decode_bench_markdown(const DecodeBenchReport& r) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  os << "# tetra bench decode: " << r.preset << " (" << (r.nvfp4 ? "NVFP4" : "BF16")
     << ", " << r.config.num_layers << " layers" << (r.tp * r.ep > 1 ? str(", tp ", r.tp, " ep ", r.ep) : std::string())
     << ")\n\n"
     << "- date " << r.date << ", commit " << r.commit << ", GPU " << r.gpu << "\n"
     << "- command: `" << r.command_line << "`\n"
     << "- weights on the GPU" << (r.tp * r.ep > 1 ? "s (all together)" : "") << ": " << r.weight_gb
     << " GB\n"
     << "- a step: the forward, greedy sampling on the GPU, the tokens on the host"
     << (r.logprobs_top >= 0 ? str(", each row's logprobs with ", r.logprobs_top, " alternatives")
                             : std::string())
     << "; floor at "
     << std::setprecision(2) << r.bandwidth_bytes_per_s / 1e12 << std::setprecision(1)
     << " TB/s (" << r.bandwidth_source << ")\n";
  if (r.prefill_tokens > 0)
    os << "- prefill of " << r.prefill_tokens << " tokens (one sequence): " << r.prefill_us / 1e3
       << " ms = " << r.prefill_tokens_per_s << " tokens/s, "
       << prefill_flops_per_s(r) / 1e12 << " TFLOP/s of model FLOPs"
       << (r.tp * r.ep > 1 ? " (all GPUs together)" : "") << " ("
       << r.prefill_model_flops.linear / 1e12 << " TFLOP in the linears, "
       << r.prefill_model_flops.attention / 1e12 << " in attention)\n";
  if (r.folded_post_norms > 0)
    os << "- one-token folds recorded: the post-attention norm in " << r.folded_post_norms
       << " layer launches, the MoE router with it in " << r.folded_routers << "\n";
  if (r.folded_input_norms > 0)
    os << "- input norms folded into q/k/v (up to 8 tokens): " << r.folded_input_norms
       << " layer launches\n";
  os << "\n| batch | context | median us/step | p90 us | tokens/s | floor us | efficiency | "
     << (r.tp * r.ep > 1 ? "achieved TB/s per GPU" : "achieved TB/s") << " | unique experts/layer |\n"
     << "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& row : r.rows)
    os << "| " << row.batch << " | " << row.context << " | " << row.median_us << " | " << row.p90_us
       << " | " << row.tokens_per_s << " | " << row.floor_us << " | " << 100 * row.efficiency
       << "% | " << std::setprecision(2) << achieved_bytes_per_s(row) / 1e12
       << std::setprecision(1) << " | " << row.unique_experts_per_layer << " |\n";
  if (!r.prefill_ops.empty()) {
    os << "\nPer op, the prefill of " << r.prefill_tokens << " tokens (CUDA events): total "
       << r.prefill_eager_us << " us wall\n\n| op | us | calls |\n|---|---|---|\n";
    for (const auto& t : r.prefill_ops) os << "| " << t.op << " | " << t.us << " | " << t.calls << " |\n";
  }
  for (const auto& row : r.rows) {
    if (row.ops.empty()) continue;
    os << "\nPer op, one eager step (CUDA events; no graph), batch " << row.batch << " context "
       << row.context << ": total " << row.eager_us << " us wall\n\n| op | us | calls |\n|---|---|---|\n";
    for (const auto& t : row.ops) os << "| " << t.op << " | " << t.us << " | " << t.calls << " |\n";
  }
  for (const auto& row : r.rows) {
    if (!row.timeline) continue;
    const perf::TimelineRange layer = perf::middle_period(*row.timeline);
    os << "\nBatch " << row.batch << " context " << row.context << ", traced steps: "
       << row.traced_median_us << " us wall (untraced " << row.median_us << ")\n\n"
       << perf::step_timeline_markdown(*row.timeline, layer.first, layer.count);
  }
  return os.str();
}

nlohmann::json decode_bench_json(const DecodeBenchReport& r) {
  nlohmann::json j;
  j["preset"] = r.preset;
  j["format"] = r.nvfp4 ? "NVFP4" : "BF16";
  j["layers"] = r.config.num_layers;
  j["folded_post_norms"] = r.folded_post_norms;  // layers recorded with the one-token folds
  j["folded_routers"] = r.folded_routers;
  j["folded_input_norms"] = r.folded_input_norms;  // layers recorded with q/k/v's input norm folded
  j["gpu"] = r.gpu;
  j["commit"] = r.commit;
  j["date"] = r.date;
  j["command"] = r.command_line;
  j["logprobs_top"] = r.logprobs_top;
  j["weight_gb"] = r.weight_gb;
  j["floor_bandwidth_bytes_per_s"] = r.bandwidth_bytes_per_s;
  j["floor_bandwidth_source"] = r.bandwidth_source;
  j["tp"] = r.tp;
  j["ep"] = r.ep;
  j["prefill"] = {{"tokens", r.prefill_tokens}, {"us", r.prefill_us},
                  {"tokens_per_s", r.prefill_tokens_per_s}, {"eager_us", r.prefill_eager_us},
                  {"model_flops", r.prefill_model_flops.total()},
                  {"model_flops_linear", r.prefill_model_flops.linear},
                  {"model_flops_attention", r.prefill_model_flops.attention},
                  {"flops_per_s", prefill_flops_per_s(r)},
                  {"ops", nlohmann::json::array()}};
  for (const auto& t : r.prefill_ops)
    j["prefill"]["ops"].push_back({{"op", t.op}, {"us", t.us}, {"calls", t.calls}});
  j["rows"] = nlohmann::json::array();
  for (const auto& row : r.rows) {
    nlohmann::json x = {{"batch", row.batch}, {"context", row.context}, {"median_us", row.median_us},
                        {"p90_us", row.p90_us}, {"tokens_per_s", row.tokens_per_s},
                        {"floor_us", row.floor_us}, {"floor_bytes", row.floor_bytes},
                        {"comm_estimate_us", row.comm_us},
                        {"efficiency", row.efficiency},
                        {"achieved_bytes_per_s", achieved_bytes_per_s(row)},
                        {"unique_experts_per_layer", row.unique_experts_per_layer},
                        {"eager_us", row.eager_us}};
    x["ops"] = nlohmann::json::array();
    for (const auto& t : row.ops) x["ops"].push_back({{"op", t.op}, {"us", t.us}, {"calls", t.calls}});
    if (row.timeline) {
      const perf::StepTimeline& tl = *row.timeline;
      nlohmann::json tj = {{"steps", tl.steps}, {"dropped_steps", tl.dropped_steps},
                           {"span_us", tl.span_us}, {"busy_us", tl.busy_us},
                           {"traced_median_us", row.traced_median_us}};
      for (const auto& b : tl.by_name)
        tj["by_name"].push_back({{"name", b.name}, {"per_step", b.per_step},
                                 {"duration_us", b.duration_us}, {"gap_us", b.gap_us},
                                 {"exposed_us", b.exposed_us}});
      for (const auto& p : tl.positions)
        tj["positions"].push_back({{"name", p.name}, {"start_us", p.start_us},
                                   {"duration_us", p.duration_us}, {"gap_us", p.gap_us},
                                   {"exposed_us", p.exposed_us}});
      x["timeline"] = tj;
    }
    j["rows"].push_back(x);
  }
  return j;
}

}  // namespace tetra::bench
