// CPU reference for NVFP4 quantization; the per-element math lives in nvfp4.h (shared with CUDA).
#include "format/nvfp4.h"

#include <cmath>

#include "core/error.h"
#include "core/half.h"

namespace tetra::nvfp4 {
namespace {

// Element readers, one per supported input dtype; conversions to float are exact.
struct ReadF32 {
  const float* p;
  float operator()(size_t i) const { return p[i]; }
};
struct ReadF16 {
  const uint16_t* p;
  float operator()(size_t i) const { return f16_to_float(p[i]); }
};
struct ReadBF16 {
  const uint16_t* p;
  float operator()(size_t i) const { return bf16_to_float(p[i]); }
};

// Calls fn(reader) with the reader for `dtype` (checked by the caller).
template <typename Fn>
void with_reader(const void* src, DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32:
      fn(ReadF32{static_cast<const float*>(src)});
      return;
    case DType::F16:
      fn(ReadF16{static_cast<const uint16_t*>(src)});
      return;
    case DType::BF16:
      fn(ReadBF16{static_cast<const uint16_t*>(src)});
      return;
    default:
      TETRA_FAIL("NVFP4: unsupported input dtype ", dtype_name(dtype));
  }
}

bool is_float_input(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16;
}

// Reads one block of 16 into `x` and returns its max |x|.
template <typename Read>
float load_block(const Read& read, size_t first, float (&x)[kBlock]) {
  float bamax = 0.0f;
  for (int i = 0; i < kBlock; ++i) {
    x[i] = read(first + size_t(i));
    bamax = max_abs_step(bamax, x[i]);
  }
  return bamax;
}

}  // namespace

void check_quant_input(DType dtype, int64_t rows, int64_t cols, const char* what) {
  if (!is_float_input(dtype))
    TETRA_FAIL(what, ": input dtype ", dtype_name(dtype), " is not F32, F16 or BF16");
  if (rows < 0 || cols < 0) TETRA_FAIL(what, ": negative shape [", rows, ", ", cols, "]");
  if (cols % kBlock != 0)
    TETRA_FAIL(what, ": the last dimension (", cols, ") is not a multiple of the NVFP4 block (",
               kBlock, ")");
}

void check_positive_scale(float scale, const char* scale_name, const char* what) {
  if (!(scale > 0.0f) || !std::isfinite(scale))
    TETRA_FAIL(what, ": ", scale_name, " must be positive and finite, got ", scale);
}

float amax(const void* src, DType dtype, size_t n, std::string_view tensor_name) {
  if (!is_float_input(dtype))
    TETRA_FAIL("tensor '", tensor_name, "': dtype ", dtype_name(dtype),
               " cannot be quantized to NVFP4 (need F32, F16 or BF16)");
  float m = 0.0f;
  with_reader(src, dtype, [&](const auto& read) {
    for (size_t i = 0; i < n; ++i) {
      const float x = read(i);
      if (!is_finite_f32(x))
        TETRA_FAIL("tensor '", tensor_name, "' holds ", std::isnan(x) ? "NaN" : "Inf",
                   " at element ", i, "; NVFP4 quantization needs finite weights");
      m = max_abs_step(m, x);
    }
  });
  return m;
}

float global_scale_from_amax(float amax) {
  // All-zero tensor: 0/2688 would make every block scale 0/0; Tetra stores 1.0 instead.
  if (amax == 0.0f) return 1.0f;
  return amax / kGlobalScaleDivisor;
}

void quantize_weight(const void* src, DType dtype, int64_t rows, int64_t cols, float s2,
                     uint8_t* packed, uint8_t* scales) {
  check_quant_input(dtype, rows, cols, "quantize_weight");
  check_positive_scale(s2, "weight_scale_2", "quantize_weight");
  const size_t n_blocks = size_t(rows) * size_t(cols / kBlock);
  with_reader(src, dtype, [&](const auto& read) {
    float x[kBlock];
    for (size_t b = 0; b < n_blocks; ++b) {
      const float bamax = load_block(read, b * kBlock, x);
      for (int i = 0; i < kBlock; ++i)
        if (!is_finite_f32(x[i]))
          TETRA_FAIL("quantize_weight: non-finite value at row ", b / size_t(cols / kBlock),
                     ", column ", (b % size_t(cols / kBlock)) * kBlock + size_t(i));
      const uint8_t sf = weight_block_scale(bamax, s2);
      const float divisor = weight_block_divisor(sf, s2);
      scales[b] = sf;
      for (int i = 0; i < kBlock; i += 2) {
        const uint8_t lo = weight_code(x[i], divisor);
        const uint8_t hi = weight_code(x[i + 1], divisor);
        packed[b * (kBlock / 2) + size_t(i / 2)] = uint8_t(lo | (hi << 4));
      }
    }
  });
}

namespace {
// Walks the blocks once; `store(i, value)` writes element i in the caller's output type.
template <typename Store>
void dequantize_blocks(const uint8_t* packed, const uint8_t* scales, float s2, int64_t rows,
                       int64_t cols, Store store) {
  const size_t n_blocks = size_t(rows) * size_t(cols / kBlock);
  for (size_t b = 0; b < n_blocks; ++b) {
    const float scale = e4m3_to_float(scales[b]);
    for (int j = 0; j < kBlock / 2; ++j) {
      const uint8_t byte = packed[b * (kBlock / 2) + size_t(j)];  // low nibble = even element
      store(b * kBlock + size_t(2 * j), dequant_value(byte & 0xf, scale, s2));
      store(b * kBlock + size_t(2 * j + 1), dequant_value(byte >> 4, scale, s2));
    }
  }
}
}  // namespace

void dequantize_weight(const uint8_t* packed, const uint8_t* scales, float s2, int64_t rows,
                       int64_t cols, float* out) {
  check_quant_input(DType::F32, rows, cols, "dequantize_weight");
  dequantize_blocks(packed, scales, s2, rows, cols, [out](size_t i, float v) { out[i] = v; });
}

void dequantize_weight_bf16(const uint8_t* packed, const uint8_t* scales, float s2, int64_t rows,
                            int64_t cols, uint16_t* out) {
  check_quant_input(DType::F32, rows, cols, "dequantize_weight_bf16");
  dequantize_blocks(packed, scales, s2, rows, cols,
                    [out](size_t i, float v) { out[i] = bf16_bits_rne(v); });
}

void quantize_activation(const void* src, DType dtype, int64_t rows, int64_t cols,
                         float input_scale, uint8_t* packed, uint8_t* scales) {
  check_quant_input(dtype, rows, cols, "quantize_activation");
  check_positive_scale(input_scale, "input_scale", "quantize_activation");
  const float inv_input_scale = 1.0f / input_scale;
  if (!std::isfinite(inv_input_scale))
    TETRA_FAIL("quantize_activation: input_scale ", input_scale,
               " is too small (1/input_scale overflows)");
  const size_t n_blocks = size_t(rows) * size_t(cols / kBlock);
  with_reader(src, dtype, [&](const auto& read) {
    float x[kBlock];
    for (size_t b = 0; b < n_blocks; ++b) {
      const float bamax = load_block(read, b * kBlock, x);
      const uint8_t sf = activation_block_scale(bamax, inv_input_scale);
      const float out_scale = activation_out_scale(sf, input_scale);
      scales[b] = sf;
      for (int i = 0; i < kBlock; i += 2) {
        const uint8_t lo = activation_code(x[i], out_scale);
        const uint8_t hi = activation_code(x[i + 1], out_scale);
        packed[b * (kBlock / 2) + size_t(i / 2)] = uint8_t(lo | (hi << 4));
      }
    }
  });
}

}  // namespace tetra::nvfp4
