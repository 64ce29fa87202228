#include "model/cuda/device_sampler.h"

#include <algorithm>
#include <cstring>

#include "core/cuda_check.h"
#include "core/error.h"
#include "ops/sampling/sampling_cuda.h"

namespace tetra::model::cuda {

namespace {

size_t align16(size_t n) { return (n + 15) & ~size_t(15); }

// A history part is present when both its tokens and its offsets are given (sampling.h).
bool present(const int32_t* tokens, const int32_t* offsets) {
  return tokens != nullptr && offsets != nullptr;
}

}  // namespace

void PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_) return;
  const size_t grown = std::max(bytes, 2 * bytes_);
  cudaFreeHost(host_);
  host_ = device_ = nullptr;
  bytes_ = 0;
  TETRA_CUDA_CHECK(cudaHostAlloc(&host_, grown, mapped_ ? cudaHostAllocMapped : cudaHostAllocDefault));
  if (mapped_) TETRA_CUDA_CHECK(cudaHostGetDevicePointer(&device_, host_, 0));
  bytes_ = grown;
}

ops::TokenHistory DeviceSampler::upload_history(int rows, const ops::TokenHistory& h,
                                                cudaStream_t stream) {
  struct Part {
    const int32_t* tokens;
    const int32_t* offsets;
    size_t offsets_at = 0, tokens_at = 0;
  };
  Part parts[2] = {{h.prompt_tokens, h.prompt_offsets}, {h.output_tokens, h.output_offsets}};
  size_t end = 0;
  for (Part& p : parts) {
    if (!present(p.tokens, p.offsets)) continue;
    p.offsets_at = end;
    end = align16(end + size_t(rows + 1) * sizeof(int32_t));
    p.tokens_at = end;
    end = align16(end + size_t(p.offsets[rows]) * sizeof(int32_t));
  }
  history_host_.reserve(std::max<size_t>(end, 16));
  if (history_dev_.bytes() < end) history_dev_ = DeviceMem(std::max(end, 2 * history_dev_.bytes()));
  char* d = history_dev_.as<char>();
  const int32_t* dev[2][2] = {};  // [prompt, output][tokens, offsets]
  for (int i = 0; i < 2; ++i) {
    const Part& p = parts[i];
    if (!present(p.tokens, p.offsets)) continue;
    std::memcpy(history_host_.host() + p.offsets_at, p.offsets, size_t(rows + 1) * sizeof(int32_t));
    std::memcpy(history_host_.host() + p.tokens_at, p.tokens, size_t(p.offsets[rows]) * sizeof(int32_t));
    dev[i][0] = reinterpret_cast<const int32_t*>(d + p.tokens_at);
    dev[i][1] = reinterpret_cast<const int32_t*>(d + p.offsets_at);
  }
  if (end > 0)
    TETRA_CUDA_CHECK(cudaMemcpyAsync(d, history_host_.host(), end, cudaMemcpyHostToDevice, stream));
  return {dev[0][0], dev[0][1], dev[1][0], dev[1][1]};
}

void DeviceSampler::sample(const float* logits, int rows, int vocab,
                           const ops::SamplingParams* params, const ops::TokenHistory& history,
                           int32_t* tokens, cudaStream_t stream) {
  TETRA_CHECK(rows >= 0 && vocab > 0, "sampling: rows=", rows, " vocab=", vocab);
  if (rows == 0) return;
  ops::check_sampling_inputs(params, rows, vocab, history);  // as sample_cpu checks them

  const ops::TokenHistory dev = std::any_of(params, params + rows, ops::has_penalties)
                                    ? upload_history(rows, history, stream)
                                    : ops::TokenHistory{};
  const bool scratch = ops::cuda::sampling_needs_scratch(params, rows);
  const size_t ws = ops::cuda::sampling_workspace_bytes(scratch ? rows : 0, vocab);
  if (workspace_.bytes() < ws) {
    workspace_ = DeviceMem(ws);
    TETRA_CUDA_CHECK(cudaMemset(workspace_.as(), 0, ws));  // the argmax kernel's keys, once
  }
  tokens_.reserve(size_t(rows) * sizeof(int32_t));
  TETRA_CUDA_CHECK(ops::cuda::sample(logits, rows, vocab, params, dev, workspace_.as(),
                                     workspace_.bytes(), reinterpret_cast<int32_t*>(tokens_.device()),
                                     stream));
  TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::memcpy(tokens, tokens_.host(), size_t(rows) * sizeof(int32_t));
}

}  // namespace tetra::model::cuda
