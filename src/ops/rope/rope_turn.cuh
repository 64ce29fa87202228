// One RoPE pair on the device, with the CPU's rounding steps (rope_cpu.cpp): shared by the RoPE
// kernel and the RoPE + KV-write kernel, so the two are bit-identical by construction.
#pragma once
#include <cuda_bf16.h>

namespace tetra::ops::cuda {

// Dims of rotary pair i in a head row: NeoX (i, i + half), GPT-J (2i, 2i + 1).
__device__ __forceinline__ void rope_pair_dims(int i, int half, bool neox, int& ia, int& ib) {
  ia = neox ? i : 2 * i;
  ib = neox ? i + half : 2 * i + 1;
}

// (a, b) turned by the angle whose sine and cosine are (sn, c). __fmul_rn/__fsub_rn/__fadd_rn
// keep the CPU's rounding steps (no FMA contraction).
__device__ __forceinline__ void rope_turn(float a, float b, float sn, float c, __nv_bfloat16& ra,
                                          __nv_bfloat16& rb) {
  ra = __float2bfloat16_rn(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn)));
  rb = __float2bfloat16_rn(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, sn)));
}

}  // namespace tetra::ops::cuda
