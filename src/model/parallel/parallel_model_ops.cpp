// ParallelModelOps: see parallel_model_ops.h.
#include "model/parallel/parallel_model_ops.h"

#include <algorithm>
#include <optional>

#include "core/cuda_check.h"
#include "core/error.h"
#include "dist/parallel_check.h"
#include "dist/rank_threads.h"
#include "dist/rank_workers.h"
#include "model/cpu_model_ops.h"
#include "model/parallel/cpu_all_reduce.h"
#include "model/parallel/shard_weights.h"

namespace tetra::model::parallel {
namespace {

// One recorded op, replayed on every rank's backend.
using RankOp = std::function<void(ModelOps& ops)>;

class ParallelModelOps final : public cuda::CudaModelOpsApi {
 public:
  explicit ParallelModelOps(ParallelOpsConfig cfg)
      : cfg_(std::move(cfg)), world_(cfg_.plan.world()),
        workers_(world_, cfg_.devices), ranks_(size_t(world_)) {
    TETRA_CHECK(cfg_.make_rank != nullptr, "parallel model ops without a rank backend factory");
    workers_.run_all([&](int r) { ranks_[size_t(r)] = cfg_.make_rank(r); });
  }
  ~ParallelModelOps() override {
    // Each backend is destroyed on its own thread (its GPU current), before the all-reduce.
    try {
      workers_.run_all([&](int r) { ranks_[size_t(r)].reset(); });
    } catch (...) {
    }
  }

  std::string name() const override { return cfg_.name; }

  void prepare(const ModelWeights& w, const OpsLimits& lim) override { setup(w, lim, nullptr); }
  void prepare_random(const ModelWeights& w, const OpsLimits& lim, uint64_t seed) override {
    setup(w, lim, &seed);
  }

  void begin_step(const StepBatch& step) override {
    flush();
    step_ = step;  // the recorded ops read this copy, not the caller's
    record([this](ModelOps& o) { o.begin_step(*step_); });
  }
  void embed(Buf out) override {
    record([=](ModelOps& o) { o.embed(out); });
  }
  void rms_norm(NormId which, int layer, Buf in, Buf out) override {
    record([=](ModelOps& o) { o.rms_norm(which, layer, in, out); });
  }
  void add_rms_norm(NormId which, int layer, Buf x, Buf residual, Buf out) override {
    record([=](ModelOps& o) { o.add_rms_norm(which, layer, x, residual, out); });
  }
  void linear(LinearId which, int layer, Buf in, Buf out) override {
    record([=](ModelOps& o) { o.linear(which, layer, in, out); });
  }
  void qkv(int layer, Buf in, Buf q, Buf k, Buf v) override {
    record([=](ModelOps& o) { o.qkv(layer, in, q, k, v); });
  }
  void dense_gate_up(int layer, Buf in, Buf gate, Buf up, int64_t width) override {
    if (width == full_.intermediate_size) width = rank_.intermediate_size;  // as silu_mul
    record([=](ModelOps& o) { o.dense_gate_up(layer, in, gate, up, width); });
  }
  void head_norm(NormId which, int layer, Buf x) override {
    record([=](ModelOps& o) { o.head_norm(which, layer, x); });
  }
  void qk_head_norm(int layer, Buf q, Buf k) override {
    record([=](ModelOps& o) { o.qk_head_norm(layer, q, k); });
  }
  void rope_write_kv(int layer, Buf q, Buf k, Buf v) override {
    record([=](ModelOps& o) { o.rope_write_kv(layer, q, k, v); });
  }
  void prefill_attention(Buf q, Buf k, Buf v, Buf out) override {
    record([=](ModelOps& o) { o.prefill_attention(q, k, v, out); });
  }
  void decode_attention(int layer, Buf q, Buf out) override {
    record([=](ModelOps& o) { o.decode_attention(layer, q, out); });
  }
  void rope_decode_attention(int layer, Buf q, Buf k, Buf v, Buf out) override {
    record([=](ModelOps& o) { o.rope_decode_attention(layer, q, k, v, out); });
  }
  void extend_attention(int layer, Buf q, Buf out) override {
    record([=](ModelOps& o) { o.extend_attention(layer, q, out); });
  }
  void dsa_select(int layer, Buf q_idx, Buf k_idx, Buf w_idx) override {
    record([=](ModelOps& o) { o.dsa_select(layer, q_idx, k_idx, w_idx); });
  }
  void mla_attention(int layer, Buf q, Buf kv_a, Buf out) override {
    record([=](ModelOps& o) { o.mla_attention(layer, q, kv_a, out); });
  }
  void silu_mul(Buf gate, Buf up, int64_t width, Buf out) override {
    // The forward pass passes the model's dense width; each rank holds a tp slice of it.
    if (width == full_.intermediate_size) width = rank_.intermediate_size;
    record([=](ModelOps& o) { o.silu_mul(gate, up, width, out); });
  }
  void moe(int layer, Buf in, Buf out) override {
    record([=](ModelOps& o) { o.moe(layer, in, out); });
  }
  void all_reduce(Buf b) override {
    record([=](ModelOps& o) { o.all_reduce(b); });
  }
  void logits(Buf in) override {
    record([=](ModelOps& o) { o.logits(in); });
    flush();  // the step is complete: hand it to the ranks
  }
  void read_logits(float* out) override {
    flush();
    workers_.run_one(0, [&] { ranks_[0]->read_logits(out); });
  }
  void sample(const SampleBatch& batch, int32_t* tokens) override {
    flush();
    workers_.run_one(0, [&] { ranks_[0]->sample(batch, tokens); });
  }
  void logprobs(const ops::LogprobQuery* queries, int n, ops::PositionLogprobs* out) override {
    flush();
    workers_.run_one(0, [&] { ranks_[0]->logprobs(queries, n, out); });
  }
  void copy_kv_blocks(const std::vector<runtime::BlockCopy>& copies) override {
    flush();
    workers_.run_all([&](int r) { ranks_[size_t(r)]->copy_kv_blocks(copies); });
  }

  // ---- CudaModelOpsApi ----
  void set_options(const cuda::CudaOpsOptions& o) override {
    flush();
    workers_.run_all([&](int r) { cuda_rank(r).set_options(o); });
  }
  size_t weight_bytes() const override {
    size_t sum = 0;
    for (int r = 0; r < world_; ++r) sum += cuda_rank(r).weight_bytes();
    return sum;
  }
  size_t device_bytes() const override {
    std::vector<size_t> b(static_cast<size_t>(world_));
    const_cast<dist::RankWorkers&>(workers_).run_all(
        [&](int r) { b[size_t(r)] = cuda_rank(r).device_bytes(); });
    size_t sum = 0;
    for (size_t x : b) sum += x;
    return sum;
  }
  void synchronize() override {
    flush();
    workers_.run_all([&](int r) {
      if (auto* c = dynamic_cast<cuda::CudaModelOpsApi*>(ranks_[size_t(r)].get())) c->synchronize();
    });
  }
  int graphs_captured() const override { return cuda_rank(0).graphs_captured(); }
  int64_t folded_post_norms() const override { return cuda_rank(0).folded_post_norms(); }
  int64_t folded_routers() const override { return cuda_rank(0).folded_routers(); }
  int64_t folded_input_norms() const override { return cuda_rank(0).folded_input_norms(); }
  void* stream() const override { return cuda_rank(0).stream(); }
  void set_all_reduce_hook(AllReduceHook) override {
    TETRA_FAIL("the parallel model backend owns its all-reduce; it takes no hook");
  }

 private:
  void record(RankOp op) { program_.push_back(std::move(op)); }

  // Every rank issues the recorded ops, concurrently (the all-reduces need all of them).
  // A rank that throws mid-step leaves its peers waiting in an all-reduce it never joins; the
  // split model is then unusable (its GPUs may never finish the step), so every later call
  // refuses instead of waiting on them.
  void flush() {
    TETRA_CHECK(!failed_, "the tensor/expert parallel model failed in an earlier step (a rank "
                "stopped mid-step); reload the model");
    if (program_.empty()) return;
    std::vector<RankOp> prog;
    prog.swap(program_);
    try {
      workers_.run_all([&](int r) {
        ModelOps& o = *ranks_[size_t(r)];
        for (const RankOp& op : prog) op(o);
      });
    } catch (...) {
      failed_ = true;
      throw;
    }
  }

  cuda::CudaModelOpsApi& cuda_rank(int r) const {
    auto* c = dynamic_cast<cuda::CudaModelOpsApi*>(ranks_[size_t(r)].get());
    TETRA_CHECK(c != nullptr, "rank ", r, " runs the ", ranks_[size_t(r)]->name(),
                " backend, not cuda");
    return *c;
  }

  void setup(const ModelWeights& w, const OpsLimits& lim, const uint64_t* seed) {
    program_.clear();
    plan_.emplace(w.config, cfg_.plan, runnable_sharding(w.config, cfg_.plan, cfg_.sharding));
    full_ = w.config;
    rank_ = rank_config(w.config, *plan_, 0);
    workers_.run_all([&](int r) {
      const std::unique_ptr<RankWeights> shard = shard_weights(w, *plan_, r);
      if (seed)
        cuda_rank(r).prepare_random(shard->weights, lim, *seed);
      else
        ranks_[size_t(r)]->prepare(shard->weights, lim);
    });
  }

  ParallelOpsConfig cfg_;
  int world_;
  dist::RankWorkers workers_;
  std::vector<std::unique_ptr<ModelOps>> ranks_;  // [world], rank r built and used on thread r
  std::optional<dist::ShardingPlan> plan_;
  ModelConfig full_, rank_;  // the model's config and one rank's (rank_config)
  std::optional<StepBatch> step_;   // the current step (recorded ops point at it)
  std::vector<RankOp> program_;     // the current step's ops, not yet handed to the ranks
  bool failed_ = false;             // a rank threw during a step (see flush)
};

}  // namespace

std::unique_ptr<cuda::CudaModelOpsApi> make_parallel_model_ops(ParallelOpsConfig cfg) {
  return std::make_unique<ParallelModelOps>(std::move(cfg));
}

std::unique_ptr<cuda::CudaModelOpsApi> make_parallel_cuda_model_ops(ParallelPlan plan,
                                                                     const dist::AllReduceConfig& ar) {
  const int world = plan.world();
  if (auto p = dist::gpu_count_problem(plan, dist::visible_gpu_count())) TETRA_FAIL(*p);
  auto group = std::make_shared<dist::AllReduceGroup>(dist::first_devices(world), ar);
  ParallelOpsConfig cfg;
  cfg.plan = plan;
  cfg.devices = dist::first_devices(world);
  cfg.name = "cuda";
  cfg.keep_alive = group;
  dist::AllReduceGroup* g = group.get();
  cfg.make_rank = [g](int r) -> std::unique_ptr<ModelOps> {
    auto ops = cuda::make_cuda_model_ops_api();
    dist::AllReduce* ar_rank = &g->rank(r);
    ops->set_all_reduce_hook([ar_rank](uint16_t* data, size_t count, void* stream) {
      ar_rank->run(data, data, count, static_cast<cudaStream_t>(stream));
    });
    return ops;
  };
  return make_parallel_model_ops(std::move(cfg));
}

std::unique_ptr<ModelOps> make_parallel_cpu_model_ops(ParallelPlan plan) {
  auto sum = std::make_shared<CpuAllReduce>(plan.world());
  ParallelOpsConfig cfg;
  cfg.plan = plan;
  cfg.name = "cpu";
  cfg.keep_alive = sum;
  CpuAllReduce* s = sum.get();
  cfg.make_rank = [s](int r) {
    return make_cpu_model_ops([s, r](uint16_t* data, size_t count) { s->run(r, data, count); });
  };
  return make_parallel_model_ops(std::move(cfg));
}

}  // namespace tetra::model::parallel
