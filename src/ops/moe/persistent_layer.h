// The whole W4A16 MoE layer for a few tokens (T <= 8) in ONE persistent launch: router logits,
// routing, GEMM1 (+ SiLU * up), GEMM2 and the weighted combine (+ residual).
//
// Why: at decode sizes the layer's four launches (token path, GEMM1, GEMM2, combine) each pay a
// launch, a ramp and a tail; each GEMM measured its bytes at ~4.2 TB/s plus 6-12 us
// (bench/results/2026-11-30-moe-decode-experiments-s6-h200.md). Here every block of a grid that
// fits on the GPU at once walks a fixed list of work items, and items wait on counters instead of
// kernel boundaries:
//   - the shared expert's GEMM1 tiles need nothing: they start at once, alongside the logits;
//   - the last logits block routes every token and publishes the active experts (slots);
//   - a routed GEMM1 tile waits for that; a GEMM2 tile issues its first weights, then waits until
//     every GEMM1 tile of its expert has written its activations;
//   - the last GEMM2 tile of 32 output rows (over all experts) combines them in the pair order of
//     the combine kernel.
// Items are handed out round-robin, GEMM1 before GEMM2, and a block only waits for items earlier
// in the list, held by blocks that are running (the grid is sized to be resident at once), so the
// waits cannot deadlock. Counters are left at zero by the last block out.
//
// Numerics: the same device code and summation orders as the separate launches (router_dot,
// route_token_regs, the decode GEMM's 4-warp k split, combine's pair order), so the output is
// bit-identical to them where their GEMM2 keeps 4-warp blocks (CudaTokenPath::gemm2_one_wave
// off; on, a one-wave grid of 3-warp blocks sums k in another order); the gpu test holds it to that.
//
// Status (H200, bench/results/2026-11-30-moe-persistent-h200.md; tests/gpu/bench_persistent_layer
// prints the phase stamps): GLM-5 shapes, 1 token 72-74 us against 80 us for the launches;
// GLM-4.5-Air shapes, 1 token 45 us against 41.5; 8 tokens 15-20% slower at both. Its expert GEMMs
// stream more slowly than the separate kernels' (the hardware places a persistent grid's blocks
// unevenly: 5 to 8 GEMM1 tiles per SM at 1 token), and the logits and routing take 9-14 us before
// the routed experts' weights can be requested. So the layer uses it only when asked
// (CudaTokenPath::persistent_max_tokens).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "moe/router.h"
#include "ops/moe/w4a16_moe.h"

namespace tetra::moe::cuda {

inline constexpr int kPersistentMaxTokens = 8;     // one n8 MMA tile of tokens
inline constexpr int kPersistentMaxExperts = 256;  // routing with 8 scores per lane

struct PersistentLayer {
  const uint16_t* x = nullptr;         // [T, H] bf16
  const uint16_t* residual = nullptr;  // [T, H] bf16 or nullptr
  uint16_t* out = nullptr;             // [T, H] bf16
  int T = 0, H = 0, I = 0;
  const uint16_t* gate = nullptr;      // [E_global, H] bf16 router weight
  const float* bias = nullptr;         // [E_global] or nullptr
  RouterParams router;                 // num_experts = E_global
  int expert_begin = 0, E = 0;         // local experts [expert_begin, expert_begin + E)
  bool has_shared = false;             // the shared expert is local expert E of w
  MoeWeightsDevice w;                  // [E (+1)] packed NVFP4 experts
  // Scratch (device). max_routed = min(E, T * top_k) routed slots; rows: one per pair (p = t *
  // top_k + j), then the shared expert's row T * top_k + t.
  float* logits = nullptr;             // [T, E_global]
  int32_t* ids = nullptr;              // [T, top_k] global expert ids (written)
  float* weights = nullptr;            // [T, top_k] (written)
  int32_t* pair_slot = nullptr;        // [T, top_k] slot of each pair, -1 for other ranks' experts
  int32_t* slot_expert = nullptr;      // [max_routed] active local experts, ascending
  int32_t* slot_pair = nullptr;        // [max_routed, T] row of token t in slot s, -1 if not routed
  int32_t* num_routed = nullptr;       // [1]
  int32_t* dropped = nullptr;          // [1] pairs with an id outside the router (always 0)
  uint16_t* act = nullptr;             // [T * top_k + T, I] bf16 GEMM1 output rows
  float* part = nullptr;               // [T * top_k + T, H] f32 GEMM2 output rows
  uint32_t* sync = nullptr;            // [persistent_sync_words(..)] zero before the first launch
  bool pdl = true;  // weights and gate rows stream in while the previous kernel drains
  // Profiling: when set, [kStampCount] globaltimer ns of the phases below (the caller sets the
  // "first" entries to ~0 and the others to 0 before the launch).
  unsigned long long* stamps = nullptr;
  uint32_t* block_sm = nullptr;  // profiling with stamps: [grid] the SM each block runs on
};

enum PersistentStamp : int {
  kStampKernelStart = 0,  // first: the earliest block start
  kStampLogitsDone,       // the last logits block is in
  kStampRouted,           // routing published
  kStampGemm1First,       // first: a routed GEMM1 item starts streaming
  kStampGemm1LastStart,   // the last GEMM1 item starts
  kStampGemm1Done,        // the last GEMM1 item ends
  kStampGemm2First,       // first: a routed GEMM2 item is past its GEMM1 wait
  kStampGemm2LastStart,   // the last GEMM2 item starts
  kStampGemm2Done,        // the last GEMM2 item ends
  kStampCombineDone,      // the last 32-row combine ends
  kStampExit,             // the last block leaves
  kStampCount
};

// Counter words the launch needs for these sizes.
size_t persistent_sync_words(int T_max, int top_k, int E, int H);
// Empty when the one-launch layer takes these arguments, else why not.
std::string persistent_layer_unsupported_reason(const PersistentLayer& a);
// Launches it: grid = blocks resident at once on this device (or fewer, one per item).
cudaError_t persistent_layer(const PersistentLayer& a, cudaStream_t stream);

}  // namespace tetra::moe::cuda
