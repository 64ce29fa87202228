// make_cuda_moe_block: see cuda_moe_block.h.
#include "model/cuda/cuda_moe_block.h"

#include "core/error.h"
#include "model/moe_layer_views.h"
#include "ops/moe/moe_layer_cuda.h"

namespace tetra::model::cuda {

CudaMoeBlock make_cuda_moe_block(const MoeWeights& mw, const CudaMoeBlockSpec& spec) {
  const int E = int(mw.experts.size());
  TETRA_CHECK(E > 0, "layer ", spec.layer, " has no experts");
  CudaMoeBlock block;
  if (spec.random) {
    TETRA_CHECK(spec.seed != nullptr, "random MoE block without a seed");
    moe::RandomMoeLayer r;
    r.experts = E;
    r.hidden = spec.hidden;
    r.inter = int(mw.experts.front().inter());
    r.shared_inter = mw.shared ? int(mw.shared->inter()) : 0;
    r.router = mw.router_params;  // routes over every expert of the model
    r.expert_begin = mw.expert_begin;  // expert parallel: this rank's block
    r.global_experts = mw.global_experts;
    r.seed = uint32_t((*spec.seed)++);
    auto layer = std::make_unique<moe::CudaW4a16MoeLayer>(r, spec.max_tokens,
                                                          TokenLayout::Contiguous,
                                                          moe::cuda_token_path_from_env());
    block.weight_bytes = size_t(E) * layer->expert_bytes() + layer->shared_bytes();
    block.runner = std::move(layer);
    return block;
  }
  // The runner uploads (or, on the host, converts) everything it needs while it is built, so
  // the views only have to outlive the constructor.
  const auto views = moe_layer_views(mw, spec.layer, spec.hidden);
  moe::MoeLayerOptions o;
  // "auto" takes the backend the declarations pick for this layer (cuda-w4a16 for NVFP4 and
  // cuda-bf16 for BF16 experts on SM90); one that runs on the host turns graphs off.
  o.backend = spec.backend;
  o.max_tokens = spec.max_tokens;
  block.runner = moe::make_moe_layer(views->weights, o);
  return block;
}

}  // namespace tetra::model::cuda
