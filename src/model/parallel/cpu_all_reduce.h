// The tensor parallel sum of the CPU ranks (tests): each rank calls run(rank, data, count) from
// its own thread with the same counts in the same order; every rank's data becomes
// bf16(sum over ranks of float(data)), summed in rank order with one rounding, so every rank
// holds the same bits (as the GPU one-shot all-reduce). Blocks until all ranks have called.
#pragma once
#include <barrier>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tetra::model::parallel {

class CpuAllReduce {
 public:
  explicit CpuAllReduce(int ranks);
  void run(int rank, uint16_t* data, size_t count);

 private:
  int ranks_;
  std::barrier<> barrier_;
  std::vector<uint16_t*> inputs_;           // [ranks] this call's buffers
  std::vector<std::vector<uint16_t>> out_;  // [ranks][count] each rank's result before the copy
};

}  // namespace tetra::model::parallel
