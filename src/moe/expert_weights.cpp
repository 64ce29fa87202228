// Repack ModelOpt NVFP4 matrices into the W4A16 kernels' fragment order (layout: expert_weights.h).
#include "moe/expert_weights.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "moe/fragment_code.h"

namespace tetra {
namespace {

constexpr int kChunkK = 64;  // k per fragment chunk (4 mma k-steps)
constexpr int kTileN = 16;   // rows per fragment tile (mma M side)

// Offset of (tile r, chunk c, lane l) in a fragment-ordered matrix with `chunks` chunks per tile.
inline size_t lane_index(int r, int c, int l, int chunks) {
  return (size_t(r) * size_t(chunks) + size_t(c)) * 32 + size_t(l);
}

void check_view(const Nvfp4MatrixView& m) {
  if (m.weight == nullptr || m.scale == nullptr) TETRA_FAIL(m.name, ": missing weight or scale data");
  if (m.n <= 0 || m.k <= 0) TETRA_FAIL(m.name, ": bad shape [", m.n, ", ", m.k, "]");
  if (m.n % kTileN != 0)
    TETRA_FAIL(m.name, ": out_features ", m.n, " is not a multiple of ", kTileN,
               " (the W4A16 MoE kernels tile 16 rows)");
  if (m.k % kChunkK != 0)
    TETRA_FAIL(m.name, ": in_features ", m.k, " is not a multiple of ", kChunkK,
               " (the W4A16 MoE kernels read k in chunks of 64)");
  if (!std::isfinite(m.scale_2) || m.scale_2 <= 0.0f)
    TETRA_FAIL(m.name, ": weight_scale_2 must be finite and positive, got ", m.scale_2);
}

}  // namespace

uint8_t e4m3_to_ue5m3(uint8_t b, const std::string& name) {
  if ((b & 0x7f) == 0x7f) TETRA_FAIL(name, ": NaN block scale byte 0x", std::hex, int(b));
  if (b == 0x00 || b == 0x80) return 0;  // zero scale (either sign)
  if (b & 0x80) TETRA_FAIL(name, ": negative block scale byte 0x", std::hex, int(b));
  const int exp_field = (b >> 3) & 15;
  const int man = b & 7;
  int e, frac;
  if (exp_field > 0) {
    e = exp_field - 7;
    frac = man;
  } else {
    // subnormal: man * 2^-9; normalize to 2^e * (1 + frac/8)
    int h = 2;
    while (((man >> h) & 1) == 0) --h;
    e = -9 + h;
    frac = ((man - (1 << h)) << (3 - h)) & 7;
  }
  return uint8_t(((e + 10) << 3) | frac);
}

uint8_t ue5m3_to_e4m3(uint8_t code) {
  if (code == 0) return 0;
  const int e = (code >> 3) - 10;
  const int frac = code & 7;
  if (e >= -6) return uint8_t(((e + 7) << 3) | frac);
  // subnormal e4m3: value = man * 2^-9 with man = (8 + frac) * 2^(e + 9) / 8
  const int man = ((8 + frac) << (e + 9)) >> 3;
  return uint8_t(man);
}

PackedNvfp4Matrix pack_nvfp4_matrix(const Nvfp4MatrixView& m) {
  check_view(m);
  const int chunks = m.k / kChunkK;
  const int tiles = m.n / kTileN;
  const size_t row_bytes = size_t(m.k) / 2;
  const size_t row_scales = size_t(m.k) / 16;
  PackedNvfp4Matrix p;
  p.n = m.n;
  p.k = m.k;
  p.weight.assign(packed_weight_bytes(m.n, m.k), 0);
  p.scale.assign(packed_scale_bytes(m.n, m.k), 0);
  for (int r = 0; r < tiles; ++r)
    for (int c = 0; c < chunks; ++c)
      for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        const size_t li = lane_index(r, c, l, chunks);
        const int block = 4 * c + t;  // the one scale block of this lane's 16 k
        uint8_t code_scale[2];
        for (int h = 0; h < 2; ++h) {
          const int row = kTileN * r + g + 8 * h;
          code_scale[h] = e4m3_to_ue5m3(m.scale[size_t(row) * row_scales + block], m.name);
          p.scale[li * 2 + h] = code_scale[h];
        }
        for (int j = 0; j < 4; ++j) {
          uint32_t regs[4] = {};  // bf16 bit patterns: magnitude on bits 6..8, sign on 15
          for (int reg = 0; reg < 4; ++reg) {
            const int h = reg & 1;  // odd registers hold row g+8
            const int row = kTileN * r + g + 8 * h;
            for (int q = 0; q < 2; ++q) {
              const int k = kChunkK * c + 16 * t + 4 * j + 2 * (reg >> 1) + q;
              const uint8_t byte = m.weight[size_t(row) * row_bytes + size_t(k / 2)];
              uint32_t code = (k & 1) ? (byte >> 4) : (byte & 15);
              if (code_scale[h] == 0) code = 0;  // zero-scale block: value 0 regardless of code
              regs[reg] |= ((code & 7u) << (6 + 16 * q)) | ((code >> 3) << (15 + 16 * q));
            }
          }
          const uint32_t word = fragment_word_encode(regs);
          std::memcpy(&p.weight[li * 16 + 4 * size_t(j)], &word, 4);
        }
      }
  return p;
}

void unpack_nvfp4_matrix(const PackedNvfp4Matrix& p, std::vector<uint8_t>& weight,
                         std::vector<uint8_t>& scale) {
  TETRA_CHECK(p.n % kTileN == 0 && p.k % kChunkK == 0, "packed shape ", p.n, "x", p.k);
  const int chunks = p.k / kChunkK;
  const int tiles = p.n / kTileN;
  const size_t row_bytes = size_t(p.k) / 2;
  const size_t row_scales = size_t(p.k) / 16;
  weight.assign(size_t(p.n) * row_bytes, 0);
  scale.assign(size_t(p.n) * row_scales, 0);
  for (int r = 0; r < tiles; ++r)
    for (int c = 0; c < chunks; ++c)
      for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        const size_t li = lane_index(r, c, l, chunks);
        for (int h = 0; h < 2; ++h) {
          const int row = kTileN * r + g + 8 * h;
          scale[size_t(row) * row_scales + size_t(4 * c + t)] = ue5m3_to_e4m3(p.scale[li * 2 + h]);
        }
        for (int j = 0; j < 4; ++j) {
          uint32_t word;
          std::memcpy(&word, &p.weight[li * 16 + 4 * size_t(j)], 4);
          uint32_t regs[4];
          fragment_word_decode(word, regs);
          for (int reg = 0; reg < 4; ++reg) {
            const int row = kTileN * r + g + 8 * (reg & 1);
            for (int q = 0; q < 2; ++q) {
              const int k = kChunkK * c + 16 * t + 4 * j + 2 * (reg >> 1) + q;
              const uint32_t mag = (regs[reg] >> (6 + 16 * q)) & 7u;
              const uint32_t sign = (regs[reg] >> (15 + 16 * q)) & 1u;
              const uint8_t code = uint8_t(mag | (sign << 3));
              uint8_t& byte = weight[size_t(row) * row_bytes + size_t(k / 2)];
              byte = uint8_t(byte | ((k & 1) ? (code << 4) : code));
            }
          }
        }
      }
}

PackedNvfp4Matrix pack_gate_up(const Nvfp4MatrixView& gate, const Nvfp4MatrixView& up) {
  if (gate.n != up.n || gate.k != up.k)
    TETRA_FAIL(gate.name, " [", gate.n, ", ", gate.k, "] and ", up.name, " [", up.n, ", ", up.k,
               "] must have the same shape");
  const PackedNvfp4Matrix pg = pack_nvfp4_matrix(gate);
  const PackedNvfp4Matrix pu = pack_nvfp4_matrix(up);
  PackedNvfp4Matrix p;
  p.n = 2 * gate.n;
  p.k = gate.k;
  const size_t tile_w = packed_weight_bytes(kTileN, p.k);  // bytes of one 16-row tile
  const size_t tile_s = packed_scale_bytes(kTileN, p.k);
  p.weight.resize(2 * pg.weight.size());
  p.scale.resize(2 * pg.scale.size());
  for (int r = 0; r < gate.n / kTileN; ++r) {
    std::memcpy(&p.weight[(2 * r) * tile_w], &pg.weight[r * tile_w], tile_w);
    std::memcpy(&p.weight[(2 * r + 1) * tile_w], &pu.weight[r * tile_w], tile_w);
    std::memcpy(&p.scale[(2 * r) * tile_s], &pg.scale[r * tile_s], tile_s);
    std::memcpy(&p.scale[(2 * r + 1) * tile_s], &pu.scale[r * tile_s], tile_s);
  }
  return p;
}

void split_gate_up(const PackedNvfp4Matrix& w13, PackedNvfp4Matrix& gate, PackedNvfp4Matrix& up) {
  TETRA_CHECK(w13.n % (2 * kTileN) == 0, "gate/up rows ", w13.n);
  const size_t tile_w = packed_weight_bytes(kTileN, w13.k);
  const size_t tile_s = packed_scale_bytes(kTileN, w13.k);
  for (PackedNvfp4Matrix* m : {&gate, &up}) {
    m->n = w13.n / 2;
    m->k = w13.k;
    m->weight.resize(w13.weight.size() / 2);
    m->scale.resize(w13.scale.size() / 2);
  }
  for (int r = 0; r < w13.n / (2 * kTileN); ++r) {
    std::memcpy(&gate.weight[r * tile_w], &w13.weight[(2 * r) * tile_w], tile_w);
    std::memcpy(&up.weight[r * tile_w], &w13.weight[(2 * r + 1) * tile_w], tile_w);
    std::memcpy(&gate.scale[r * tile_s], &w13.scale[(2 * r) * tile_s], tile_s);
    std::memcpy(&up.scale[r * tile_s], &w13.scale[(2 * r + 1) * tile_s], tile_s);
  }
}

std::string moe_shape_unsupported_reason(int hidden, int inter) {
  if (hidden <= 0 || inter <= 0) return str("bad MoE shape hidden=", hidden, " inter=", inter);
  if (hidden % kChunkK != 0)
    return str("hidden size ", hidden, " is not a multiple of 64 (W4A16 MoE kernels read k in "
               "chunks of 64)");
  if (inter % kChunkK != 0)
    return str("intermediate size ", inter, " is not a multiple of 64 (it is the k of the down "
               "projection, read in chunks of 64)");
  return "";
}

PackedMoeLayer make_packed_moe_layer(int num_experts, int hidden, int inter) {
  const std::string why = moe_shape_unsupported_reason(hidden, inter);
  if (!why.empty()) TETRA_FAIL(why);
  if (num_experts <= 0) TETRA_FAIL("bad expert count ", num_experts);
  PackedMoeLayer L;
  L.num_experts = num_experts;
  L.hidden = hidden;
  L.inter = inter;
  const size_t E = size_t(num_experts);
  L.w13.assign(E * packed_weight_bytes(2 * inter, hidden), 0);
  L.s13.assign(E * packed_scale_bytes(2 * inter, hidden), 0);
  L.w2.assign(E * packed_weight_bytes(hidden, inter), 0);
  L.s2.assign(E * packed_scale_bytes(hidden, inter), 0);
  L.alpha_gate.assign(E, 0.0f);
  L.alpha_up.assign(E, 0.0f);
  L.alpha_down.assign(E, 0.0f);
  return L;
}

void pack_moe_expert(PackedMoeLayer& L, int e, const Nvfp4MatrixView& gate,
                     const Nvfp4MatrixView& up, const Nvfp4MatrixView& down) {
  TETRA_CHECK(e >= 0 && e < L.num_experts, "expert ", e, " of ", L.num_experts);
  if (gate.n != L.inter || gate.k != L.hidden)
    TETRA_FAIL(gate.name, ": shape [", gate.n, ", ", gate.k, "], expected [", L.inter, ", ",
               L.hidden, "]");
  if (down.n != L.hidden || down.k != L.inter)
    TETRA_FAIL(down.name, ": shape [", down.n, ", ", down.k, "], expected [", L.hidden, ", ",
               L.inter, "]");
  const PackedNvfp4Matrix w13 = pack_gate_up(gate, up);
  const PackedNvfp4Matrix w2 = pack_nvfp4_matrix(down);
  std::memcpy(&L.w13[size_t(e) * w13.weight.size()], w13.weight.data(), w13.weight.size());
  std::memcpy(&L.s13[size_t(e) * w13.scale.size()], w13.scale.data(), w13.scale.size());
  std::memcpy(&L.w2[size_t(e) * w2.weight.size()], w2.weight.data(), w2.weight.size());
  std::memcpy(&L.s2[size_t(e) * w2.scale.size()], w2.scale.data(), w2.scale.size());
  L.alpha_gate[size_t(e)] = packed_alpha(gate.scale_2);
  L.alpha_up[size_t(e)] = packed_alpha(up.scale_2);
  L.alpha_down[size_t(e)] = packed_alpha(down.scale_2);
  if (gate.scale_2 != up.scale_2) ++L.experts_with_split_s2;
}

}  // namespace tetra
