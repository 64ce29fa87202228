#include "dist/nccl_communicators.h"

#include <set>

#include "core/cuda_check.h"
#include "dist/nccl_library.h"
#include "dist/rank_threads.h"

namespace tetra::dist {

void check_device_list(const std::vector<int>& devices, int visible_gpus) {
  if (devices.empty()) TETRA_FAIL("no GPUs given for the communicator");
  std::set<int> seen;
  for (int d : devices) {
    if (d < 0 || d >= visible_gpus)
      TETRA_FAIL("GPU ", d, " asked for, but this process sees ", visible_gpus, " GPU",
                 visible_gpus == 1 ? "" : "s", " (check CUDA_VISIBLE_DEVICES)");
    if (!seen.insert(d).second) TETRA_FAIL("GPU ", d, " listed twice; one rank per GPU");
  }
}

NcclCommunicators::NcclCommunicators(std::vector<int> devices) : devices_(std::move(devices)) {
  check_device_list(devices_, visible_gpu_count());
  disable_nvlink_multicast();
  const NcclApi& api = nccl();  // throws a clear error when NCCL is missing
  ncclUniqueId id;
  TETRA_NCCL_CHECK(api.get_unique_id(&id));
  comms_.assign(devices_.size(), nullptr);
  const int n = size();
  run_on_ranks(devices_, [&](int rank) {
    TETRA_NCCL_CHECK(api.comm_init_rank(&comms_[size_t(rank)], n, id, rank));
  });
}

NcclCommunicators::~NcclCommunicators() {
  if (!nccl_available()) return;
  for (size_t r = 0; r < comms_.size(); ++r) {
    if (comms_[r] == nullptr) continue;
    cudaSetDevice(devices_[r]);
    nccl().comm_destroy(comms_[r]);  // errors at teardown are not actionable
  }
}

void NcclCommunicators::all_reduce_bf16(int rank, const uint16_t* in, uint16_t* out, size_t count,
                                        cudaStream_t stream) const {
  TETRA_CHECK(rank >= 0 && rank < size(), "rank ", rank, " of ", size());
  TETRA_NCCL_CHECK(nccl().all_reduce(in, out, count, ncclBfloat16, ncclSum, comm(rank), stream));
}

}  // namespace tetra::dist
