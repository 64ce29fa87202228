// CPU twin of the one-shot kernel's arithmetic (one_shot_math.h): same order, same rounding.
#include "core/half.h"
#include "dist/peer_allreduce.h"

namespace tetra::dist {

void one_shot_reduce_cpu(const std::vector<const uint16_t*>& inputs, uint16_t* out, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    float acc = 0.0f;
    for (const uint16_t* in : inputs) acc += bf16_to_float(in[i]);
    out[i] = float_to_bf16(acc);
  }
}

}  // namespace tetra::dist
