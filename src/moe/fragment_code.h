// The bit code of one packed NVFP4 fragment word: how the W4A16 kernels turn 32 stored bits into
// the four bf16x2 A registers of one mma.m16n8k16 k-step (before the scale), shared by the CUDA
// kernels (decode) and the host packer (encode = the inverse of this decode).
//
// Register p holds two E2M1 values as bf16 bit patterns with the magnitude code on bits 6..8 and
// the sign on bit 15 of each half (so code c reads as value(c) * 2^-126): only the 8 bits of
// kRegBits are live. Four disjoint shifted copies of those 8 bits cannot tile a 32-bit word, so no
// layout gives every register as one shift + one mask; instead the word is stored in a GF(2)
// linear code that the kernels undo with four shifts and four 3-input logic ops (LOP3):
//   r0 = w & S      r1 = (w << 4) & S      r2 = rotl(w, 10) & S      r3 = ((w >> 2) ^ (w << 6)) & S
// (8 integer instructions per 8 values; a plain shift-and-mask layout needs ~13). The packer
// inverts this map once (fragment_encoder below), so the decode is the single definition.
#pragma once
#include <array>
#include <bit>
#include <cstdint>
#include <utility>

#include "core/host_device.h"


namespace tetra {

// Live bits of a register: magnitudes on 6..8 and 22..24, signs on 15 and 31.
constexpr uint32_t kFragmentRegBits = 0x81C081C0u;

// Stored word -> the four registers' live bits (no scale applied).
// (The rotate is written as two shifts: nvcc emits one funnel shift for it.)
TETRA_HD constexpr void fragment_word_decode(uint32_t w, uint32_t r[4]) {
  constexpr uint32_t S = kFragmentRegBits;
  r[0] = w & S;
  r[1] = (w << 4) & S;
  r[2] = ((w << 10) | (w >> 22)) & S;
  r[3] = ((w >> 2) ^ (w << 6)) & S;
}

namespace fragment_detail {

constexpr int kLiveBit[8] = {6, 7, 8, 15, 22, 23, 24, 31};

// The 32 live output bits, as one vector: bit 8p + i = register p, live bit kLiveBit[i].
constexpr uint32_t gather_live(const uint32_t r[4]) {
  uint32_t v = 0;
  for (int p = 0; p < 4; ++p)
    for (int i = 0; i < 8; ++i) v |= ((r[p] >> kLiveBit[i]) & 1u) << (8 * p + i);
  return v;
}

constexpr uint32_t decode_vector(uint32_t w) {
  uint32_t r[4] = {};
  fragment_word_decode(w, r);
  return gather_live(r);
}

// Rows of the inverse of the decode map over GF(2): stored bit j = parity(row[j] & live vector).
// Built at compile time by Gauss-Jordan elimination; ok = false would mean the code is singular.
struct Encoder {
  std::array<uint32_t, 32> row{};
  bool ok = true;
};

constexpr Encoder make_encoder() {
  // Augmented system: column j of the decode matrix is decode_vector(1 << j). Eliminate on
  // [decode | identity] by rows; rows are output bits, stored as (decode row, identity row).
  std::array<uint32_t, 32> a{}, inv{};
  for (int i = 0; i < 32; ++i) {
    for (int j = 0; j < 32; ++j) a[i] |= ((decode_vector(1u << j) >> i) & 1u) << j;
    inv[i] = 1u << i;
  }
  Encoder e;
  for (int col = 0; col < 32; ++col) {
    int piv = -1;
    for (int i = col; i < 32 && piv < 0; ++i)
      if ((a[i] >> col) & 1u) piv = i;
    if (piv < 0) {
      e.ok = false;
      return e;
    }
    std::swap(a[col], a[piv]);
    std::swap(inv[col], inv[piv]);
    for (int i = 0; i < 32; ++i)
      if (i != col && ((a[i] >> col) & 1u)) {
        a[i] ^= a[col];
        inv[i] ^= inv[col];
      }
  }
  // a is now the identity: inv maps the live vector to the stored word, row j giving bit j.
  e.row = inv;
  return e;
}

inline constexpr Encoder kEncoder = make_encoder();
static_assert(kEncoder.ok, "the fragment word code must be invertible");

}  // namespace fragment_detail

// The stored word whose decode gives registers r (only their live bits are read).
constexpr uint32_t fragment_word_encode(const uint32_t r[4]) {
  const uint32_t live = fragment_detail::gather_live(r);
  uint32_t w = 0;
  for (int j = 0; j < 32; ++j)
    w |= uint32_t(std::popcount(fragment_detail::kEncoder.row[j] & live) & 1) << j;
  return w;
}

}  // namespace tetra
