// Deterministic random weights: element i of a tensor depends only on (seed, tensor name, i), so
// tensors can be generated in any order, in parallel, and regenerated bit-identically.
#pragma once
#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace tetra {

uint64_t tensor_seed(uint64_t seed, std::string_view tensor_name);

// Uniform values with mean `mean` and standard deviation `stddev` into a F32/F16/BF16 buffer:
// out[i] for i in [begin, end) of the tensor (out points at element `begin`).
void fill_random(void* out, DType dtype, int64_t begin, int64_t end, uint64_t tensor_seed,
                 float mean, float stddev);

}  // namespace tetra
