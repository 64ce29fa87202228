// CPU RMSNorm: sums of squares in double (cheap here, and the obviously-right side of the twin).
#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "ops/norm/rms_norm.h"

namespace tetra::ops {

namespace {

// One row: out[i] = x[i] * inv_rms * w[i], rounded once to bf16.
void norm_row(const uint16_t* x, const uint16_t* w, int n, float eps, uint16_t* out) {
  double ss = 0.0;
  for (int i = 0; i < n; ++i) {
    const double v = bf16_to_float(x[i]);
    ss += v * v;
  }
  const float inv_rms = float(1.0 / std::sqrt(ss / n + double(eps)));
  for (int i = 0; i < n; ++i)
    out[i] = float_to_bf16(bf16_to_float(x[i]) * inv_rms * bf16_to_float(w[i]));
}

void check_sizes(int T, int H, float eps, const char* op) {
  TETRA_CHECK(T >= 0 && H > 0, op, ": T=", T, " H=", H);
  TETRA_CHECK(eps >= 0.0f, op, ": eps=", eps);
}

}  // namespace

void rms_norm_cpu(const uint16_t* x, const uint16_t* w, int T, int H, float eps, uint16_t* out) {
  check_sizes(T, H, eps, "rms_norm");
  for (int t = 0; t < T; ++t) norm_row(x + size_t(t) * H, w, H, eps, out + size_t(t) * H);
}

void fused_add_rms_norm_cpu(const uint16_t* x, uint16_t* residual, const uint16_t* w, int T,
                            int H, float eps, uint16_t* out) {
  check_sizes(T, H, eps, "fused_add_rms_norm");
  for (int t = 0; t < T; ++t) {
    const uint16_t* xr = x + size_t(t) * H;
    uint16_t* rr = residual + size_t(t) * H;
    for (int i = 0; i < H; ++i) rr[i] = float_to_bf16(bf16_to_float(xr[i]) + bf16_to_float(rr[i]));
    norm_row(rr, w, H, eps, out + size_t(t) * H);
  }
}

void head_rms_norm_cpu(uint16_t* x, int T, int n_heads, int head_dim, int64_t token_stride,
                       const uint16_t* w, float eps) {
  check_sizes(T, head_dim, eps, "head_rms_norm");
  TETRA_CHECK(n_heads > 0 && token_stride >= int64_t(n_heads) * head_dim, "head_rms_norm: heads=",
              n_heads, " head_dim=", head_dim, " token_stride=", token_stride);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < n_heads; ++h) {
      uint16_t* p = x + t * token_stride + int64_t(h) * head_dim;
      norm_row(p, w, head_dim, eps, p);  // element i is read before it is written: safe in place
    }
}

}  // namespace tetra::ops
