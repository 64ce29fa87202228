#include "tools/random_weights.h"

#include <cmath>

#include "core/error.h"
#include "core/half.h"

namespace tetra {
namespace {

// splitmix64: a strong 64-bit mixer; counter-based so any element can be drawn directly.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t tensor_seed(uint64_t seed, std::string_view tensor_name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the name, then mixed with the seed
  for (char c : tensor_name) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
  return mix(h ^ mix(seed));
}

void fill_random(void* out, DType dtype, int64_t begin, int64_t end, uint64_t tseed, float mean,
                 float stddev) {
  const float half_width = stddev * std::sqrt(3.0f);  // uniform [-a, a] has std a/sqrt(3)
  auto value = [&](int64_t i) {
    const uint64_t r = mix(tseed + uint64_t(i) * 0x9e3779b97f4a7c15ull);
    const float u = float(r >> 40) * (1.0f / 16777216.0f);  // [0, 1) with 24 bits
    return mean + (2.0f * u - 1.0f) * half_width;
  };
  switch (dtype) {
    case DType::F32: {
      float* p = static_cast<float*>(out);
      for (int64_t i = begin; i < end; ++i) p[i - begin] = value(i);
      return;
    }
    case DType::BF16: {
      uint16_t* p = static_cast<uint16_t*>(out);
      for (int64_t i = begin; i < end; ++i) p[i - begin] = float_to_bf16(value(i));
      return;
    }
    case DType::F16: {
      uint16_t* p = static_cast<uint16_t*>(out);
      for (int64_t i = begin; i < end; ++i) p[i - begin] = float_to_f16(value(i));
      return;
    }
    default:
      TETRA_FAIL("random weights need a float dtype, got ", dtype_name(dtype));
  }
}

}  // namespace tetra
