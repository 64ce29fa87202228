// Test helper: rows stored in wgmma order (moe/wgmma_order.h) put back in natural column order.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "moe/wgmma_order.h"

namespace tetra::test {

// all: a downloaded buffer, `offset` elements (a guard) before `rows` rows of `cols` bf16 values
// in wgmma order. Returns it with those rows in natural order; everything else unchanged.
inline std::vector<uint16_t> rows_from_wgmma_order(std::vector<uint16_t> all, size_t offset,
                                                   int rows, int cols) {
  std::vector<uint16_t> row(static_cast<size_t>(cols));
  for (int r = 0; r < rows; ++r) {
    uint16_t* a = all.data() + offset + size_t(r) * cols;
    for (int n = 0; n < cols; ++n) row[size_t(n)] = a[wgmma_order_column(n)];
    std::copy(row.begin(), row.end(), a);
  }
  return all;
}

}  // namespace tetra::test
