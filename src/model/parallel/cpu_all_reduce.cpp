#include "model/parallel/cpu_all_reduce.h"

#include <cstring>

#include "core/half.h"

namespace tetra::model::parallel {

CpuAllReduce::CpuAllReduce(int ranks)
    : ranks_(ranks), barrier_(ranks), inputs_(size_t(ranks)), out_(size_t(ranks)) {}

void CpuAllReduce::run(int rank, uint16_t* data, size_t count) {
  inputs_[size_t(rank)] = data;
  barrier_.arrive_and_wait();  // every rank's input is in place
  std::vector<uint16_t>& out = out_[size_t(rank)];
  out.resize(count);
  for (size_t i = 0; i < count; ++i) {
    float s = 0.0f;
    for (int r = 0; r < ranks_; ++r) s += bf16_to_float(inputs_[size_t(r)][i]);
    out[i] = float_to_bf16(s);
  }
  barrier_.arrive_and_wait();  // nobody still reads the inputs
  std::memcpy(data, out.data(), count * sizeof(uint16_t));
}

}  // namespace tetra::model::parallel
