// The all-reduce the model calls after row-split layers: one object per rank, `run` sums a bf16
// vector over all ranks. Small messages take the one-shot peer-memory kernel (one launch, no
// NCCL protocol overhead), larger ones NCCL. Both paths are CUDA-graph capturable.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "dist/nccl_communicators.h"
#include "dist/peer_allreduce.h"

namespace tetra::dist {

// On 2 H200s (NVLink) the one-shot kernel beat NCCL at every size measured, 2 KB to 4 MB
// (bench/results/2026-11-29-allreduce-h200x2*.md). It reads (ranks - 1) copies of the message, so
// its edge shrinks with more GPUs: 1 MB is a conservative limit, not measured beyond 2 GPUs.
constexpr size_t kDefaultOneShotMaxBytes = size_t(1) << 20;

struct AllReduceConfig {
  size_t one_shot_max_bytes = kDefaultOneShotMaxBytes;  // 0 = always NCCL
  bool use_nccl = true;  // false: one-shot only, larger messages are an error
  PeerAllReduceOptions peer;  // peer.max_bytes is raised to one_shot_max_bytes when smaller
};

enum class AllReducePath { Copy, OneShot, Nccl };
std::string_view all_reduce_path_name(AllReducePath p);  // "copy", "one-shot", "nccl"

// Which path a message of `bytes` takes in a group of `world` ranks; throws tetra::Error when
// no path can carry it (too big for one-shot and NCCL off).
AllReducePath choose_all_reduce_path(size_t bytes, int world, const AllReduceConfig& cfg);

class AllReduceGroup;

class AllReduce {
 public:
  // out = sum over ranks of in (count bf16). Call on this rank's thread with its GPU current,
  // the same counts in the same order on every rank. in may equal out.
  void run(const uint16_t* in, uint16_t* out, size_t count, cudaStream_t stream);
  int rank() const { return rank_; }

 private:
  friend class AllReduceGroup;
  AllReduce(AllReduceGroup* group, int rank) : group_(group), rank_(rank) {}
  AllReduceGroup* group_;
  int rank_;
};

// Owns the NCCL communicators and the peer buffers of every GPU of this process.
class AllReduceGroup {
 public:
  AllReduceGroup(std::vector<int> devices, AllReduceConfig cfg = {});
  AllReduceGroup(const AllReduceGroup&) = delete;
  AllReduceGroup& operator=(const AllReduceGroup&) = delete;

  int size() const { return int(devices_.size()); }
  AllReduce& rank(int r) { return ranks_[size_t(r)]; }
  const AllReduceConfig& config() const { return cfg_; }
  PeerAllReduce* peer() { return peer_.get(); }          // null when one-shot is off
  NcclCommunicators* nccl() { return nccl_.get(); }      // null when NCCL is off

 private:
  friend class AllReduce;
  std::vector<int> devices_;
  AllReduceConfig cfg_;
  std::unique_ptr<NcclCommunicators> nccl_;
  std::unique_ptr<PeerAllReduce> peer_;
  std::vector<AllReduce> ranks_;  // [size()]
};

}  // namespace tetra::dist
