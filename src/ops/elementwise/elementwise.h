// Small per-element ops of the model forward, on the CPU (the reference the CUDA twins in
// elementwise_cuda.h are checked against). All bf16 in and out unless said; float math, one
// rounding per output element.
#pragma once
#include <cstdint>

namespace tetra::ops {

// out [T, H] = table [vocab, H] rows ids [T]; an id outside [0, vocab) is an error.
void embedding_gather_cpu(const uint16_t* table, int vocab, int H, const int32_t* ids, int T,
                          uint16_t* out);

// out [T, I] = silu(gu[t, 0:I]) * gu[t, I:2I] from gu [T, 2I] (gate half first, then up).
void silu_mul_cpu(const uint16_t* gu, int T, int I, uint16_t* out);

// out [n] = a [n] + b [n]; out may alias a or b.
void add_cpu(const uint16_t* a, const uint16_t* b, int64_t n, uint16_t* out);

// y [M, N] += bias [N] (y bf16).
void add_bias_cpu(uint16_t* y, int M, int N, const uint16_t* bias);

}  // namespace tetra::ops
