// The outputs of one multi-output NVFP4 launch (the decode GEMV and the small-M kernel) as a
// kernel argument: up to kNvfp4GemvMaxOutputs matrices over the same x, each with its own scale,
// bias and output buffer (fused q/k/v).
#pragma once
#include <cstdint>
#include <string>

#include "core/error.h"
#include "ops/linear/linear_cuda.h"

namespace tetra::ops::cuda {

struct Nvfp4OutputsArg {
  const uint8_t* w[kNvfp4GemvMaxOutputs];      // [n/16][k/64][32][16] fragment words
  const uint8_t* s[kNvfp4GemvMaxOutputs];      // [n/16][k/64][32][2] ue5m3 scale pairs
  const float* alpha[kNvfp4GemvMaxOutputs];    // [1]
  const uint16_t* bias[kNvfp4GemvMaxOutputs];  // [n] bf16 or null
  uint16_t* y[kNvfp4GemvMaxOutputs];           // [M, n] bf16 (null with a residual)
  uint16_t* residual[kNvfp4GemvMaxOutputs];    // [M, n] bf16 or null (Nvfp4GemvOutput::residual)
  int n[kNvfp4GemvMaxOutputs];
  int outputs;
};

// Copies the outputs' pointers and sizes; `what` names the kernel in the error for an output
// without device data.
inline Nvfp4OutputsArg outputs_arg(const Nvfp4GemvOutput* outs, int n_outs, const char* what) {
  Nvfp4OutputsArg a{};
  for (int i = 0; i < n_outs; ++i) {
    const Nvfp4LinearDevice& w = *outs[i].w;
    TETRA_CHECK(w.w && w.s && w.alpha && (outs[i].y || outs[i].residual), what, " output ", i,
                " without device data");
    a.w[i] = w.w;
    a.s[i] = w.s;
    a.alpha[i] = w.alpha;
    a.bias[i] = outs[i].bias;
    a.y[i] = outs[i].y;
    a.residual[i] = outs[i].residual;
    a.n[i] = w.n;
  }
  a.outputs = n_outs;
  return a;
}

// Why these outputs cannot share one launch ("" when they can): 1..kNvfp4GemvMaxOutputs plain
// NVFP4 matrices of one k, n % 16 == 0 and k % 64 == 0.
inline std::string outputs_shape_reason(const Nvfp4GemvOutput* outs, int n_outs) {
  if (n_outs < 1 || n_outs > kNvfp4GemvMaxOutputs) return str(n_outs, " outputs");
  for (int i = 0; i < n_outs; ++i) {
    const Nvfp4LinearDevice* w = outs[i].w;
    if (w == nullptr || w->gated) return str("output ", i, ": no plain NVFP4 matrix");
    if (w->k != outs[0].w->k) return str("output ", i, ": k ", w->k, " != ", outs[0].w->k);
    // 64-k chunks and 16-row tiles of the fragment layout (moe/expert_weights.h)
    if (w->k <= 0 || w->k % 64 != 0 || w->n <= 0 || w->n % 16 != 0)
      return str("output ", i, ": shape [", w->n, ", ", w->k, "]");
  }
  return "";
}

}  // namespace tetra::ops::cuda
