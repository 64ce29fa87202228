// One cudaMalloc for all tensors of a packed MoE layer.
#include "ops/moe/w4a16_weights.h"

#include "core/cuda_check.h"

namespace tetra {
namespace {
size_t align256(size_t n) { return (n + 255) / 256 * 256; }
}  // namespace

MoeWeightsBuffer::MoeWeightsBuffer(const PackedMoeLayer& L) {
  const size_t alpha_bytes = L.alpha_gate.size() * sizeof(float);
  const size_t sizes[7] = {L.w13.size(), L.s13.size(), L.w2.size(), L.s2.size(),
                           alpha_bytes,  alpha_bytes,  alpha_bytes};
  const void* srcs[7] = {L.w13.data(),        L.s13.data(),      L.w2.data(),
                         L.s2.data(),         L.alpha_gate.data(), L.alpha_up.data(),
                         L.alpha_down.data()};
  for (size_t s : sizes) bytes_ += align256(s);
  TETRA_CUDA_MALLOC(&mem_, bytes_);
  uint8_t* p = static_cast<uint8_t*>(mem_);
  uint8_t* dst[7];
  for (int i = 0; i < 7; ++i) {
    dst[i] = p;
    TETRA_CUDA_CHECK(cudaMemcpy(p, srcs[i], sizes[i], cudaMemcpyHostToDevice));
    p += align256(sizes[i]);
  }
  view_.w13 = dst[0];
  view_.s13 = dst[1];
  view_.w2 = dst[2];
  view_.s2 = dst[3];
  view_.alpha_gate = reinterpret_cast<const float*>(dst[4]);
  view_.alpha_up = reinterpret_cast<const float*>(dst[5]);
  view_.alpha_down = reinterpret_cast<const float*>(dst[6]);
}

MoeWeightsBuffer::~MoeWeightsBuffer() {
  if (mem_ != nullptr) cudaFree(mem_);
}

}  // namespace tetra
