// TETRA_HD: a function compiled for both the host and, under nvcc, the device, so a CUDA kernel
// and its CPU twin share one definition.
#pragma once

#if defined(__CUDACC__)
#define TETRA_HD __host__ __device__ __forceinline__
#else
#define TETRA_HD inline
#endif
