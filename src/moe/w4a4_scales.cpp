#include "moe/w4a4_scales.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tetra {

void check_input_scale(float input_scale, const std::string& name) {
  if (!(input_scale > 0.0f) || !std::isfinite(input_scale))
    TETRA_FAIL("'", name, "': input_scale must be positive and finite, got ", input_scale);
  if (!std::isfinite(1.0f / input_scale))
    TETRA_FAIL("'", name, "': input_scale ", input_scale, " is too small (1/input_scale overflows)");
}

float w4a4_gate_up_input_scale(float gate_input_scale, float up_input_scale,
                               const std::string& expert_name) {
  check_input_scale(gate_input_scale, expert_name + ".gate_proj.input_scale");
  check_input_scale(up_input_scale, expert_name + ".up_proj.input_scale");
  return std::max(gate_input_scale, up_input_scale);
}

void fold_w4a4_input_scales(PackedMoeLayer& layer, const std::vector<float>& input_scale13,
                            const std::vector<float>& input_scale2) {
  const size_t E = size_t(layer.num_experts);
  if (input_scale13.size() != E || input_scale2.size() != E)
    TETRA_FAIL("fold_w4a4_input_scales: layer has ", E, " experts but got ", input_scale13.size(),
               " gate/up and ", input_scale2.size(), " down input scales");
  for (size_t e = 0; e < E; ++e) {
    check_input_scale(input_scale13[e], str("expert ", e, " gate/up"));
    check_input_scale(input_scale2[e], str("expert ", e, " down_proj"));
    layer.alpha_gate[e] *= input_scale13[e];
    layer.alpha_up[e] *= input_scale13[e];
    layer.alpha_down[e] *= input_scale2[e];
  }
}

}  // namespace tetra
