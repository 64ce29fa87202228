// A zero-copy, read-only view of one tensor's bytes inside a memory-mapped checkpoint file.
// The view does not own its bytes: it is valid while the SafetensorsFile/Checkpoint lives.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tetra {

struct TensorView {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;     // [d0, d1, ...]; empty for a 0-d scalar
  const uint8_t* data = nullptr;  // [nbytes] raw little-endian elements, row-major
  size_t nbytes = 0;

  // Product of the shape (1 for a scalar, 0 if any dim is 0). The parser guarantees it fits.
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

}  // namespace tetra
