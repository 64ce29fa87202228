// The decode roofline: how long one decode step must take at least, from the bytes every GPU
// has to read (weights by kind + KV cache) over its HBM bandwidth, plus an estimate of the
// GPU-to-GPU communication. The "theoretical floor" of DESIGN.md and MODELS.md ("Per-token
// bytes"), for any model, GPU, parallel split, batch and context.
//
// Model of one decode step (every number per GPU; the busiest GPU sets the step time):
//   world = max(tp, ep) GPUs. Attention, dense MLPs, shared experts, embedding and lm_head are
//   split tp ways (as memory_fit.h splits them); routed experts world ways. When tp < world the
//   batch is split over dp = world / tp attention groups (data-parallel attention), each GPU
//   running ceil(batch / dp) sequences.
//   Routed experts: under uniform routing a layer's expert is touched by at least one of B tokens
//   with probability p = 1 - (1 - k/E)^B, so the expected unique experts are E * p and a GPU reads
//   p of its expert shard (MODELS.md: count UNIQUE experts at batch B).
//   Memory time = bytes / bandwidth; communication is added, not overlapped (a floor for the
//   memory part, an estimate for the rest). Per-token latency = step time (the batch's tokens
//   decode together); tokens/s = batch / step time.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/model_config.h"
#include "format/quant_config.h"
#include "perf/gpu_spec.h"

namespace tetra {

struct RooflineOptions {
  int tp = 1, ep = 1;
  int64_t batch = 1;     // sequences decoding together
  int64_t context = 0;   // tokens already in each sequence's KV cache
  double bandwidth_bytes_per_s = 0;  // HBM; 0 = the GPU table's value
  double link_bytes_per_s = 0;       // GPU-to-GPU, one direction; 0 = interconnect_of(gpu)
  double link_latency_s = -1;        // per collective; < 0 = interconnect_of(gpu)
  double kv_element_bytes = 2;       // BF16 cache (what runtime/kv_cache.h stores)
};

// The GPU-to-GPU link a table GPU usually has, one direction, with its source.
struct Interconnect {
  std::string name;        // "NVLink 4", "PCIe 5.0 x16", ...
  double bytes_per_s = 0;  // one direction, per GPU
  double latency_s = 0;    // one small collective (all-reduce / all-to-all launch + sync)
  std::string source;
};
Interconnect interconnect_of(const GpuSpec& gpu);

// One line of the breakdown. Memory parts read HBM; communication parts move bytes over the link.
struct RooflinePart {
  std::string name;     // "attention", "routed_experts", "kv_cache", "tp_allreduce", ...
  bool communication = false;
  double bytes = 0;     // per GPU per decode step
  double seconds = 0;
  std::string formula;  // how the bytes were counted (printed with --json)
  int64_t layers = 0;   // communication: the layers it happens in, the same in each; 0 for memory
  double bytes_per_layer() const { return layers > 0 ? bytes / double(layers) : 0; }
  double seconds_per_layer() const { return layers > 0 ? seconds / double(layers) : 0; }
};

struct DecodeRoofline {
  std::string gpu;  // table key
  RooflineOptions options;  // as given, with the defaults resolved
  int world = 1;
  int64_t sequences_per_gpu = 1;       // ceil(batch / dp)
  double unique_experts_per_layer = 0;  // E * (1 - (1 - k/E)^batch); 0 for a dense model
  std::vector<RooflinePart> parts;      // memory parts first, then communication
  double memory_bytes = 0, memory_seconds = 0;
  double comm_bytes = 0, comm_seconds = 0;
  // One layer that has every collective (a MoE layer when experts are exchanged): the sum of
  // the communication parts' per-layer figures.
  double comm_bytes_per_layer = 0, comm_seconds_per_layer = 0;
  double step_seconds = 0;  // = per-token latency
  double tokens_per_s() const { return step_seconds > 0 ? double(options.batch) / step_seconds : 0; }
};

// Error (a user-facing tetra::Error) when tp/ep/batch/context are out of range, tp does not
// divide the attention heads, ep does not divide the routed experts, the larger of tp and ep
// is not a multiple of the smaller, or the GPU has no known bandwidth and none is given.
DecodeRoofline decode_roofline(const ModelConfig&, const QuantConfig&, const GpuSpec&,
                               const RooflineOptions&);

// The KV cache bytes one sequence at `context` tokens reads in one decode step, on one GPU:
// GQA 2 * kv_heads/tp (at least 1) * head_dim * element bytes per position per layer; MLA
// (kv_lora_rank + qk_rope_head_dim) * element bytes per position per layer, not split by tp;
// with a DSA indexer past index_topk tokens, attention reads only index_topk positions and each
// indexer layer reads index_head_dim * element bytes at every position.
double kv_read_bytes_per_sequence(const ModelConfig&, int tp, int64_t context,
                                  double kv_element_bytes);

nlohmann::json decode_roofline_to_json(const DecodeRoofline&);
// The human table: part, bytes, microseconds, share of the step (communication parts also per
// layer); then the totals, communication per layer, and tokens/s.
std::string decode_roofline_table(const DecodeRoofline&);

}  // namespace tetra
