// `tetra bench allreduce`: latency of the one-shot peer-memory all-reduce against NCCL's, per
// message size, on the first `gpus` GPUs of this machine (one thread per GPU).
//
// Method, per size and path: a host barrier lines the ranks up; eager = 20 back-to-back calls
// between two CUDA events on rank 0's stream (launch cost included), graph = the same 20 calls
// captured once in a CUDA graph and replayed (how a decode step runs them); each repeated `reps`
// times after warm-up, per-call time = median over the repetitions / 20. Before timing, both paths
// run once on fresh random data and are compared with the CPU twin (one-shot: bit-exact; NCCL:
// within one bf16 ulp).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tetra::dist {

struct AllReduceBenchOptions {
  std::vector<size_t> sizes_bytes;  // message sizes (multiples of 2: bf16 values)
  int gpus = 2;
  int reps = 50;
  int calls_per_rep = 20;
  int blocks = 32, threads = 512;   // one-shot kernel grid
  bool push = false;                // one-shot variant (PeerAllReduceOptions::push)
  std::string command_line;
};

struct AllReduceBenchRow {
  size_t bytes = 0;
  double one_shot_eager_us = 0, nccl_eager_us = 0;
  double one_shot_graph_us = 0, nccl_graph_us = -1;  // -1: NCCL graph capture failed
  bool one_shot_exact = false;   // equal to the CPU twin on every rank
  int nccl_max_ulp = 0;          // largest distance of NCCL's result from the CPU twin
};

struct AllReduceBenchReport {
  std::string date, commit, gpu, nccl_version, command;
  int gpus = 0, blocks = 0, threads = 0, reps = 0, calls_per_rep = 0;
  bool push = false;
  std::vector<AllReduceBenchRow> rows;
  // Largest size at which the one-shot graph time beats NCCL's graph time (0 when never).
  size_t crossover_bytes = 0;
};

// "2K..1M" (powers of two from 2 KiB to 1 MiB), "4096,64K,1M" or a mix; K and M are binary.
// Refuses odd byte counts, zero, reversed ranges and unknown suffixes with the bad piece named.
std::vector<size_t> parse_byte_sizes(const std::string& text);

// "2K", "1M", "3000" (exact powers of 1024 get a suffix).
std::string format_bytes(size_t bytes);

// Needs opts.gpus GPUs with peer access and NCCL; throws tetra::Error naming what is missing.
AllReduceBenchReport run_allreduce_bench(const AllReduceBenchOptions& opts);

std::string allreduce_bench_markdown(const AllReduceBenchReport& r);
nlohmann::json allreduce_bench_json(const AllReduceBenchReport& r);

}  // namespace tetra::dist
