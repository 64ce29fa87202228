// CPU plain <-> 128x4 swizzled block-scale conversion; the offset formula is in scale_layout.h.
#include "format/scale_layout.h"

#include <cstring>

#include "core/error.h"

namespace tetra::nvfp4 {

void check_scale_layout_args(int64_t batch, int64_t rows, int64_t kb, const char* what) {
  if (batch < 0 || rows < 0 || kb < 0)
    TETRA_FAIL(what, ": negative scale shape [", batch, ", ", rows, ", ", kb, "]");
}

int64_t swizzled_scale_bytes(int64_t rows, int64_t kb) {
  check_scale_layout_args(1, rows, kb, "swizzled_scale_bytes");
  return swizzle_rows_padded(rows) * swizzle_kb_padded(kb);
}

void swizzle_scales(const uint8_t* plain, int64_t batch, int64_t rows, int64_t kb,
                    uint8_t* swizzled) {
  check_scale_layout_args(batch, rows, kb, "swizzle_scales");
  const int64_t kb_pad = swizzle_kb_padded(kb);
  const int64_t per_matrix = swizzled_scale_bytes(rows, kb);
  std::memset(swizzled, 0, size_t(batch * per_matrix));
  for (int64_t e = 0; e < batch; ++e) {
    const uint8_t* src = plain + e * rows * kb;  // [rows, kb]
    uint8_t* dst = swizzled + e * per_matrix;    // [rows_pad * kb_pad] swizzled
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t k = 0; k < kb; ++k) dst[swizzled_scale_offset(m, k, kb_pad)] = src[m * kb + k];
  }
}

void unswizzle_scales(const uint8_t* swizzled, int64_t batch, int64_t rows, int64_t kb,
                      uint8_t* plain) {
  check_scale_layout_args(batch, rows, kb, "unswizzle_scales");
  const int64_t kb_pad = swizzle_kb_padded(kb);
  const int64_t per_matrix = swizzled_scale_bytes(rows, kb);
  for (int64_t e = 0; e < batch; ++e) {
    const uint8_t* src = swizzled + e * per_matrix;  // [rows_pad * kb_pad] swizzled
    uint8_t* dst = plain + e * rows * kb;            // [rows, kb]
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t k = 0; k < kb; ++k) dst[m * kb + k] = src[swizzled_scale_offset(m, k, kb_pad)];
  }
}

}  // namespace tetra::nvfp4
