// Host-side repacking of ModelOpt NVFP4 expert weights into the order the W4A16 MoE kernels read.
//
// Kernel layout of one matrix W [N, K] (N % 16 == 0, K % 64 == 0), "fragment order":
//   weights [N/16 tiles][K/64 chunks][32 lanes][16 bytes]
//   scales  [N/16 tiles][K/64 chunks][32 lanes][2 bytes]
// Lane l = 4*g + t (g = l/4, t = l%4) of a warp owns, in tile r and chunk c, the 16 elements of
// row 16r+g and of row 16r+g+8 at k = 64c + 16t .. 64c + 16t + 15: exactly one NVFP4 block per
// row, so one scale byte per row. Its 16 bytes are four 32-bit words j = 0..3 (one per
// mma.m16n8k16 k-step); word j holds the A-fragment registers p = 0..3 of that k-step:
//   p=0: row g,   k = 16t+4j+{0,1}   p=1: row g+8, k = 16t+4j+{0,1}
//   p=2: row g,   k = 16t+4j+{2,3}   p=3: row g+8, k = 16t+4j+{2,3}
// (the kernel feeds the MMA's k-slots {2t,2t+1} / {2t+8,2t+9} with these k, and the activation
// fragments with the same k, so the product is unchanged). Word j is stored in the linear code of
// moe/fragment_code.h: its decode gives register p's two E2M1 values as bf16 bit patterns
// (magnitude on bits 6..8 and 22..24, sign on 15 and 31) with four shifts and four logic ops.
//
// Scale byte: "ue5m3" = (e + 10) << 3 | m for a block scale 2^e * (1 + m/8), e in [-9, 8]; every
// non-zero E4M3 value (subnormals included) has exactly one such code, so the map is lossless. A
// zero scale becomes byte 0 and its block's codes are zeroed (the dequantized block is 0 either way).
// The kernel builds bf16 (byte << 4) + (233 << 7) = scale * 2^116, and the E2M1 bit trick gives
// value * 2^-126, so each bf16 product is exact and equal to value * scale * 2^-10; the epilogue
// multiplies by alpha = weight_scale_2 * 2^10.
//
// GEMM1 packs gate and up together with 16-row tiles interleaved: tile 2i = gate rows 16i..16i+15,
// tile 2i+1 = up rows 16i..16i+15, so any warp holding an even/odd tile pair can apply SiLU(gate)*up.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tetra {

// One ModelOpt NVFP4 linear layer, as stored on disk (borrowed pointers).
struct Nvfp4MatrixView {
  const uint8_t* weight = nullptr;  // [n, k/2] e2m1 pairs, low nibble = even k
  const uint8_t* scale = nullptr;   // [n, k/16] e4m3fn block scales, plain row-major
  float scale_2 = 1.0f;             // weight_scale_2 (per-tensor global scale)
  int n = 0;                        // out_features
  int k = 0;                        // in_features
  std::string name;                 // tensor prefix, for error messages
  // The checkpoint's activation global scale of this linear (NVFP4 = W4A4 exports); weight-only
  // W4A16_NVFP4 checkpoints have none. Only the cuda-w4a4 backend and its cpu twin read it.
  std::optional<float> input_scale;
};

// A matrix in fragment order (layout above).
struct PackedNvfp4Matrix {
  int n = 0, k = 0;
  std::vector<uint8_t> weight;  // [n/16][k/64][32][16] fragment words
  std::vector<uint8_t> scale;   // [n/16][k/64][32][2]  ue5m3 scale codes (row g, row g+8)
};

// Byte sizes of one packed matrix, for allocators and for the bandwidth floor.
inline size_t packed_weight_bytes(int n, int k) { return size_t(n) * size_t(k) / 2; }
inline size_t packed_scale_bytes(int n, int k) { return size_t(n) * size_t(k) / 16; }
// One SwiGLU MLP's gate, up [inter, hidden] and down [hidden, inter] as a GPU layer holds them:
// packed NVFP4 weights + scales, or bf16.
inline size_t expert_mlp_bytes(bool bf16, int hidden, int inter) {
  if (bf16) return size_t(3) * inter * hidden * 2;
  return packed_weight_bytes(2 * inter, hidden) + packed_scale_bytes(2 * inter, hidden) +
         packed_weight_bytes(hidden, inter) + packed_scale_bytes(hidden, inter);
}

// Scale code conversions (exposed for tests). e4m3_to_ue5m3 refuses NaN (0x7f/0xff) and
// negative scales; returns 0 for a zero scale.
uint8_t e4m3_to_ue5m3(uint8_t e4m3, const std::string& name);
uint8_t ue5m3_to_e4m3(uint8_t code);

// Repack one matrix. Throws tetra::Error naming m.name on bad shapes, NaN or negative scales.
PackedNvfp4Matrix pack_nvfp4_matrix(const Nvfp4MatrixView& m);

// Inverse of pack_nvfp4_matrix: ModelOpt bytes [n, k/2] and [n, k/16]. Blocks whose scale was
// zero come back with zero codes (their dequantized values are unchanged: all zero).
void unpack_nvfp4_matrix(const PackedNvfp4Matrix& p, std::vector<uint8_t>& weight,
                         std::vector<uint8_t>& scale);

// Packs gate [I, H] and up [I, H] into one matrix of 2I rows with interleaved 16-row tiles.
PackedNvfp4Matrix pack_gate_up(const Nvfp4MatrixView& gate, const Nvfp4MatrixView& up);
// Splits a packed gate/up matrix back into the two packed matrices (for tests and dumps).
void split_gate_up(const PackedNvfp4Matrix& w13, PackedNvfp4Matrix& gate, PackedNvfp4Matrix& up);

// All routed experts of one MoE layer, packed, on the host. Per-expert blocks are concatenated.
struct PackedMoeLayer {
  int num_experts = 0, hidden = 0, inter = 0;
  std::vector<uint8_t> w13;         // [E][2I/16][H/64][32][16]
  std::vector<uint8_t> s13;         // [E][2I/16][H/64][32][2]
  std::vector<uint8_t> w2;          // [E][H/16][I/64][32][16]
  std::vector<uint8_t> s2;          // [E][H/16][I/64][32][2]
  std::vector<float> alpha_gate;    // [E] gate weight_scale_2 * 2^10
  std::vector<float> alpha_up;      // [E] up weight_scale_2 * 2^10
  std::vector<float> alpha_down;    // [E] down weight_scale_2 * 2^10
  int experts_with_split_s2 = 0;    // experts whose gate and up weight_scale_2 differ (old exports)
};

// Shapes the kernels accept; empty string when supported, else the reason.
std::string moe_shape_unsupported_reason(int hidden, int inter);

// Creates an empty layer with room for num_experts experts (throws on unsupported shapes).
PackedMoeLayer make_packed_moe_layer(int num_experts, int hidden, int inter);
// Packs expert e's three matrices into the layer (checks shapes against the layer).
void pack_moe_expert(PackedMoeLayer& layer, int e, const Nvfp4MatrixView& gate,
                     const Nvfp4MatrixView& up, const Nvfp4MatrixView& down);

// The factor the kernel epilogue applies: weight_scale_2 * 2^10 (see the layout note above).
inline float packed_alpha(float weight_scale_2) { return weight_scale_2 * 1024.0f; }

}  // namespace tetra
