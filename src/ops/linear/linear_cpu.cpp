// CPU reference linears: dequantize (NVFP4) or widen (BF16) the weight once, then a float dot
// product per output element.
#include "ops/linear/linear.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/parallel.h"
#include "format/nvfp4.h"

namespace tetra::ops {
namespace {

void check_out_dtype(DType d, const char* what) {
  if (d != DType::F32 && d != DType::BF16)
    TETRA_FAIL(what, ": output dtype must be F32 or BF16, got ", dtype_name(d));
}

// y[m, n] = x[m] . wf[n] (+ bias[n]); wf [N, K] float.
void matmul_rows(const uint16_t* x, int M, int K, const std::vector<float>& wf, int N,
                 const uint16_t* bias, void* y, DType out_dtype) {
  std::vector<float> xf(size_t(M) * K);  // [M, K]
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = bf16_to_float(x[i]);
  const int64_t total = int64_t(M) * N;
  parallel_for(total, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t idx = begin; idx < end; ++idx) {
      const size_t m = size_t(idx / N), n = size_t(idx % N);
      const float* xr = &xf[m * K];
      const float* wr = &wf[n * K];
      float acc = 0.0f;
      for (int k = 0; k < K; ++k) acc += xr[k] * wr[k];
      if (bias) acc += bf16_to_float(bias[n]);
      if (out_dtype == DType::F32)
        static_cast<float*>(y)[idx] = acc;
      else
        static_cast<uint16_t*>(y)[idx] = float_to_bf16(acc);
    }
  });
}

std::vector<float> dequantized(const Nvfp4MatrixView& w) {
  TETRA_CHECK(w.weight && w.scale, "NVFP4 linear ", w.name, " has no data");
  if (w.n <= 0 || w.k <= 0 || w.k % 16 != 0)
    TETRA_FAIL("NVFP4 linear ", w.name, ": bad shape [", w.n, ", ", w.k, "]");
  const size_t scales = size_t(w.n) * (w.k / 16);
  for (size_t i = 0; i < scales; ++i)
    if (nvfp4::e4m3_is_nan(w.scale[i])) TETRA_FAIL("NVFP4 linear ", w.name, ": NaN block scale");
  std::vector<float> wf(size_t(w.n) * w.k);  // [N, K]
  nvfp4::dequantize_weight(w.weight, w.scale, w.scale_2, w.n, w.k, wf.data());
  return wf;
}

}  // namespace

void linear_bf16_cpu(const uint16_t* x, int M, int K, const uint16_t* w, int N,
                     const uint16_t* bias, void* y, DType out_dtype) {
  check_out_dtype(out_dtype, "linear_bf16_cpu");
  TETRA_CHECK(M >= 0 && K > 0 && N > 0, "M=", M, " K=", K, " N=", N);
  std::vector<float> wf(size_t(N) * K);  // [N, K]
  for (size_t i = 0; i < wf.size(); ++i) wf[i] = bf16_to_float(w[i]);
  matmul_rows(x, M, K, wf, N, bias, y, out_dtype);
}

void linear_nvfp4_cpu(const uint16_t* x, int M, const Nvfp4MatrixView& w, const uint16_t* bias,
                      void* y, DType out_dtype) {
  check_out_dtype(out_dtype, "linear_nvfp4_cpu");
  TETRA_CHECK(M >= 0, "M=", M);
  matmul_rows(x, M, w.k, dequantized(w), w.n, bias, y, out_dtype);
}

void gate_up_silu_nvfp4_cpu(const uint16_t* x, int M, const Nvfp4MatrixView& gate,
                            const Nvfp4MatrixView& up, uint16_t* act) {
  if (gate.n != up.n || gate.k != up.k)
    TETRA_FAIL("gate ", gate.name, " [", gate.n, ", ", gate.k, "] and up ", up.name, " [", up.n,
               ", ", up.k, "] differ in shape");
  const int I = gate.n;
  std::vector<float> g(size_t(M) * I), u(size_t(M) * I);  // [M, I] each
  linear_nvfp4_cpu(x, M, gate, nullptr, g.data(), DType::F32);
  linear_nvfp4_cpu(x, M, up, nullptr, u.data(), DType::F32);
  for (size_t i = 0; i < g.size(); ++i) {
    const float s = g[i] / (1.0f + std::exp(-g[i]));
    act[i] = float_to_bf16(s * u[i]);
  }
}

}  // namespace tetra::ops
