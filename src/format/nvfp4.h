// NVFP4 numerics (docs/NVFP4.md): E2M1 elements, E4M3FN block scales of 16, a float32 global scale.
//
// The scalar codecs and the per-block formulas are inline and host+device, so the CPU reference
// (nvfp4.cpp) and the CUDA kernels (ops/nvfp4/*.cu) execute the very same float32 operations in the
// same order; that is what makes their outputs byte-identical. Every rounding multiply or divide
// goes through mul_rn/div_rn, which on the device are the explicit _rn intrinsics: nvcc may not
// fuse them into an FMA, and the division is IEEE division, never a reciprocal multiply.
//
// Tetra's rule for an all-zero tensor (ModelOpt would compute 0/0): global_scale_from_amax(0)
// returns 1.0f, every block scale is 0x38 (1.0) and every code is 0.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "core/dtype.h"
#include "core/float_rn.h"
#include "core/host_device.h"

namespace tetra::nvfp4 {

inline constexpr int kBlock = 16;  // elements per block scale, along K
inline constexpr float kE2M1Max = 6.0f;
inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE4M3MinSubnormal = 1.0f / 512.0f;  // 2^-9, byte 0x01
inline constexpr float kGlobalScaleDivisor = 2688.0f;      // 6 * 448

// ---- float32 helpers that round the same way on host and device ----------------------------
using fp::f32_bits;
using fp::f32_from_bits;
using fp::mul_rn;
using fp::div_rn;
TETRA_HD float abs_f32(float x) { return f32_from_bits(f32_bits(x) & 0x7fffffffu); }
// Max that ignores NaN in `a` (a comparison with NaN is false), the same on both sides.
TETRA_HD float max_abs_step(float running, float x) {
  const float a = abs_f32(x);
  return a > running ? a : running;
}
TETRA_HD bool is_finite_f32(float x) { return (f32_bits(x) & 0x7f800000u) != 0x7f800000u; }

// float -> bf16 bits, round to nearest even; NaN stays a quiet NaN (same rule as core/half.h).
TETRA_HD uint16_t bf16_bits_rne(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// ---- E2M1: codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign ----------------------
TETRA_HD float e2m1_to_float(uint8_t code) {
  const uint32_t exp = (code >> 1) & 3u;
  const uint32_t man = code & 1u;
  // exp 0: 0 or 0.5 (subnormal); otherwise (1 + man/2) * 2^(exp-1), built from float bits.
  const uint32_t mag = exp == 0 ? (man ? 0x3f000000u : 0u) : ((exp + 126u) << 23) | (man << 22);
  return f32_from_bits(mag | (uint32_t(code & 8u) << 28));
}

// Round to nearest, ties to the even code, saturate at 6. Each comparison below is one decision
// boundary (the midpoint of two neighbours); `>` where the tie goes down to the even code, `>=`
// where it goes up. The sign bit is set for y < 0, so tiny negatives give 0x8 and -0.0 gives 0x0.
// NaN gives 0x0 (callers refuse NaN weights before quantizing).
TETRA_HD uint8_t float_to_e2m1(float y) {
  const float a = abs_f32(y);
  const uint8_t mag = uint8_t((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                              (a >= 3.5f) + (a > 5.0f));
  return uint8_t(mag | (y < 0.0f ? 8u : 0u));
}

// ---- E4M3FN: bias 7, 3 mantissa bits, max 448 (0x7E), 0x7F/0xFF NaN, no Inf ---------------
TETRA_HD bool e4m3_is_nan(uint8_t byte) { return (byte & 0x7fu) == 0x7fu; }

TETRA_HD float e4m3_to_float(uint8_t byte) {
  const uint32_t sign = uint32_t(byte & 0x80u) << 24;
  const uint32_t exp = (byte >> 3) & 15u;
  const uint32_t man = byte & 7u;
  if (exp == 15u && man == 7u) return f32_from_bits(sign | 0x7fc00000u);
  if (exp == 0u) {  // subnormal: man/8 * 2^-6 = man * 2^-9, exact in float
    return f32_from_bits(f32_bits(mul_rn(float(man), kE4M3MinSubnormal)) | sign);
  }
  return f32_from_bits(sign | ((exp + 120u) << 23) | (man << 20));
}

// Round to nearest even, saturating to +-448 (Inf too), NaN -> 0x7F, sign kept (-0.0 -> 0x80).
TETRA_HD uint8_t float_to_e4m3(float x) {
  const uint32_t u = f32_bits(x);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;
  if (a >= 0x43e00000u) return uint8_t(sign | 0x7eu);  // >= 448 (anything above rounds to 448)
  if (a < 0x3c800000u) {                               // below 2^-6: multiples of 2^-9
    const float v = mul_rn(f32_from_bits(a), 512.0f);  // exact: a power-of-two scaling
    uint32_t m = uint32_t(v);                          // truncation, v < 8
    const float frac = v - float(m);                   // exact
    if (frac > 0.5f || (frac == 0.5f && (m & 1u))) ++m;
    return uint8_t(sign | m);  // m == 8 is 0x08, the smallest normal 2^-6: still correct
  }
  // Normal: drop 20 of the 23 mantissa bits with round-to-nearest-even, then rebias 127 -> 7.
  const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
  return uint8_t(sign | (((r >> 23) - 120u) << 3) | ((r >> 20) & 7u));
}

// ---- per-block formulas (NVFP4.md), shared by the CPU reference and the CUDA kernels ---------
// Weight block scale: s = bamax / (6*s2) (product rounded first), 0 -> 1, clamp [2^-9, 448], RNE.
TETRA_HD uint8_t weight_block_scale(float bamax, float s2) {
  float s = div_rn(bamax, mul_rn(kE2M1Max, s2));
  if (s == 0.0f) s = 1.0f;
  s = s < kE4M3MinSubnormal ? kE4M3MinSubnormal : s;
  s = s > kE4M3Max ? kE4M3Max : s;
  return float_to_e4m3(s);
}
// Weight element divisor: float(sf) * s2, rounded to float once; y = x / divisor.
TETRA_HD float weight_block_divisor(uint8_t sf, float s2) {
  return mul_rn(e4m3_to_float(sf), s2);
}
TETRA_HD uint8_t weight_code(float x, float divisor) {
  return float_to_e2m1(div_rn(x, divisor));
}

// Activation (W4A4) block scale: SF = e4m3_rne_sat(bamax / 6 * inv_input_scale), where
// inv_input_scale = 1 / input_scale was rounded to float once per tensor.
TETRA_HD uint8_t activation_block_scale(float bamax, float inv_input_scale) {
  return float_to_e4m3(mul_rn(div_rn(bamax, kE2M1Max), inv_input_scale));
}
// Multiplier for the elements: 1 / (float(SF) * input_scale), or 0 when SF is 0. NVFP4.md guards
// on max|x_block| != 0; guarding on SF (as TensorRT-LLM's kernel does) agrees whenever that
// formula is finite and avoids 1/0 when a nonzero block's scale underflows to 0 (its codes then
// decode to 0 anyway, since SF = 0).
TETRA_HD float activation_out_scale(uint8_t sf, float input_scale) {
  const float sf_f = e4m3_to_float(sf);
  return sf_f != 0.0f ? div_rn(1.0f, mul_rn(sf_f, input_scale)) : 0.0f;
}
TETRA_HD uint8_t activation_code(float x, float out_scale) {
  return float_to_e2m1(mul_rn(x, out_scale));
}
// Dequantized element: E2M1 * float(scale) * s2, left to right (the first product is exact).
TETRA_HD float dequant_value(uint8_t code, float scale, float s2) {
  return mul_rn(mul_rn(e2m1_to_float(code), scale), s2);
}

// ---- whole buffers on the CPU (the reference every CUDA kernel is checked against) ----------
// Max |x| over n elements of a F32/F16/BF16 buffer; throws tetra::Error naming `tensor_name` on
// NaN/Inf or an unsupported dtype.
float amax(const void* src, DType dtype, size_t n, std::string_view tensor_name);
// amax / 2688 in float32; 1.0f for amax == 0 (the all-zero rule above).
float global_scale_from_amax(float amax);

// src: [rows, cols] F32/F16/BF16 row-major, cols % 16 == 0 (else Error); s2 > 0 and finite.
// packed: [rows, cols/2] e2m1 pairs, low nibble = even column; scales: [rows, cols/16] e4m3.
// Throws on NaN/Inf elements (run amax first to get an error that names the tensor).
void quantize_weight(const void* src, DType dtype, int64_t rows, int64_t cols, float s2,
                     uint8_t* packed, uint8_t* scales);
// packed: [rows, cols/2]; scales: [rows, cols/16] e4m3; out: [rows, cols] float.
void dequantize_weight(const uint8_t* packed, const uint8_t* scales, float s2, int64_t rows,
                       int64_t cols, float* out);
// Same values rounded to bf16 (RNE): out: [rows, cols] bf16 bits. E2M1 * E4M3 is exact in bf16;
// only the final multiply by s2 rounds.
void dequantize_weight_bf16(const uint8_t* packed, const uint8_t* scales, float s2, int64_t rows,
                            int64_t cols, uint16_t* out);
// W4A4 activation quantization (NVFP4.md "Activation quantization"); input_scale > 0, finite and
// not so small that 1/input_scale overflows (else Error).
// src: [rows, cols] F32/F16/BF16; packed: [rows, cols/2]; scales: [rows, cols/16] e4m3 (plain).
// NaN elements are not refused here (runtime data): they are skipped by the block max and give 0.
void quantize_activation(const void* src, DType dtype, int64_t rows, int64_t cols,
                         float input_scale, uint8_t* packed, uint8_t* scales);

// Shared argument checks (CPU and CUDA entry points refuse the same inputs with the same words).
void check_quant_input(DType dtype, int64_t rows, int64_t cols, const char* what);
void check_positive_scale(float scale, const char* scale_name, const char* what);

}  // namespace tetra::nvfp4
