// Samples a step's tokens where its logits are: on the GPU, by ops::cuda::sample (the same token
// ids as the CPU twin sample_cpu). The params go to the kernels by value; the histories (when some
// row has penalties) and the logit biases are copied up in one copy, staged in pinned memory; the
// kernels write the tokens straight into mapped host memory. A decode step so moves R int32 to the
// host instead of R x vocab f32 logits, and a greedy step is a launch and a stream sync. Logprobs
// come from ops::cuda::position_logprobs the same way: ~170 bytes per position, not its logits.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/cuda/device_mem.h"
#include "model/model_ops.h"
#include "ops/sampling/logprobs.h"
#include "ops/sampling/sampling.h"

namespace tetra::model::cuda {

// Pinned host memory, optionally mapped into the device's address space; grows, never shrinks.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(bool mapped) : mapped_(mapped) {}
  ~PinnedBuffer() { cudaFreeHost(host_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void reserve(size_t bytes);
  char* host() const { return static_cast<char*>(host_); }
  char* device() const { return static_cast<char*>(device_); }  // mapped buffers only

 private:
  bool mapped_;
  void* host_ = nullptr;
  void* device_ = nullptr;
  size_t bytes_ = 0;
};

class DeviceSampler {
 public:
  // logits [logit_rows, vocab] f32 on the device (the step's); the batch on the host (checked here
  // as sample_cpu checks it) -> tokens [batch.rows] on the host, and with batch.logprob_top their
  // logprobs (the logprobs kernel reads the drawn tokens on the device: one synchronisation).
  // Synchronises `stream`.
  void sample(const float* logits, int logit_rows, int vocab, const SampleBatch& batch,
              int32_t* tokens, cudaStream_t stream);
  // The same logits; queries [n] on the host (checked here) -> out [n]. Synchronises `stream`.
  void logprobs(const float* logits, int logit_rows, int vocab, const ops::LogprobQuery* queries,
                int n, ops::PositionLogprobs* out, cudaStream_t stream);

 private:
  // Host arrays staged into one pinned buffer and copied up at once: add() returns an array's
  // byte offset, upload() copies them all and returns the device base the offsets start from.
  // The logprobs kernel over the n queries in queries_ (sampled: ops::cuda::position_logprobs)
  // into answers_; no synchronisation.
  void launch_logprobs(const float* logits, int vocab, int n, const int32_t* sampled,
                       cudaStream_t stream);

  class Staging {
   public:
    size_t add(const void* host, size_t bytes);
    const char* upload(DeviceMem& dev, PinnedBuffer& pinned, cudaStream_t stream);

   private:
    struct Part {
      const void* host;
      size_t bytes, at;
    };
    std::vector<Part> parts_;
    size_t end_ = 0;
  };

  DeviceMem workspace_;               // ops::cuda::sampling_workspace_bytes (zeroed when made)
  DeviceMem gathered_;                // [rows, vocab] f32: the sampled rows, where not 0..rows-1
  PinnedBuffer staged_host_{false};   // histories and biases, staged for one copy
  DeviceMem staged_dev_;              // and their device copy
  Staging staging_;
  PinnedBuffer tokens_{true};         // [rows] int32, written by the kernels
  DeviceMem logprobs_workspace_;      // ops::cuda::logprobs_workspace_bytes (zeroed when made)
  PinnedBuffer queries_{true};        // [n] ops::LogprobQuery, read by the logprobs kernel
  PinnedBuffer answers_{true};        // [n] ops::cuda::PositionLogprobsOut, written by it
};

}  // namespace tetra::model::cuda
