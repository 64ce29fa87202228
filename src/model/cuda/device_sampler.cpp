#include "model/cuda/device_sampler.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "ops/sampling/logprobs_cuda.h"
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

size_t DeviceSampler::Staging::add(const void* host, size_t bytes) {
  const size_t at = end_;
  parts_.push_back({host, bytes, at});
  end_ = align16(end_ + bytes);
  return at;
}

const char* DeviceSampler::Staging::upload(DeviceMem& dev, PinnedBuffer& pinned,
                                           cudaStream_t stream) {
  pinned.reserve(std::max<size_t>(end_, 16));
  if (dev.bytes() < end_) dev = DeviceMem(std::max(end_, 2 * dev.bytes()));
  for (const Part& p : parts_) std::memcpy(pinned.host() + p.at, p.host, p.bytes);
  if (end_ > 0)
    TETRA_CUDA_CHECK(cudaMemcpyAsync(dev.as(), pinned.host(), end_, cudaMemcpyHostToDevice, stream));
  parts_.clear();
  end_ = 0;
  return dev.as<char>();
}

void DeviceSampler::sample(const float* logits, int logit_rows, int vocab, const SampleBatch& b,
                           int32_t* tokens, cudaStream_t stream) {
  const int rows = b.rows;
  TETRA_CHECK(rows >= 0 && vocab > 0, "sampling: rows=", rows, " vocab=", vocab);
  if (rows == 0) return;
  ops::check_sampling_inputs(b.params, rows, vocab, b.history, b.bias);  // as sample_cpu does
  if (b.logit_rows == nullptr)
    TETRA_CHECK(rows <= logit_rows, "sample: ", rows, " rows of a step with ", logit_rows, " logit rows");
  for (int i = 0; b.logit_rows != nullptr && i < rows; ++i)
    TETRA_CHECK(b.logit_rows[i] >= 0 && b.logit_rows[i] < logit_rows, "sample: logit row ",
                b.logit_rows[i], " outside [0, ", logit_rows, ")");

  // Stage what the kernels read besides the params: histories (rows with penalties only) and
  // biases. Offsets are byte offsets into the one upload until it has happened.
  const bool penalties = std::any_of(b.params, b.params + rows, ops::has_penalties);
  const ops::TokenHistory& h = b.history;
  size_t at[6] = {};  // prompt tokens, offsets, output tokens, offsets, bias tokens, values
  bool staged[6] = {};
  auto stage = [&](int i, const void* p, size_t bytes) { at[i] = staging_.add(p, bytes), staged[i] = true; };
  if (penalties && present(h.prompt_tokens, h.prompt_offsets)) {
    stage(0, h.prompt_tokens, size_t(h.prompt_offsets[rows]) * sizeof(int32_t));
    stage(1, h.prompt_offsets, size_t(rows + 1) * sizeof(int32_t));
  }
  if (penalties && present(h.output_tokens, h.output_offsets)) {
    stage(2, h.output_tokens, size_t(h.output_offsets[rows]) * sizeof(int32_t));
    stage(3, h.output_offsets, size_t(rows + 1) * sizeof(int32_t));
  }
  const bool biased = b.bias.tokens && b.bias.values && b.bias.offsets && b.bias.offsets[rows] > 0;
  if (biased) {
    stage(4, b.bias.tokens, size_t(b.bias.offsets[rows]) * sizeof(int32_t));
    stage(5, b.bias.values, size_t(b.bias.offsets[rows]) * sizeof(float));
  }
  const char* base = staging_.upload(staged_dev_, staged_host_, stream);
  auto dev = [&](int i) { return staged[i] ? base + at[i] : nullptr; };
  const ops::TokenHistory dh{reinterpret_cast<const int32_t*>(dev(0)), reinterpret_cast<const int32_t*>(dev(1)),
                             reinterpret_cast<const int32_t*>(dev(2)), reinterpret_cast<const int32_t*>(dev(3))};
  ops::LogitBias db;  // tokens and values on the device, offsets on the host (sampling_cuda.h)
  if (biased)
    db = {reinterpret_cast<const int32_t*>(dev(4)), reinterpret_cast<const float*>(dev(5)), b.bias.offsets};

  // Rows other than 0..rows-1 are gathered first: the kernels read rows [0, rows).
  const float* lg = logits;
  if (b.logit_rows != nullptr) {
    const size_t row_bytes = size_t(vocab) * sizeof(float);
    if (gathered_.bytes() < size_t(rows) * row_bytes) gathered_ = DeviceMem(size_t(rows) * row_bytes);
    for (int i = 0; i < rows; ++i)
      TETRA_CUDA_CHECK(cudaMemcpyAsync(gathered_.as<char>() + size_t(i) * row_bytes,
                                       logits + size_t(b.logit_rows[i]) * size_t(vocab), row_bytes,
                                       cudaMemcpyDeviceToDevice, stream));
    lg = gathered_.as<float>();
  }
  const bool scratch = ops::cuda::sampling_needs_scratch(b.params, rows, db);
  const size_t ws = ops::cuda::sampling_workspace_bytes(scratch ? rows : 0, vocab);
  if (workspace_.bytes() < ws) {
    workspace_ = DeviceMem(ws);
    TETRA_CUDA_CHECK(cudaMemset(workspace_.as(), 0, ws));  // the argmax kernel's keys, once
  }
  tokens_.reserve(size_t(rows) * sizeof(int32_t));
  const auto* sampled = reinterpret_cast<const int32_t*>(tokens_.device());
  TETRA_CUDA_CHECK(ops::cuda::sample(lg, rows, vocab, b.params, dh, db, workspace_.as(),
                                     workspace_.bytes(), const_cast<int32_t*>(sampled), stream));
  // The draws' logprobs in the same round trip: the kernel reads each asking row's token where
  // the sampling kernel wrote it (its query's token is the row's index there).
  std::vector<int> asked;  // rows asking for logprobs
  if (b.logprob_top != nullptr) {
    TETRA_CHECK(b.logprobs != nullptr, "sample: logprob_top without an output");
    for (int i = 0; i < rows; ++i)
      if (b.logprob_top[i] >= 0) {
        ops::check_logprob_query({i, 0, b.logprob_top[i]}, rows, vocab);
        asked.push_back(i);
      }
    queries_.reserve(asked.size() * sizeof(ops::LogprobQuery));
    auto* q = reinterpret_cast<ops::LogprobQuery*>(queries_.host());
    for (size_t k = 0; k < asked.size(); ++k) q[k] = {asked[k], asked[k], b.logprob_top[asked[k]]};
    launch_logprobs(lg, vocab, int(asked.size()), sampled, stream);
  }
  TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::memcpy(tokens, tokens_.host(), size_t(rows) * sizeof(int32_t));
  if (b.logprob_top == nullptr) return;
  for (int i = 0; i < rows; ++i) b.logprobs[i] = {};
  const auto* answers = reinterpret_cast<const ops::cuda::PositionLogprobsOut*>(answers_.host());
  for (size_t k = 0; k < asked.size(); ++k)
    if (tokens[asked[k]] >= 0) b.logprobs[asked[k]] = ops::cuda::to_position_logprobs(answers[k]);
}

void DeviceSampler::launch_logprobs(const float* logits, int vocab, int n, const int32_t* sampled,
                                    cudaStream_t stream) {
  if (n <= 0) return;
  answers_.reserve(size_t(n) * sizeof(ops::cuda::PositionLogprobsOut));
  const size_t ws = ops::cuda::logprobs_workspace_bytes(n, vocab);
  if (logprobs_workspace_.bytes() < ws) {
    logprobs_workspace_ = DeviceMem(ws);
    TETRA_CUDA_CHECK(cudaMemset(logprobs_workspace_.as(), 0, ws));  // the counters, once
  }
  TETRA_CUDA_CHECK(ops::cuda::position_logprobs(
      logits, vocab, reinterpret_cast<const ops::LogprobQuery*>(queries_.device()), n,
      logprobs_workspace_.as(), logprobs_workspace_.bytes(),
      reinterpret_cast<ops::cuda::PositionLogprobsOut*>(answers_.device()), stream, sampled));
}

void DeviceSampler::logprobs(const float* logits, int logit_rows, int vocab,
                             const ops::LogprobQuery* queries, int n, ops::PositionLogprobs* out,
                             cudaStream_t stream) {
  if (n <= 0) return;
  for (int i = 0; i < n; ++i) ops::check_logprob_query(queries[i], logit_rows, vocab);
  queries_.reserve(size_t(n) * sizeof(ops::LogprobQuery));
  std::memcpy(queries_.host(), queries, size_t(n) * sizeof(ops::LogprobQuery));
  launch_logprobs(logits, vocab, n, nullptr, stream);
  TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto* answers = reinterpret_cast<const ops::cuda::PositionLogprobsOut*>(answers_.host());
  for (int i = 0; i < n; ++i) out[i] = ops::cuda::to_position_logprobs(answers[i]);
}

}  // namespace tetra::model::cuda
