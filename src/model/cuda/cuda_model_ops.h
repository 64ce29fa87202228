// The CUDA backend of the model runtime (model/model_ops.h): weights packed/uploaded once,
// activation buffers, KV cache (bf16, paged) and logits on the device, every op on one stream.
//   - NVFP4 linears run the W4A16 kernels as one-expert GEMMs (ops/linear/linear_cuda.h); a dense
//     NVFP4 MLP fuses gate/up/SiLU into one launch (dense_gate_up). BF16 linears use cuBLASLt.
//   - Decode batches (<= 8 rows): qkv() runs q, k and v as one decode GEMV launch
//     (linear_nvfp4_gemv) with the biases in its epilogue, when all three are NVFP4.
//   - rope_write_kv runs RoPE and the KV-cache write as one kernel (ops/rope/rope_kv_cuda.h).
//   - MoE blocks use the MoE layer runner (moe/moe_layer.h, cuda-w4a16), prefill in chunks.
//   - Decode steps are captured once per bucketed batch size (1, 2, 4, ... up to max_seqs) as a
//     CUDA graph and replayed: begin_step uploads the step (tokens, positions, slots, block
//     tables, seq lens, logit rows) into fixed device buffers, padding the batch to its bucket
//     with copies of sequence 0 whose KV write is skipped (slot -1); the ops then only record (first
//     time) or do nothing (replay), and logits() launches the graph.
//   - Sampling copies the logits to the host and runs the CPU sampler (same ids as the GPU one).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/model_ops.h"

namespace tetra::model::cuda {

// Options that are not part of the backend-neutral interface (tests and the benchmark).
struct CudaOpsOptions {
  bool graphs = true;        // replay decode steps as CUDA graphs
  int moe_chunk_tokens = 1024;  // MoE scratch per layer is sized for this many tokens
  // Decode attention by the finely split kernel (split_decode_attention.h) where it supports the
  // shape; false: ops/attention's paged_decode_attention. Read at prepare.
  bool split_decode = true;
  // With split_decode, a decode step's RoPE + KV-cache write runs inside the attention launch
  // (DecodeRope in split_decode_attention.h) where the rotary shape allows; false: the
  // rope_and_write_kv launch before it. The same bits either way. Read at prepare.
  bool rope_in_attention = true;
  // At one token, the post-attention add + RMSNorm folded into o_proj's epilogue and the MoE
  // block's first launch where both take it (ModelOps::o_proj_folded_norm_moe); false, or the
  // environment's TETRA_FOLD_POST_NORM=0, keeps its own launch. Same results up to the order of
  // the norm's sum of squares.
  bool fold_post_norm = true;
  // With fold_post_norm, the MoE router folded into o_proj's epilogue too where the block takes
  // it (moe/router_fold.h; sigmoid routing): no token path launch. Results differ from the
  // unfolded path at the bf16 rounding of the normalised row (routing only at near ties).
  // TETRA_ROUTER_FOLD=0 in the environment turns it off as well.
  bool router_fold = true;
  // Up to 8 tokens, the next layer's input RMSNorm left to its NVFP4 q/k/v GEMV (the MoE
  // combine writes g * h and per-block sums of squares, no cluster; moe/add_rms_norm_step.h
  // NormFold) where both take it. Results differ from the unfolded path at the bf16 rounding of
  // the normalised row. TETRA_FOLD_INPUT_NORM=0 in the environment turns it off as well.
  bool fold_input_norm = true;
};

class CudaModelOpsApi : public ModelOps {
 public:
  // As prepare(), but every weight is random and generated on the GPU: `shapes` gives only the
  // structure (views may have null data; LinearWeight::quantized picks NVFP4 or BF16). NVFP4
  // bytes uniform, block scales in [2^-3, 2^-1), global scales chosen so activations stay O(1).
  virtual void prepare_random(const ModelWeights& shapes, const OpsLimits& limits,
                              uint64_t seed) = 0;
  virtual void set_options(const CudaOpsOptions& o) = 0;  // before prepare
  // Device bytes held for weights (what a decode step must read at most), and the total.
  virtual size_t weight_bytes() const = 0;
  virtual size_t device_bytes() const = 0;
  // Waits for the stream (timing).
  virtual void synchronize() = 0;
  // Graphs captured so far (tests check replay happens).
  virtual int graphs_captured() const = 0;
  // Layers run so far with the post-attention norm folded (eagerly or recorded; tests check the
  // fold happens).
  virtual int64_t folded_post_norms() const = 0;
  // Of those, the layers whose o_proj also folded the router (CudaOpsOptions::router_fold).
  virtual int64_t folded_routers() const = 0;
  // Layers whose input norm a MoE combine left to their q/k/v (CudaOpsOptions::fold_input_norm).
  virtual int64_t folded_input_norms() const = 0;
  virtual void* stream() const = 0;  // cudaStream_t
  // Tensor parallel: all_reduce(Buf) calls this with the buffer's first T rows (count bf16
  // elements) on the backend's stream, while recording or running eagerly (a replayed graph
  // holds the calls it recorded). Without a hook all_reduce does nothing. Set before prepare.
  using AllReduceHook = std::function<void(uint16_t* data, size_t count, void* stream)>;
  virtual void set_all_reduce_hook(AllReduceHook hook) = 0;
};

std::unique_ptr<CudaModelOpsApi> make_cuda_model_ops_api();

// Why this backend cannot run a model of this configuration (its attention kernels take head_dim
// 64 or 128 and at most 16 query heads per kv head in decode); empty when it can. prepare()
// refuses with the first reason before uploading anything; `tetra check` lists them all.
std::vector<std::string> cuda_model_unsupported_reasons(const ModelConfig& config);

// Forces the registration object into a binary that links tetra_lib (static archive).
void link_cuda_model_ops();

}  // namespace tetra::model::cuda
