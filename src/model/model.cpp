#include "model/model.h"

#include "core/error.h"
#include "dist/sharding_plan.h"
#include "model/parallel/parallel_model_ops.h"

namespace tetra::model {
namespace {

// The backend for tp/ep > 1: the cuda backend on GPUs 0 .. world-1, or (tests, no GPU) the cpu
// backend on one thread per rank. Refuses splits the model or the machine cannot take.
std::unique_ptr<ModelOps> make_parallel_ops(const ModelOptions& opt, const Checkpoint& ckpt,
                                            const ModelConfig& cfg) {
  if (opt.tp < 1 || opt.ep < 1) TETRA_FAIL("tp and ep must be at least 1 (tp ", opt.tp, ", ep ", opt.ep, ")");
  const ParallelPlan plan{opt.tp, opt.ep};
  const std::vector<std::string> problems = dist::sharding_problems(cfg, ckpt.quant(), plan);
  if (!problems.empty()) {
    std::string list;
    for (const std::string& p : problems) list += "\n  - " + p;
    TETRA_FAIL(ckpt.dir().string(), " cannot be split at tp=", opt.tp, " ep=", opt.ep, ":", list);
  }
  const std::string backend = resolve_model_ops_name(opt.backend);
  if (backend == "cuda") return parallel::make_parallel_cuda_model_ops(plan);
  if (backend == "cpu") return parallel::make_parallel_cpu_model_ops(plan);
  TETRA_FAIL("tp/ep > 1 runs on the cuda backend (or cpu, simulated on threads), not ", backend);
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, const ModelOptions& opt) {
  const OpsLimits& lim = opt.limits;
  if (lim.max_tokens <= 0 || lim.max_seqs <= 0 || lim.kv_block_size <= 0 ||
      lim.kv_num_blocks <= 0 || lim.max_blocks_per_seq <= 0)
    TETRA_FAIL("model limits must be positive (max_tokens ", lim.max_tokens, ", max_seqs ",
               lim.max_seqs, ", kv_block_size ", lim.kv_block_size, ", kv_num_blocks ",
               lim.kv_num_blocks, ", max_blocks_per_seq ", lim.max_blocks_per_seq, ")");
  std::unique_ptr<Model> m(new Model());
  m->ckpt_ = std::make_unique<Checkpoint>(Checkpoint::open(dir));
  m->weights_ = ModelWeights::load(*m->ckpt_);
  m->limits_ = lim;
  if (opt.tp != 1 || opt.ep != 1)
    m->ops_ = make_parallel_ops(opt, *m->ckpt_, m->weights_.config);
  else
    m->ops_ = make_model_ops(opt.backend);
  m->ops_->prepare(m->weights_, lim);
  return m;
}

void Model::forward(const StepBatch& step) {
  step.validate(limits_, weights_.config.vocab_size);
  run_forward(*ops_, weights_, step);
}

std::vector<float> Model::forward_logits(const StepBatch& step) {
  forward(step);
  std::vector<float> out(size_t(step.num_logit_rows()) * size_t(weights_.config.vocab_size));
  if (!out.empty()) ops_->read_logits(out.data());  // [R, vocab]
  return out;
}

}  // namespace tetra::model
