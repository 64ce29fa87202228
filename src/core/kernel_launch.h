// A kernel launch with an optional programmatic dependent launch (SM90 PDL): the grid may be
// scheduled while the previous kernel in the stream drains, hiding its launch latency behind that
// tail. A kernel launched with pdl must wait (griddepcontrol.wait) before it reads anything its
// predecessor writes.
//   KernelLaunch launch(grid, block, stream);   // pdl on
//   return launch(my_kernel<8>, args...);
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

namespace tetra {

class KernelLaunch {
 public:
  KernelLaunch(dim3 grid, dim3 block, cudaStream_t stream, bool pdl = true, size_t smem = 0) {
    attr_[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr_[0].val.programmaticStreamSerializationAllowed = 1;
    cfg_.gridDim = grid;
    cfg_.blockDim = block;
    cfg_.dynamicSmemBytes = smem;
    cfg_.stream = stream;
    cfg_.attrs = pdl ? attr_ : nullptr;
    cfg_.numAttrs = pdl ? 1 : 0;
  }
  // cfg_ points into attr_: the object stays where it was made.
  KernelLaunch(const KernelLaunch&) = delete;
  KernelLaunch& operator=(const KernelLaunch&) = delete;

  template <typename... Params, typename... Args>
  cudaError_t operator()(void (*kernel)(Params...), Args&&... args) const {
    return cudaLaunchKernelEx(&cfg_, kernel, std::forward<Args>(args)...);
  }

 private:
  cudaLaunchAttribute attr_[1] = {};
  cudaLaunchConfig_t cfg_ = {};
};

}  // namespace tetra
