// One NCCL communicator per GPU of this process (rank i drives devices[i]). Created together,
// each rank's ncclCommInitRank on its own thread (they block until all ranks join).
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tetra::dist {

class NcclCommunicators {
 public:
  // Throws tetra::Error when NCCL cannot be loaded, a device id is out of range or repeated.
  explicit NcclCommunicators(std::vector<int> devices);
  ~NcclCommunicators();
  NcclCommunicators(const NcclCommunicators&) = delete;
  NcclCommunicators& operator=(const NcclCommunicators&) = delete;

  int size() const { return int(devices_.size()); }
  int device(int rank) const { return devices_[size_t(rank)]; }
  ncclComm_t comm(int rank) const { return comms_[size_t(rank)]; }

  // Sum over ranks of `count` bf16 values (NCCL accumulates in float, rounds to bf16). Call from
  // rank's own thread with a stream of device(rank); in may equal out.
  void all_reduce_bf16(int rank, const uint16_t* in, uint16_t* out, size_t count,
                       cudaStream_t stream) const;

 private:
  std::vector<int> devices_;
  std::vector<ncclComm_t> comms_;  // [size()]
};

// Refuses an empty list, ids outside [0, visible GPUs) and repeats, naming what is wrong.
void check_device_list(const std::vector<int>& devices, int visible_gpus);

}  // namespace tetra::dist
