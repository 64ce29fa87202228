// CUDA twins of ops/elementwise/elementwise.h (same shapes, device pointers, one stream; no
// allocation or sync, so they can be captured in a CUDA graph), plus device-side fills used by
// the random-weight benchmark.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace tetra::ops::cuda {

// As embedding_gather_cpu; an id outside [0, vocab) gives a row of zeros (the device cannot
// throw: validate ids on the host).
cudaError_t embedding_gather(const uint16_t* table, int vocab, int H, const int32_t* ids, int T,
                             uint16_t* out, cudaStream_t stream);

// As silu_mul_cpu: gu [T, 2I] -> out [T, I].
cudaError_t silu_mul(const uint16_t* gu, int T, int I, uint16_t* out, cudaStream_t stream);

// out [n] = silu(gate [n]) * up [n] (gate and up in separate buffers); out may alias gate.
cudaError_t silu_mul_split(const uint16_t* gate, const uint16_t* up, int64_t n, uint16_t* out,
                           cudaStream_t stream);

// out [n] = a + b (bf16); out may alias a or b.
cudaError_t add(const uint16_t* a, const uint16_t* b, int64_t n, uint16_t* out,
                cudaStream_t stream);

// y [M, N] += bias [N]; y bf16 (y_f32 false) or f32 (y_f32 true), bias bf16.
cudaError_t add_bias(void* y, bool y_f32, int M, int N, const uint16_t* bias,
                     cudaStream_t stream);

// Random fills (counter-based hash of seed and index, so any launch shape gives the same bytes).
// bytes [n] uniform in [0, 256).
cudaError_t fill_random_bytes(uint8_t* p, int64_t n, uint64_t seed, cudaStream_t stream);
// bytes [n] uniform in [lo, hi] (for valid scale codes).
cudaError_t fill_random_byte_range(uint8_t* p, int64_t n, uint8_t lo, uint8_t hi, uint64_t seed,
                                   cudaStream_t stream);
// bf16 [n] uniform in [-a, a].
cudaError_t fill_random_bf16(uint16_t* p, int64_t n, float a, uint64_t seed, cudaStream_t stream);
// f32 [n] = v.
cudaError_t fill_f32(float* p, int64_t n, float v, cudaStream_t stream);
// bf16 [n] = v.
cudaError_t fill_bf16(uint16_t* p, int64_t n, float v, cudaStream_t stream);

}  // namespace tetra::ops::cuda
