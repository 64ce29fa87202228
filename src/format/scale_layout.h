// Block scales in the "128x4" swizzled layout of Blackwell block-scaled GEMMs (NVFP4.md).
// Checkpoints store scales plain, [rows, kb] row-major (kb = K/16); kernels that want the swizzled
// layout convert at load time. The swizzled matrix is zero-padded to rows_pad = ceil(rows/128)*128
// and kb_pad = ceil(kb/4)*4; batched (per-expert) tensors are stored one padded matrix after
// another.
#pragma once
#include <cstdint>

#include "core/host_device.h"

namespace tetra::nvfp4 {

TETRA_HD int64_t swizzle_rows_padded(int64_t rows) { return (rows + 127) / 128 * 128; }
TETRA_HD int64_t swizzle_kb_padded(int64_t kb) { return (kb + 3) / 4 * 4; }

// Byte offset of scale (m, kb) inside one padded swizzled matrix whose padded width is kb_pad:
// tiles of 128 rows x 4 scales (512 bytes), row-of-tiles major; inside a tile, row m%32 picks a
// 16-byte group, (m%128)/32 the 4-byte word in it, kb%4 the byte.
TETRA_HD int64_t swizzled_scale_offset(int64_t m, int64_t kb, int64_t kb_pad) {
  return (m / 128) * (kb_pad / 4) * 512 + (kb / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 +
         (kb % 4);
}

// Bytes of one padded swizzled matrix: rows_pad * kb_pad.
int64_t swizzled_scale_bytes(int64_t rows, int64_t kb);
// plain: [batch, rows, kb] e4m3 row-major; swizzled: [batch, swizzled_scale_bytes(rows, kb)],
// padding bytes written as 0.
void swizzle_scales(const uint8_t* plain, int64_t batch, int64_t rows, int64_t kb,
                    uint8_t* swizzled);
// Inverse of swizzle_scales (padding is ignored).
void unswizzle_scales(const uint8_t* swizzled, int64_t batch, int64_t rows, int64_t kb,
                      uint8_t* plain);
// Refuses negative sizes (shared with the CUDA entry points).
void check_scale_layout_args(int64_t batch, int64_t rows, int64_t kb, const char* what);

}  // namespace tetra::nvfp4
