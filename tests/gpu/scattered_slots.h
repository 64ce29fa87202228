// Cache-write test set-up shared by the MLA cache write and the DSA index keys tests: tokens
// written to shuffled cache slots, some to none, and the rows they write poisoned beforehand so
// a row the kernel misses shows as NaN.
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace tetra::test {

// [T] distinct slots in [0, num_slots) in shuffled order; every fourth token from the fourth on
// gets -1 (writes nothing).
inline std::vector<int64_t> scattered_slots(int T, int64_t num_slots, std::mt19937& rng) {
  std::vector<int64_t> perm(static_cast<size_t>(num_slots));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> slots(perm.begin(), perm.begin() + T);
  for (int t = 3; t < T; t += 4) slots[size_t(t)] = -1;
  return slots;
}

// Fills the rows of cache [num_slots, row] that slots write with NaN (bf16 0xFFFF); returns
// written [num_slots]: which rows those are.
inline std::vector<bool> poison_written_rows(const std::vector<int64_t>& slots, size_t row,
                                             std::vector<uint16_t>& cache) {
  std::vector<bool> written(cache.size() / row, false);
  for (int64_t sl : slots)
    if (sl >= 0) {
      written[size_t(sl)] = true;
      std::fill_n(cache.begin() + sl * int64_t(row), row, uint16_t(0xFFFF));
    }
  return written;
}

}  // namespace tetra::test
