// A model backend that runs one model over several ranks (tensor + expert parallel): it owns one
// backend per rank (a CudaModelOps on GPU r, or a CPU backend for the tests), one persistent
// thread per rank (dist/rank_workers.h) and the all-reduce between them, and implements the
// backend interface itself, so Model, Engine and the decode benchmark use it unchanged.
//
//   prepare(weights): each rank cuts its shard on its own thread (parallel/shard_weights.h) and
//   prepares its backend with it (the shard's owned copies are dropped afterwards: the backend
//   keeps what it uploaded).
//   A step's ops are recorded (the StepBatch is copied, so the caller's may die) and handed to
//   every rank at once when the step ends (logits()) or when anything needs a result
//   (read_logits, sample, synchronize, copy_kv_blocks, the next begin_step): one thread hand-off
//   per step, after which each rank issues the whole step on its own stream. Decode steps are
//   captured/replayed as CUDA graphs per rank exactly as on one GPU; the all-reduce calls (the
//   backend's hook -> dist::AllReduce, one-shot peer kernel or NCCL) are part of the graphs.
//   Logits, sampling: rank 0 (lm_head and embedding are replicated on every rank).
//
// Not supported: set_all_reduce_hook (this backend owns the all-reduce); per-op timing with CUDA
// events from the caller's thread (the ops run later, on the rank threads).
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "dist/allreduce.h"
#include "dist/sharding_plan.h"
#include "model/cuda/cuda_model_ops.h"
#include "perf/memory_fit.h"

namespace tetra::model::parallel {

struct ParallelOpsConfig {
  ParallelPlan plan;
  std::vector<int> devices;  // one GPU per rank, or empty: CPU ranks (tests)
  // Builds rank r's backend; called on rank r's thread (device current), before prepare.
  std::function<std::unique_ptr<ModelOps>(int rank)> make_rank;
  dist::ShardingOptions sharding;
  std::shared_ptr<void> keep_alive;  // what the rank backends' all-reduce hooks point into
  std::string name;                  // name() of the backend, e.g. "cuda"
};

// The cuda backend over GPUs 0 .. world-1 with dist::AllReduceGroup (one-shot below
// ar.one_shot_max_bytes, else NCCL). Throws tetra::Error when there are too few GPUs or the
// GPUs cannot reach each other.
std::unique_ptr<cuda::CudaModelOpsApi> make_parallel_cuda_model_ops(
    ParallelPlan plan, const dist::AllReduceConfig& ar = {});

// The cpu backend on `world` threads; the all-reduce sums the ranks' buffers in float32 in
// rank order and rounds to bf16 once (what the GPU one-shot kernel does).
std::unique_ptr<ModelOps> make_parallel_cpu_model_ops(ParallelPlan plan);

std::unique_ptr<cuda::CudaModelOpsApi> make_parallel_model_ops(ParallelOpsConfig cfg);

}  // namespace tetra::model::parallel
