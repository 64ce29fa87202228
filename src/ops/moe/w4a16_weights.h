// Device copy of a packed MoE layer (PackedMoeLayer -> MoeWeightsDevice), owning its memory.
#pragma once
#include "moe/expert_weights.h"
#include "ops/moe/w4a16_moe.h"

namespace tetra {

class MoeWeightsBuffer {
 public:
  MoeWeightsBuffer() = default;
  // Uploads every tensor of the layer (synchronous; throws tetra::Error on CUDA failure).
  explicit MoeWeightsBuffer(const PackedMoeLayer& layer);
  ~MoeWeightsBuffer();
  MoeWeightsBuffer(const MoeWeightsBuffer&) = delete;
  MoeWeightsBuffer& operator=(const MoeWeightsBuffer&) = delete;

  const MoeWeightsDevice& view() const { return view_; }
  size_t bytes() const { return bytes_; }

 private:
  void* mem_ = nullptr;  // one allocation holding all seven tensors, each 256-byte aligned
  size_t bytes_ = 0;
  MoeWeightsDevice view_;
};

}  // namespace tetra
