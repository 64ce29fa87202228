// The MoE router folded into o_proj's epilogue at one token (the decoder's post-attention
// RMSNorm and router logits without a launch of their own).
//
// Why: at batch 1 the chain o_proj -> token path (add + RMSNorm + router logits) -> GEMM1 spent
// ~3 us per MoE layer in the token path's launch and hand-off while HBM idled. o_proj's
// streaming kernel (one 16-row tile of the new residual row h per block) already holds what the
// logits need: for a tile T of rows, with the norm weight g and the router weight W [E, H],
//   sums[e] += sum_{i in T} W[e][i] * (g_i * h_i)   (g_i * h_i in f32)
//   sums[E] += sum_{i in T} h_i^2
//   gx_i     = bf16(g_i * h_i)
// and GEMM1, once o_proj is complete, takes inv_rms = rsqrt(sums[E] / H + eps), the logits
// sums[e] * inv_rms, and multiplies gx with its accumulators scaled by inv_rms. That is the
// reference's rms_norm + router in another order of rounding: the reference rounds
// h * inv_rms to bf16 and then multiplies by g; here g * h is rounded and inv_rms is applied
// in f32 after the dot products (relative differences at the bf16 rounding's 2^-9 per
// element; routing can differ from the reference's only where two experts' scores tie to
// that level).
//
// The sums are double atomics of each tile's f32 partial: the addition of doubles that carry
// f32 values is exact, hence independent of the blocks' order, as long as no partial is more
// than 2^21 times smaller than the largest (24 + 21 + 8 bits for 256 tiles fit a double's 53);
// beyond that only terms below 2^-53 of the sum round, so two runs agree to the last bit of
// every float the GEMM reads except at a rounding tie of the double -> float conversion.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tetra::moe {

inline constexpr int kRouterFoldTile = 16;        // rows of h per o_proj block
inline constexpr int kRouterFoldMaxExperts = 256;

// Bytes of one tile's constants in RouterFold::tiles: g [16] bf16, then W's columns [E][16] bf16
// (the router weight's bytes, as the token path reads them).
constexpr size_t router_fold_tile_bytes(int E) { return 32 + size_t(E) * kRouterFoldTile * 2; }

struct RouterFold {
  // [H/16] tiles of router_fold_tile_bytes(E): tile t holds g[16t .. 16t + 15], then
  // W[e][16t .. 16t + 15] for every expert e (bf16): what o_proj's block of tile t stages in
  // shared memory, one bulk copy.
  const uint8_t* tiles = nullptr;
  uint16_t* gx = nullptr;  // [H] bf16 written: bf16(g * h), GEMM1's input
  // [copies, E + 1] added to: o_proj's block b adds to copy b % copies (fewer atomics on one
  // address), GEMM1 adds the copies in order. Zero before o_proj (the combine zeroes them).
  double* sums = nullptr;
  int E = 0;
  int copies = 1;
};
inline constexpr int kRouterFoldMaxCopies = 16;

// Host twins (tests): the tiles from the router weight W [E, H] and g [H] (bf16 bits); what
// o_proj's epilogue adds for the row h [H] (sums [E + 1] over all copies, gx [H]), each tile's
// partials in the device's order.
std::vector<uint8_t> router_fold_tiles(const uint16_t* W, const uint16_t* g, int E, int H);
void router_fold_sums(const std::vector<uint8_t>& tiles, const uint16_t* h, int E, int H,
                      std::vector<double>& sums, std::vector<uint16_t>& gx);
// GEMM1's view of the sums: inv_rms and the logits [E].
float router_fold_inv_rms(const double* sums, int E, int H, float eps);

}  // namespace tetra::moe
