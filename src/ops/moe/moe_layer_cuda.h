// The CUDA MoE layer: router logits -> route -> layout -> GEMM1 (gathering x) -> GEMM2 (f32 rows)
// -> shared expert (the same GEMMs as a one-expert problem) -> combine. Two backends, one class:
//   cuda-w4a16: NVFP4 routed experts through the W4A16 GEMMs (ops/moe/w4a16_moe.h);
//   cuda-bf16:  BF16 routed experts through the BF16 grouped GEMMs (ops/moe/bf16_moe.h).
// The shared expert uses the GEMMs of its own format (an NVFP4 layer may keep it in BF16).
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
#include "ops/moe/w4a16_moe.h"

namespace tetra::moe {

// For the benchmark: a layer of the given shape with random NVFP4 weights generated on the GPU
// (no host copy), a random bf16 router weight and an e_score_correction_bias.
struct RandomW4a16Layer {
  int experts = 0, hidden = 0, inter = 0;  // experts: E_local, the ones this layer holds
  int shared_inter = 0;  // 0 = no shared expert
  // Expert parallelism (see MoeLayerWeights): experts [expert_begin, expert_begin + experts) of
  // global_experts (0 = experts: the whole layer).
  int expert_begin = 0;
  int global_experts = 0;
  RouterParams router;   // num_experts == global_experts (or experts)
  // [E_global] correction bias (host values, uploaded); empty = none. Skews the choice of experts.
  std::vector<float> bias;
  uint32_t seed = 1;
};

class CudaMoeLayer final : public MoeLayerRunner {
 public:
  // Packs and uploads w (validated by make_moe_layer). Throws on CUDA errors.
  CudaMoeLayer(const MoeLayerWeights& w, int max_tokens, TokenLayout layout);
  CudaMoeLayer(const RandomW4a16Layer& spec, int max_tokens, TokenLayout layout);
  ~CudaMoeLayer() override;
  CudaMoeLayer(const CudaMoeLayer&) = delete;
  CudaMoeLayer& operator=(const CudaMoeLayer&) = delete;

  const std::string& backend() const override { return backend_; }
  bool on_device() const override { return true; }
  int max_tokens() const override { return max_tokens_; }
  void forward(const uint16_t* x, int T, uint16_t* out, const uint16_t* residual,
               cudaStream_t stream) override;

  // forward that records marks[0..4] around its parts: [0] start, [1] after route + layout,
  // [2] after GEMM1, [3] after GEMM2 (routed and shared), [4] after combine. For the benchmark.
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

 private:
  // E: local experts; E_global_ and begin_ are set before.
  void allocate(int E, int H, int I, int Is, bool has_bias);
  void upload_bf16(const ExpertMlpView& v, int e, int inter, const MoeBf16WeightsDevice& dst);
  void run(const uint16_t* x, int T, uint16_t* out, const uint16_t* residual,
           cudaStream_t stream, cudaEvent_t const* marks);

  std::string backend_ = "cuda-w4a16";
  std::string name_;
  int E_ = 0, H_ = 0, I_ = 0, Is_ = 0, max_tokens_ = 0;  // E_: local experts
  int E_global_ = 0, begin_ = 0;  // the router's experts; global id of local expert 0
  TokenLayout layout_ = TokenLayout::Contiguous;
  RouterParams router_;
  void* mem_ = nullptr;  // one allocation: weights, router, scratch (each 256-byte aligned)
  size_t bytes_ = 0;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;

  // Weights: packed NVFP4 (w_, ws_) or BF16 (wb_, wsb_), per the flags.
  bool routed_bf16_ = false, shared_bf16_ = false;
  tetra::MoeWeightsDevice w_{}, ws_{};       // routed [E], shared [1]
  tetra::MoeBf16WeightsDevice wb_{}, wsb_{};  // routed w13 [E, 2I, H], w2 [E, H, I]; shared [1, ..]
  uint16_t* gate_ = nullptr;         // [E_global, H] bf16 router weight
  float* bias_ = nullptr;            // [E_global] or nullptr
  // Scratch (E = local experts).
  float* logits_ = nullptr;          // [max_T, E_global]
  int32_t* ids_ = nullptr;           // [max_T, K] global expert ids
  float* weights_ = nullptr;         // [max_T, K]
  int32_t* offsets_ = nullptr;       // [E + 1] contiguous
  int32_t* row_token_ = nullptr;     // contiguous [max_T*K] slot_token; masked [E*max_T]
  int32_t* slot_of_ = nullptr;       // [max_T*K]
  int32_t* masked_m_ = nullptr;      // [E] masked
  int32_t* row_start_ = nullptr;     // [E] masked: e*max_T (constant); contiguous: = offsets_
  int32_t* row_count_ = nullptr;     // [E] contiguous: offsets diff; masked: = masked_m_
  int32_t* slots_ = nullptr;         // [E] active experts first, then -1
  int32_t* dropped_ = nullptr;       // [1]
  int32_t* sh_rows_ = nullptr;       // [2] shared problem: row_start 0, row_count T
  uint16_t* act_ = nullptr;          // [rows_cap, I] bf16
  float* y_ = nullptr;               // [rows_cap, H] f32
  uint16_t* act_sh_ = nullptr;       // [max_T, Is] bf16
  uint16_t* y_sh_ = nullptr;         // [max_T, H] bf16
};

// The name it had while it ran W4A16 only (the model runtime and decode benchmark use it).
using CudaW4a16MoeLayer = CudaMoeLayer;

}  // namespace tetra::moe
