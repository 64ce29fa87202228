#include "dist/allreduce.h"

#include "core/cuda_check.h"
#include "dist/rank_threads.h"

namespace tetra::dist {

std::string_view all_reduce_path_name(AllReducePath p) {
  switch (p) {
    case AllReducePath::Copy: return "copy";
    case AllReducePath::OneShot: return "one-shot";
    case AllReducePath::Nccl: return "nccl";
  }
  return "?";
}

AllReducePath choose_all_reduce_path(size_t bytes, int world, const AllReduceConfig& cfg) {
  if (world == 1) return AllReducePath::Copy;  // nothing to sum with
  if (bytes <= cfg.one_shot_max_bytes) return AllReducePath::OneShot;
  if (cfg.use_nccl) return AllReducePath::Nccl;
  TETRA_FAIL("all-reduce of ", bytes, " bytes is above the one-shot limit (",
             cfg.one_shot_max_bytes, " bytes) and NCCL is off");
}

AllReduceGroup::AllReduceGroup(std::vector<int> devices, AllReduceConfig cfg)
    : devices_(std::move(devices)), cfg_(cfg) {
  check_device_list(devices_, visible_gpu_count());
  if (cfg_.peer.max_bytes < cfg_.one_shot_max_bytes) cfg_.peer.max_bytes = cfg_.one_shot_max_bytes;
  if (size() > 1 && cfg_.use_nccl) nccl_ = std::make_unique<NcclCommunicators>(devices_);
  if (size() > 1 && cfg_.one_shot_max_bytes > 0)
    peer_ = std::make_unique<PeerAllReduce>(devices_, cfg_.peer);
  for (int r = 0; r < size(); ++r) ranks_.push_back(AllReduce(this, r));
}

void AllReduce::run(const uint16_t* in, uint16_t* out, size_t count, cudaStream_t stream) {
  AllReduceGroup& g = *group_;
  switch (choose_all_reduce_path(count * sizeof(uint16_t), g.size(), g.cfg_)) {
    case AllReducePath::Copy:
      if (in != out && count > 0)
        TETRA_CUDA_CHECK(cudaMemcpyAsync(out, in, count * sizeof(uint16_t),
                                         cudaMemcpyDeviceToDevice, stream));
      return;
    case AllReducePath::OneShot: g.peer_->run(rank_, in, out, count, stream); return;
    case AllReducePath::Nccl: g.nccl_->all_reduce_bf16(rank_, in, out, count, stream); return;
  }
}

}  // namespace tetra::dist
