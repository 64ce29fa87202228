#include "model/moe_layer_views.h"

#include "core/error.h"
#include "model/tensor_to_float.h"

namespace tetra::model {
Nvfp4MatrixView nvfp4_view(const LinearWeight& l) {
  TETRA_CHECK(l.weight_scale.has_value(), l.module, " has no weight_scale");
  Nvfp4MatrixView v;
  v.weight = l.weight.data;
  v.scale = l.weight_scale->data;
  v.scale_2 = l.weight_scale_2;
  v.n = int(l.out_features);
  v.k = int(l.in_features);
  v.name = l.module;
  v.input_scale = l.input_scale;  // W4A4 activation scale (absent in W4A16_NVFP4)
  return v;
}

std::unique_ptr<MoeLayerViews> moe_layer_views(const MoeWeights& mw, int layer, int64_t hidden) {
  TETRA_CHECK(!mw.experts.empty(), "layer ", layer, " has no experts");
  if (mw.global_experts != 0)
    TETRA_CHECK(mw.expert_begin >= 0 && mw.expert_begin + int(mw.experts.size()) <= mw.global_experts,
                "layer ", layer, ": experts ", mw.expert_begin, " + ", mw.experts.size(),
                " outside the ", mw.global_experts, " of the model");
  auto out = std::make_unique<MoeLayerViews>();
  MoeLayerViews& v = *out;
  moe::MoeLayerWeights& w = v.weights;
  w.name = str("model.layers.", layer, ".mlp");
  w.hidden = int(hidden);
  w.inter = int(mw.experts.front().inter());
  w.router = mw.router_params;  // num_experts: every expert of the model (the router's rows)
  w.expert_begin = mw.expert_begin;  // expert parallel: experts[0] is this global expert
  if (mw.router.shape.size() == 2) w.gate_rows = int(mw.router.shape[0]);
  if (mw.router.dtype == DType::BF16 || mw.router.dtype == DType::F32) {
    w.gate = mw.router.data;
    w.gate_dtype = mw.router.dtype;
  } else {
    v.router_bf16 = tensor_to_bf16(mw.router);
    w.gate = v.router_bf16.data();
    w.gate_dtype = DType::BF16;
  }
  if (mw.correction_bias) {
    v.bias = tensor_to_float(*mw.correction_bias);
    w.bias = v.bias.data();
  }
  auto bf16_view = [&](const LinearWeight& l) {
    moe::Bf16MatrixView m{nullptr, int(l.out_features), int(l.in_features), l.module};
    if (l.weight.dtype == DType::BF16) {
      m.weight = reinterpret_cast<const uint16_t*>(l.weight.data);
    } else {
      v.converted.push_back(tensor_to_bf16(l.weight));  // deque: earlier copies never move
      m.weight = v.converted.back().data();
    }
    return m;
  };
  auto mlp_view = [&](const MlpWeights& m) {
    moe::ExpertMlpView e;
    if (m.gate.quantized != m.up.quantized || m.gate.quantized != m.down.quantized)
      TETRA_FAIL(m.gate.module, ", up_proj and down_proj must be all NVFP4 or all high precision");
    if (m.gate.quantized) {
      e.format = moe::ExpertFormat::NVFP4;
      e.gate = nvfp4_view(m.gate);
      e.up = nvfp4_view(m.up);
      e.down = nvfp4_view(m.down);
    } else {
      e.format = moe::ExpertFormat::BF16;
      e.gate_bf16 = bf16_view(m.gate);
      e.up_bf16 = bf16_view(m.up);
      e.down_bf16 = bf16_view(m.down);
    }
    return e;
  };
  const bool nvfp4 = mw.experts.front().gate.quantized;
  for (const MlpWeights& e : mw.experts) {
    if (e.gate.quantized != nvfp4)
      TETRA_FAIL(e.gate.module, " is ", e.gate.quantized ? "NVFP4" : "high precision",
                 " but ", mw.experts.front().gate.module, " is not: the routed experts of a layer "
                 "must share one format");
    w.experts.push_back(mlp_view(e));
  }
  if (mw.shared) w.shared = mlp_view(*mw.shared);
  return out;
}

}  // namespace tetra::model
