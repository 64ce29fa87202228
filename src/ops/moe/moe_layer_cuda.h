// The CUDA MoE layer: router logits -> route -> layout -> GEMM1 (gathering x) -> GEMM2 (f32 rows)
// -> shared expert -> combine. At small T the first four are one launch and the shared expert
// rides in the routed GEMMs as one more slot, else it runs its own GEMMs on a side stream
// (CudaTokenPath below); optionally, at T <= 8, the whole layer is one persistent launch
// (ops/moe/persistent_layer.h). Three backends, one class:
//   cuda-w4a16: NVFP4 routed experts through the W4A16 GEMMs (ops/moe/w4a16_moe.h);
//   cuda-w4a4:  NVFP4 routed experts and NVFP4 activations (input_scale) through the W4A4 GEMMs
//               (ops/moe/w4a4_moe.h), the input scales folded into the alphas at upload;
//   cuda-bf16:  BF16 routed experts through the BF16 grouped GEMMs (ops/moe/bf16_moe.h).
// The shared expert uses the GEMMs of its own format (an NVFP4 layer may keep it in BF16); under
// cuda-w4a4 it is W4A4 when it has its own input scales, else W4A16.
// Weights are packed and uploaded once; every scratch buffer is allocated at construction for
// max_tokens, so forward allocates nothing and never synchronises (CUDA-graph capturable).
//
// Layouts: contiguous rows [T*top_k, .]; masked rows [E, max_tokens, .] (an expert can receive
// at most one row per token, so nothing is ever dropped; memory grows with E * max_tokens, meant
// for decode-sized max_tokens).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "moe/moe_layer.h"
#include "ops/moe/bf16_moe.h"
#include "ops/moe/gemm1_routing.h"
#include "ops/moe/token_path.h"
#include "ops/moe/w4a4_moe.h"
#include "ops/moe/w4a16_moe.h"

namespace tetra::moe {

// How forward moves tokens at small T. Every setting computes the same result (the gpu test
// checks them against cpu; on the H200 they gave the same bits). Defaults from the H200
// measurements in bench/moe_kernels/RESULTS.md, "layer" section (GLM-5 / GLM-4.5-Air shapes).
struct CudaTokenPath {
  // T <= this (at most cuda::kPersistentMaxTokens): the whole layer in one persistent launch
  // (ops/moe/persistent_layer.h) when it takes the layer (cuda-w4a16, the shared expert absent or
  // a slot, <= 256 experts); the settings below then do not apply. 0 = never. Off by default:
  // measured on the H200 (bench/results/2026-11-30-moe-persistent-h200.md) it is 8-10% faster at
  // GLM-5 shapes with 1 token but 8% slower at GLM-4.5-Air shapes and 15-20% slower at 8 tokens.
  int persistent_max_tokens = 0;
  // T <= this: router logits + routing + layout + row bookkeeping in one launch
  // (ops/moe/token_path.h) instead of four. 0 = never. Measured: -3 us at 1 token, even at 16,
  // +30..40 us at 64 (one block routes every token), hence 16.
  int fused_route_max_tokens = 16;
  // T <= this: the shared expert runs as one more expert slot (T rows) of the routed GEMM
  // launches; needs the shared expert in the routed experts' format and width. 0 = never.
  // Measured: as fast as the side stream at 1 token, slower from 16 tokens (its rows take
  // several passes of the decode kernel).
  int shared_slot_max_tokens = 8;
  // Otherwise the shared expert's own GEMMs run on a second stream, concurrently with the routed
  // ones (forked and joined with events: graph-capturable); false = after them on one stream.
  // Measured: -10% at 16 tokens on GLM-5 (723 -> 627..653 us), -2% at 64.
  bool shared_side_stream = true;
  // The combine as a programmatic dependent launch of the routed GEMM2 (when it follows it).
  // Measured: no difference for a lone layer at 1 token (95.4 vs 95.6 us); in the decode step
  // (GLM-4.5-Air batch 1) 4087-4114 -> 4066-4090 us per token in three paired rounds
  // (bench/results/2026-11-30-session12-h200.md), so on.
  bool combine_pdl = true;
  // The one-launch token path as a programmatic dependent launch (its router-weight loads
  // overlap the tail of the kernel before it; it waits for that kernel before reading x).
  // Measured on the H200: no difference for a lone layer at 1 token on GLM-5 (81.3-81.7 us
  // either way), but in the decode step, where the add + RMSNorm before it is a one-block
  // kernel, GLM-4.5-Air batch 1 went 4184-4199 -> 4087-4094 us per token (three rounds,
  // bench/results/2026-11-30-session12-h200.md), so on.
  bool token_path_pdl = true;
  // The one-launch token path asks the L2 for the shared expert's weights while it routes
  // (SmallTokenPath::warm), so the shared expert's GEMM rows read them from L2. Not where GEMM1
  // routes and its shared-slot blocks request those weights themselves before routing
  // (gemm1_routed_starts_shared).
  bool warm_shared = true;
  // Routed W4A16 GEMM1 and GEMM2 on the decode kernel as one launch, GEMM2 waiting per expert
  // (moe_w4a16_gemm_pair), when the shared expert is absent or a slot: 0 never, 1 where
  // moe_gemm_pair_preferred says it pays, 2 whenever it fits.
  int gemm_pair = 1;
  // The routed W4A16 GEMM1 (or the GEMM pair) on the decode kernel as a programmatic dependent of
  // the one-launch token path, which triggers only at its end (routing blocks: when they exit;
  // logits-only blocks: after their logits stores): the grid is staged while the token path
  // ends and its blocks wait for it before reading the row mapping (MoeGemmProblem::gemm1_pdl).
  bool gemm1_pdl = true;
  // One token (the one-launch token path, contiguous layout, no expert parallelism, the shared
  // expert absent or a slot, no GEMM pair): the token path computes the router logits only and
  // every GEMM1 block routes the token itself (ops/moe/gemm1_routing.h), so the routed weights
  // are requested one grid boundary and two memory round trips earlier. Measured on the H200
  // (bench/results/2026-12-02-session28-h200.md): GLM-4.5-Air decode batch 1 -3.9%, its MoE layer
  // at 1 token 41.2 -> 38.3 us.
  bool gemm1_routes = true;
  // The routed GEMM2 in 3-warp blocks where only they fit one wave (MoeGemmProblem::
  // gemm2_one_wave; GLM-4.5-Air at 1 token: decode step -0.5%, session 19). Off gives the
  // persistent layer's k split, the same bits as it.
  bool gemm2_one_wave = true;
  // With gemm2_one_wave, GEMM2 grids that fit 4 blocks per SM take 8-warp blocks
  // (MoeGemmProblem::gemm2_wide; the routed GEMM1's wide shape): twice the bytes in flight per
  // block where blocks are few. Measured on the H200 (bench/results/2026-12-02-session35-h200.md):
  // Qwen3-30B-A3B batch 1 -1.5..-2.4% (512 blocks at one token); GLM-4.x grids are too large.
  bool gemm2_wide = true;
  // Above fused_route_max_tokens, where the one-warp router kernel runs (T x E below
  // cuda::kRouterTiledMinLogits): the router logits, routing, layout and row bookkeeping as a
  // chain of programmatic dependent launches, each staged while the one before ends. Measured
  // (GLM-4.5-Air decode, H200, five rounds): batch 32 -1.0%; behind the tiled router (batch 64,
  // 128) the same chain was +0.1% and +1.0%, so it stays off there.
  bool route_pdl = true;
};

// The defaults with TETRA_MOE_TOKEN_PATH="persist=N,fused=N,slot=N,side=0|1,pdl=0|1,tpdl=0|1,
// warm=0|1,pair=0|1|2,g1route=0|1,g1pdl=0|1,g2wave=0|1,g2wide=0|1,rpdl=0|1" applied (keys optional; "old" = every fusion off), for A/B measurements:
// the model's layers and `tetra bench moe` are built with it. Throws tetra::Error on a malformed value.
CudaTokenPath cuda_token_path_from_env();
// The setting as "persist<=8 fused<=16 slot<=8 side=1 pdl=0 tpdl=0 warm=1 pair=1 g1pdl=1 g2wave=1" (for
// reports).
std::string cuda_token_path_label(const CudaTokenPath& p);

// For the benchmark: a layer of the given shape with random weights generated on the GPU (no host
// copy): NVFP4 experts (cuda-w4a16, or cuda-w4a4) or BF16 experts (cuda-bf16), a random bf16
// router weight and an e_score_correction_bias.
struct RandomMoeLayer {
  int experts = 0, hidden = 0, inter = 0;  // experts: E_local, the ones this layer holds
  int shared_inter = 0;  // 0 = no shared expert
  // Expert parallelism (see MoeLayerWeights): experts [expert_begin, expert_begin + experts) of
  // global_experts (0 = experts: the whole layer).
  int expert_begin = 0;
  int global_experts = 0;
  RouterParams router;   // num_experts == global_experts (or experts)
  // cuda-w4a4: NVFP4 activations with fixed random-layer input scales (the shared expert too).
  bool w4a4 = false;
  // cuda-bf16: BF16 routed and shared experts (not with w4a4).
  bool bf16 = false;
  // [E_global] correction bias (host values, uploaded); empty = none. Skews the choice of experts.
  std::vector<float> bias;
  uint32_t seed = 1;
};

class CudaMoeLayer final : public MoeLayerRunner {
 public:
  // Packs and uploads w (validated by make_moe_layer). Throws on CUDA errors. w4a4: NVFP4
  // experts run cuda-w4a4 (every routed expert needs its input scales, else Error).
  CudaMoeLayer(const MoeLayerWeights& w, int max_tokens, TokenLayout layout,
               const CudaTokenPath& path = {}, bool w4a4 = false);
  CudaMoeLayer(const RandomMoeLayer& spec, int max_tokens, TokenLayout layout,
               const CudaTokenPath& path = {});
  ~CudaMoeLayer() override;
  CudaMoeLayer(const CudaMoeLayer&) = delete;
  CudaMoeLayer& operator=(const CudaMoeLayer&) = delete;

  const std::string& backend() const override { return backend_; }
  bool on_device() const override { return true; }
  int max_tokens() const override { return max_tokens_; }
  void forward(const uint16_t* x, int T, uint16_t* out, const uint16_t* residual,
               cudaStream_t stream) override;
  // The add + RMSNorm in the combine's launch (CombineOptions::add_norm), where the launches
  // (not the persistent layer) run this T.
  bool forward_add_rms_norm(const uint16_t* x, int T, uint16_t* out, const AddRmsNormStep& norm,
                            cudaStream_t stream, const PreRmsNormStep* pre = nullptr) override;
  // The parts of a folded norm: the combine kernel's blocks per token
  // (cuda::combine_norm_fold_parts).
  int norm_fold_parts() const override;
  // At one token, where the tiny token path computes the logits and GEMM1 routes, with the shared
  // expert (if any) in GEMM1's slot: the token path normalises the row (SmallTokenPath::pre_norm_*).
  bool takes_pre_norm(int T) const override;
  // At one token where GEMM1 routes (sigmoid scoring, at most 256 experts): the fold's tiles and
  // sums (moe/router_fold.h); TETRA_ROUTER_FOLD=0 in the environment turns it off (A/B runs).
  const RouterFold* router_fold(int T) const override;
  void prepare_router_fold(const uint16_t* norm_weight) override;

  // forward that records marks[0..4] around its parts: [0] start, [1] after route + layout,
  // [2] after GEMM1, [3] after GEMM2 (routed and shared), [4] after combine. For the benchmark.
  // (With the shared expert on the side stream, [2] and [3] time the routed GEMMs only.)
  void forward_marked(const uint16_t* x, int T, uint16_t* out, const uint16_t* residual,
                      cudaStream_t stream, cudaEvent_t const* marks);

  // Bytes of one routed expert's weights (packed + scales, or bf16), and of the shared expert.
  size_t expert_bytes() const;
  size_t shared_bytes() const;
  size_t device_bytes() const { return bytes_; }
  // After a forward (synchronise first): pairs the layout builder dropped (always 0 when the
  // routing is valid) and the routed experts of the last call (a copy of the device ids).
  int dropped_pairs() const;
  std::vector<int32_t> last_ids(int T) const;  // [T, top_k]
  // Whether the last forward ran as the one persistent launch (ops/moe/persistent_layer.h).
  bool last_forward_persistent() const { return last_persistent_; }
  // Profiling: the persistent launches write their phase stamps there (PersistentLayer::stamps;
  // nullptr: off).
  void set_persistent_stamps(unsigned long long* stamps, uint32_t* block_sm = nullptr) {
    persist_stamps_ = stamps;
    persist_block_sm_ = block_sm;
  }

 private:
  // The shared expert's weights (packed + scales, or bf16), GEMM1's then GEMM2's, as
  // [ptrs[i], ptrs[i] + bytes[i]); returns how many (0 without a shared expert, at most 4).
  int shared_weight_ranges(const void* ptrs[4], size_t bytes[4]) const;
  // E: local experts; E_global_, begin_, routed_bf16_, shared_bf16_ are set before.
  void allocate(int E, int H, int I, int Is, bool has_bias);
  void create_streams();
  void upload_bf16(const ExpertMlpView& v, int e, int inter, const MoeBf16WeightsDevice& dst);
  // add_norm: the add + RMSNorm run by the combine (not null only where the launches run T).
  void run(const uint16_t* x, int T, uint16_t* out, const uint16_t* residual,
           cudaStream_t stream, cudaEvent_t const* marks, const AddRmsNormStep* add_norm = nullptr,
           const PreRmsNormStep* pre = nullptr);
  // Whether GEMM1 routes the token itself at T (gemm1_routing.h), as run() decides it.
  bool routes_in_gemm1(int T, bool marks) const;
  // The routed GEMMs' problem at T (it does not depend on the routing).
  MoeGemmProblem routed_problem(int T) const;
  // Whether the shared expert runs as a slot of the routed launches at T; whether GEMM1 and GEMM2
  // should run as one launch (moe_w4a16_gemm_pair) at T where it fits.
  bool shared_slot_at(int T) const;
  bool pair_wanted(int T) const;  // moe_gemm_pair_preferred, or forced by CudaTokenPath::gemm_pair
  // GEMM1's routing arguments over this layer's buffers (no fold).
  Gemm1Routing gemm1_routing(bool shared_slot) const;
  // The one-launch token path's arguments over x and prep (the caller sets the switches).
  cuda::SmallTokenPath token_path_args(const uint16_t* x, const cuda::RowsPrep& prep) const;
  // The whole layer in one persistent launch (T <= persist_T_); false when it does not take it.
  bool run_persistent(const uint16_t* x, int T, uint16_t* out, const uint16_t* residual,
                      cudaStream_t stream);

  std::string backend_ = "cuda-w4a16";
  std::string name_;
  int E_ = 0, H_ = 0, I_ = 0, Is_ = 0, max_tokens_ = 0;  // E_: local experts
  int E_global_ = 0, begin_ = 0;  // the router's experts; global id of local expert 0
  TokenLayout layout_ = TokenLayout::Contiguous;
  CudaTokenPath path_;
  // The shared expert's weights are stored as routed expert E (same format and width), so it can
  // run as a slot of the routed launches; ws_ / wsb_ then view that slot.
  bool shared_in_slot_ = false;
  cudaStream_t side_ = nullptr;  // the shared expert's GEMMs when not a slot
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  RouterParams router_;
  void* mem_ = nullptr;  // one allocation: weights, router, scratch (each 256-byte aligned)
  size_t bytes_ = 0;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;

  // Weights: packed NVFP4 (w_, ws_) or BF16 (wb_, wsb_), per the flags.
  bool routed_bf16_ = false, shared_bf16_ = false;
  // cuda-w4a4: activations quantized to NVFP4 per expert (the shared expert only with its own
  // input scales); the alphas above then carry input_scale too.
  bool routed_w4a4_ = false, shared_w4a4_ = false;
  float* in13_ = nullptr;     // [E (+1 shared slot)] GEMM1 input_scale per expert
  float* in2_ = nullptr;      // [E (+1)] GEMM2 input_scale per expert
  float* in_sh_ = nullptr;    // [2] the shared expert's {GEMM1, GEMM2} scales (own launches)
  uint16_t* xq_ = nullptr;    // [rows_cap, H] bf16 NVFP4-quantized x rows (W4A4 GEMM1 input)
  uint16_t* xq_sh_ = nullptr; // [max_T, H] the same for the shared expert's own launches
  tetra::MoeWeightsDevice w_{}, ws_{};       // routed [E (+1 shared slot)], shared [1]
  tetra::MoeBf16WeightsDevice wb_{}, wsb_{};  // routed w13 [E(+1), 2I, H], w2 [E(+1), H, I]; shared [1, ..]
  uint16_t* gate_ = nullptr;         // [E_global, H] bf16 router weight
  float* bias_ = nullptr;            // [E_global] or nullptr
  // Scratch (E = local experts).
  float* logits_ = nullptr;          // [max_T, E_global]
  // The router fold (prepare_router_fold; own allocations, null until then).
  RouterFold fold_{};                // tiles [H/16, router_fold_tile_bytes(E_global)], sums [E_global + 1]
  void* fold_mem_ = nullptr;
  int32_t* ids_ = nullptr;           // [max_T, K] global expert ids
  float* weights_ = nullptr;         // [max_T, K]
  // (+1 / + max_T: the shared expert's slot when shared_in_slot_)
  int32_t* offsets_ = nullptr;       // [E + 1] contiguous; [E] = the shared slot's first row
  int32_t* row_token_ = nullptr;     // contiguous [max_T*K (+ max_T)] slot_token; masked [(E+1)*max_T]
  int32_t* slot_of_ = nullptr;       // [max_T*K]
  int32_t* masked_m_ = nullptr;      // [E (+1)] masked
  int32_t* row_start_ = nullptr;     // [E (+1)] masked: e*max_T (constant); contiguous: = offsets_
  int32_t* row_count_ = nullptr;     // [E (+1)] contiguous: offsets diff; masked: = masked_m_
  int32_t* slots_ = nullptr;         // [E (+1)] active experts first, then -1 (then the shared slot)
  int32_t* dropped_ = nullptr;       // [1]
  uint32_t* counter_ = nullptr;      // [1] the small token path's block counter (zero between launches)
  uint32_t* pair_done_ = nullptr;    // [2 * slots] moe_w4a16_gemm_pair's counters (zero between launches)
  int32_t* sh_rows_ = nullptr;       // [2] shared problem: row_start 0, row_count T
  // The persistent layer's own bookkeeping (its rows are act_ / y_), for up to persist_T_ tokens.
  int persist_T_ = 0;
  bool last_persistent_ = false;
  unsigned long long* persist_stamps_ = nullptr;
  uint32_t* persist_block_sm_ = nullptr;
  int32_t* slot_pair_ = nullptr;     // [min(E, persist_T_*K), persist_T_]
  int32_t* num_routed_ = nullptr;    // [1]
  uint32_t* persist_sync_ = nullptr; // [cuda::persistent_sync_words(..)] zero between launches
  uint16_t* act_ = nullptr;          // [rows_cap, I] bf16 (rows_cap includes the shared slot's)
  uint16_t* xw_ = nullptr;           // [max_T, H] bf16: x in wgmma order (routed W4A16 only)
  float* y_ = nullptr;               // [rows_cap, H] f32
  uint16_t* act_sh_ = nullptr;       // [max_T, Is] bf16
  uint16_t* y_sh_ = nullptr;         // [max_T, H] bf16
};

// The name it had while it ran W4A16 only (the model runtime and decode benchmark use it).
using CudaW4a16MoeLayer = CudaMoeLayer;

}  // namespace tetra::moe
