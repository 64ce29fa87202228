// A loaded model: checkpoint (mapped), weight views, and a backend (ModelOps) holding the
// prepared weights, buffers and KV cache. forward() runs one step through every layer:
//   x = embed(tokens)
//   per layer: h = x + o_proj(Attn(RMSNorm(x)));  x = h + MLP_or_MoE(RMSNorm(h))
//   logits = lm_head(RMSNorm(x)) for the step's logit rows
// Attention: q/k/v projections (+bias), optional per-head q/k RMSNorm before RoPE (partial,
// NeoX or GPT-J per config), KV cache write, causal prefill or paged decode, o_proj.
#pragma once
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "format/checkpoint.h"
#include "model/model_ops.h"
#include "model/model_weights.h"
#include "model/step_batch.h"

namespace tetra::model {

struct ModelOptions {
  std::string backend = "cpu";  // a make_model_ops name: "cpu", "cuda", "auto"
  OpsLimits limits;             // buffers and KV cache the backend is sized for
  // Tensor / expert parallel ranks (dist/sharding_plan.h): the cuda backend on GPUs
  // 0 .. max(tp, ep) - 1 (model/parallel/parallel_model_ops.h); the cpu backend simulates the
  // ranks on threads (tests). load() refuses splits the model does not divide into.
  int tp = 1, ep = 1;
};

class Model {
 public:
  // Opens and validates the checkpoint, builds the weight views, creates and prepares the
  // backend. Throws tetra::Error naming the directory/tensor on bad input, and for MLA models.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir, const ModelOptions& opt);

  const ModelConfig& config() const { return weights_.config; }
  const OpsLimits& limits() const { return limits_; }
  ModelOps& ops() { return *ops_; }
  const std::filesystem::path& dir() const { return ckpt_->dir(); }

  // Validates the step and runs it; afterwards the backend holds f32 logits [R, vocab] for
  // step.logit_rows (read_logits / sample on ops()), and the step's k/v are in the cache.
  void forward(const StepBatch& step);
  // forward() then the logits on the host: [R, vocab] f32, row-major.
  std::vector<float> forward_logits(const StepBatch& step);

 private:
  Model() = default;

  std::unique_ptr<Checkpoint> ckpt_;  // owns the mapped files the weight views point into
  ModelWeights weights_;
  std::unique_ptr<ModelOps> ops_;
  OpsLimits limits_;
};

// The forward pass against any backend (what Model::forward runs after validating the step).
void run_forward(ModelOps& ops, const ModelWeights& weights, const StepBatch& step);

}  // namespace tetra::model
