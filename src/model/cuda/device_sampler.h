// Samples a step's tokens where its logits are: on the GPU, by ops::cuda::sample (the same token
// ids as the CPU twin sample_cpu). The params go to the kernels by value; the histories are copied
// up (one copy, staged in pinned memory) only when some row has penalties; the kernels write the
// tokens straight into mapped host memory. A decode step so moves R int32 to the host instead of
// R x vocab f32 logits, and a greedy step is a launch and a stream sync.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "model/cuda/device_mem.h"
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
  // logits [rows, vocab] f32 on the device; params [rows] and history on the host (checked here
  // as sample_cpu checks them) -> tokens [rows] on the host. Synchronises `stream`.
  void sample(const float* logits, int rows, int vocab, const ops::SamplingParams* params,
              const ops::TokenHistory& history, int32_t* tokens, cudaStream_t stream);

 private:
  // The histories' device copy: offsets and tokens, laid out as staged.
  ops::TokenHistory upload_history(int rows, const ops::TokenHistory& h, cudaStream_t stream);

  DeviceMem workspace_;             // ops::cuda::sampling_workspace_bytes (zeroed when made)
  PinnedBuffer history_host_{false};  // the histories, staged for one copy
  DeviceMem history_dev_;           // and their device copy
  PinnedBuffer tokens_{true};       // [rows] int32, written by the kernels
};

}  // namespace tetra::model::cuda
