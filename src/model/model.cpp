#include "model/model.h"

#include "core/error.h"

namespace tetra::model {

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, const ModelOptions& opt) {
  const OpsLimits& lim = opt.limits;
  if (lim.max_tokens <= 0 || lim.max_seqs <= 0 || lim.kv_block_size <= 0 ||
      lim.kv_num_blocks <= 0 || lim.max_blocks_per_seq <= 0)
    TETRA_FAIL("model limits must be positive (max_tokens ", lim.max_tokens, ", max_seqs ",
               lim.max_seqs, ", kv_block_size ", lim.kv_block_size, ", kv_num_blocks ",
               lim.kv_num_blocks, ", max_blocks_per_seq ", lim.max_blocks_per_seq, ")");
  if (opt.tp != 1 || opt.ep != 1)
    TETRA_FAIL("tensor/expert parallel model loading (tp ", opt.tp, ", ep ", opt.ep,
               ") is not built yet");
  std::unique_ptr<Model> m(new Model());
  m->ckpt_ = std::make_unique<Checkpoint>(Checkpoint::open(dir));
  m->weights_ = ModelWeights::load(*m->ckpt_);
  m->limits_ = lim;
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
