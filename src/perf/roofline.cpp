#include "perf/roofline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "format/model_size.h"

namespace tetra {
namespace {

// Small-collective latency is an estimate, not a measurement: NCCL / custom all-reduce kernels
// on one NVLink node take on the order of 10 us for a few-KB message (launch, barrier, one hop);
// over PCIe through host bridges a few times that. --link-latency-us overrides it.
constexpr double kNvlinkLatencyS = 10e-6;
constexpr double kPcieLatencyS = 25e-6;
constexpr double kNetworkLatencyS = 30e-6;

double sum_bytes(const ModelSize& s, ModuleKind kind, bool active) {
  const auto& m = active ? s.active : s.total;
  const auto it = m.find(kind);
  return it == m.end() ? 0.0 : it->second.bytes;
}

// Ring all-reduce of `bytes` over n GPUs: each GPU sends and receives 2 (n-1)/n of the buffer.
double allreduce_seconds(double bytes, int n, const Interconnect& link) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * bytes / link.bytes_per_s + link.latency_s;
}

void validate(const ModelConfig& c, const GpuSpec& gpu, const RooflineOptions& o) {
  if (o.tp < 1 || o.ep < 1) TETRA_FAIL("tp and ep must be at least 1 (got tp ", o.tp, ", ep ", o.ep, ")");
  if (o.batch < 1) TETRA_FAIL("batch must be at least 1 (got ", o.batch, ")");
  if (o.context < 0) TETRA_FAIL("context must be 0 or more tokens (got ", o.context, ")");
  if (c.num_attention_heads % o.tp != 0)
    TETRA_FAIL("tp ", o.tp, " does not divide the ", c.num_attention_heads, " attention heads");
  const int hi = std::max(o.tp, o.ep), lo = std::min(o.tp, o.ep);
  if (hi % lo != 0)
    TETRA_FAIL("the larger of tp ", o.tp, " and ep ", o.ep, " must be a multiple of the smaller");
  if (c.n_routed_experts > 0 && c.n_routed_experts % o.ep != 0)
    TETRA_FAIL("ep ", o.ep, " does not divide the ", c.n_routed_experts, " routed experts");
  if (c.n_routed_experts == 0 && o.ep > 1) TETRA_FAIL("ep ", o.ep, " needs routed experts; the model has none");
  if (o.bandwidth_bytes_per_s < 0) TETRA_FAIL("bandwidth must be positive");
  if (o.bandwidth_bytes_per_s == 0 && gpu.bandwidth_bytes_per_s <= 0)
    TETRA_FAIL("GPU '", gpu.name, "' (", gpu.product, ") has no known memory bandwidth; give one");
  if (o.kv_element_bytes <= 0) TETRA_FAIL("KV element bytes must be positive");
}

}  // namespace

Interconnect interconnect_of(const GpuSpec& gpu) {
  const std::string& n = gpu.name;
  // Datasheet NVLink figures are both directions added; one direction is half.
  if (n == "h100" || n == "h200")
    return {"NVLink 4", 450e9, kNvlinkLatencyS,
            "NVIDIA H100/H200 datasheets: NVLink 900 GB/s per GPU (both directions) -> 450 GB/s"};
  if (n == "b200" || n == "b300" || n == "gb200")
    return {"NVLink 5", 900e9, kNvlinkLatencyS,
            "NVIDIA HGX B200/B300 and GB200 NVL72 datasheets: NVLink 1.8 TB/s per GPU (both "
            "directions) -> 900 GB/s"};
  if (n == "a100")
    return {"NVLink 3", 300e9, kNvlinkLatencyS,
            "NVIDIA A100 datasheet: NVLink 600 GB/s per GPU (both directions) -> 300 GB/s"};
  if (n == "rtx-pro-6000" || n == "rtx-5090")
    return {"PCIe 5.0 x16", 63e9, kPcieLatencyS,
            "no NVLink on RTX Blackwell; PCIe 5.0 x16: 32 GT/s x 16 lanes, 128b/130b -> 63 GB/s "
            "per direction (theoretical)"};
  if (n == "l40s")
    return {"PCIe 4.0 x16", 31.5e9, kPcieLatencyS,
            "no NVLink on L40S; PCIe 4.0 x16: 16 GT/s x 16 lanes, 128b/130b -> 31.5 GB/s per "
            "direction (theoretical)"};
  if (n == "dgx-spark")
    return {"ConnectX-7 200 Gb/s", 25e9, kNetworkLatencyS,
            "DGX Spark product page: ConnectX-7 at 200 Gb/s between two units -> 25 GB/s"};
  // A detected GPU: assume the usual link of its class.
  if (gpu.nvlink)
    return {"NVLink (assumed 4)", 450e9, kNvlinkLatencyS,
            "not a table GPU; NVLink 4 figure assumed (450 GB/s per direction)"};
  return {"PCIe 4.0 x16 (assumed)", 31.5e9, kPcieLatencyS,
          "not a table GPU; PCIe 4.0 x16 assumed (31.5 GB/s per direction)"};
}

double kv_read_bytes_per_sequence(const ModelConfig& c, int tp, int64_t context, double kv_element_bytes) {
  const double ctx = double(context);
  const bool sparse = c.index_topk > 0 && context > c.index_topk;  // DSA only matters past top-k
  double per_position_per_layer = 0;
  if (c.attention == AttentionKind::MLA) {
    // The latent + shared rope key; every head reads all of it, so no tp split.
    per_position_per_layer = double(c.kv_lora_rank + c.qk_rope_head_dim) * kv_element_bytes;
  } else {
    // K and V of this GPU's kv heads; tp beyond the kv heads replicates them (as memory_fit.h).
    const int64_t heads = std::max<int64_t>(1, c.num_key_value_heads / tp);
    per_position_per_layer = 2.0 * double(heads * c.head_dim) * kv_element_bytes;
  }
  const double positions = sparse ? double(c.index_topk) : ctx;
  double bytes = per_position_per_layer * positions * double(c.num_layers);
  if (sparse) {
    // Each indexer layer scores every position against its index key cache.
    for (int64_t layer = 0; layer < c.num_layers; ++layer)
      if (c.layer_has_indexer(layer)) bytes += double(c.index_head_dim) * kv_element_bytes * ctx;
  }
  return bytes;
}

DecodeRoofline decode_roofline(const ModelConfig& c, const QuantConfig& quant, const GpuSpec& gpu,
                               const RooflineOptions& opts) {
  validate(c, gpu, opts);
  DecodeRoofline r;
  r.gpu = gpu.name;
  r.options = opts;
  const Interconnect link = interconnect_of(gpu);
  if (r.options.bandwidth_bytes_per_s == 0) r.options.bandwidth_bytes_per_s = gpu.bandwidth_bytes_per_s;
  if (r.options.link_bytes_per_s <= 0) r.options.link_bytes_per_s = link.bytes_per_s;
  if (r.options.link_latency_s < 0) r.options.link_latency_s = link.latency_s;
  const Interconnect used{link.name, r.options.link_bytes_per_s, r.options.link_latency_s, link.source};
  const RooflineOptions& o = r.options;

  const int tp = o.tp;
  r.world = std::max(o.tp, o.ep);
  const int dp = r.world / tp;  // attention groups, each running its share of the batch
  const int64_t seqs = (o.batch + dp - 1) / dp;
  r.sequences_per_gpu = seqs;
  const double bw = o.bandwidth_bytes_per_s;

  // Weight bytes by kind come from model_size (the same count memory planning uses).
  const ModelSize size = model_size(c, quant);
  auto add = [&](std::string name, double bytes, std::string formula) {
    r.parts.push_back({std::move(name), false, bytes, bytes / bw, std::move(formula)});
  };
  add("attention", sum_bytes(size, ModuleKind::Attention, true) / tp,
      "all attention projection weights / tp");
  if (c.index_n_heads > 0) {
    const bool runs = c.index_topk > 0 && o.context > c.index_topk;
    add("indexer", runs ? sum_bytes(size, ModuleKind::Indexer, true) : 0.0,
        "DSA indexer weights, replicated (as memory_fit.h); 0 while context <= index_topk "
        "(every key is kept, the indexer can be skipped)");
  }
  if (c.num_dense_layers() > 0)
    add("dense_mlp", sum_bytes(size, ModuleKind::DenseMlp, true) / tp, "dense MLP weights / tp");
  if (c.n_routed_experts > 0) {
    const double E = double(c.n_routed_experts), k = double(c.num_experts_per_tok);
    const double touched = 1.0 - std::pow(1.0 - k / E, double(o.batch));
    r.unique_experts_per_layer = E * touched;
    add("routed_experts", sum_bytes(size, ModuleKind::RoutedExpert, false) / r.world * touched,
        "all routed expert weights / world * (1 - (1 - k/E)^batch)");
    if (c.n_shared_experts > 0)
      add("shared_experts", sum_bytes(size, ModuleKind::SharedExpert, true) / tp,
          "shared expert weights / tp");
    add("router", sum_bytes(size, ModuleKind::Router, true), "router weights (+ bias), replicated");
  }
  add("norms", sum_bytes(size, ModuleKind::Norm, true), "RMSNorm weights, replicated");
  const double table = sum_bytes(size, ModuleKind::Embedding, false);
  if (c.tie_word_embeddings) {
    add("embedding+lm_head", table / tp, "tied table read in full as lm_head / tp");
  } else {
    const double rows = double(std::min<int64_t>(seqs, c.vocab_size));
    add("embedding", table / double(c.vocab_size) * rows / tp,
        "one table row per sequence / tp (vocab-parallel rows)");
    add("lm_head", sum_bytes(size, ModuleKind::LmHead, true) / tp, "all of lm_head / tp");
  }
  add("kv_cache", double(seqs) * kv_read_bytes_per_sequence(c, tp, o.context, o.kv_element_bytes),
      "sequences per GPU * KV bytes one sequence reads at this context");

  for (const RooflinePart& p : r.parts) r.memory_bytes += p.bytes;
  r.memory_seconds = r.memory_bytes / bw;

  // Communication. Hidden states travel as BF16: [tokens, hidden] * 2 bytes.
  const double hidden_bytes = double(seqs) * double(c.hidden_size) * 2.0;
  auto add_comm = [&](std::string name, double bytes, double seconds, std::string formula,
                      int64_t layers) {
    r.parts.push_back({std::move(name), true, bytes, seconds, std::move(formula), layers});
    r.comm_bytes += bytes;
    r.comm_seconds += seconds;
    r.comm_bytes_per_layer += r.parts.back().bytes_per_layer();
    r.comm_seconds_per_layer += r.parts.back().seconds_per_layer();
  };
  if (tp > 1) {
    // Row-parallel o_proj and down_proj (or the MoE combine) each end in one all-reduce.
    const double calls = 2.0 * double(c.num_layers);
    add_comm("tp_allreduce", calls * 2.0 * (tp - 1) / tp * hidden_bytes,
             calls * allreduce_seconds(hidden_bytes, tp, used),
             "2 per layer: ring all-reduce of seqs * hidden * 2 B over tp: 2 (tp-1)/tp * bytes / "
             "link + latency",
             c.num_layers);
  }
  if (dp > 1 && c.n_routed_experts > 0) {
    // Data-parallel attention feeding expert-parallel MoE: each token goes to the other GPUs
    // that hold at least one of its k experts, and its results come back (dispatch + combine).
    // Under uniform routing a given other GPU holds one of them with probability
    // 1 - (1 - 1/ep)^k. The tp ranks of a group share the sending.
    const double ep = double(o.ep), k = double(c.num_experts_per_tok);
    const double remote_gpus = (ep - 1.0) * (1.0 - std::pow(1.0 - 1.0 / ep, k));
    const double sent = hidden_bytes / tp * remote_gpus;  // one direction, one all-to-all
    const int64_t layers = c.num_moe_layers();
    const double seconds_each = sent / used.bytes_per_s + used.latency_s;
    add_comm("ep_dispatch_combine", 2.0 * double(layers) * sent, 2.0 * double(layers) * seconds_each,
             "2 all-to-alls per MoE layer: seqs/tp * hidden * 2 B * (ep-1)(1-(1-1/ep)^k) remote "
             "GPUs / link + latency",
             layers);
  }
  r.step_seconds = r.memory_seconds + r.comm_seconds;
  return r;
}

nlohmann::json decode_roofline_to_json(const DecodeRoofline& r) {
  nlohmann::json j;
  j["gpu"] = r.gpu;
  const RooflineOptions& o = r.options;
  j["tp"] = o.tp;
  j["ep"] = o.ep;
  j["world"] = r.world;
  j["batch"] = o.batch;
  j["context"] = o.context;
  j["sequences_per_gpu"] = r.sequences_per_gpu;
  j["bandwidth_bytes_per_s"] = o.bandwidth_bytes_per_s;
  j["link_bytes_per_s"] = o.link_bytes_per_s;
  j["link_latency_s"] = o.link_latency_s;
  j["kv_element_bytes"] = o.kv_element_bytes;
  j["unique_experts_per_layer"] = r.unique_experts_per_layer;
  nlohmann::json parts = nlohmann::json::array();
  for (const RooflinePart& p : r.parts) {
    nlohmann::json part = {{"name", p.name},
                           {"kind", p.communication ? "communication" : "memory"},
                           {"bytes", p.bytes},
                           {"seconds", p.seconds},
                           {"share", r.step_seconds > 0 ? p.seconds / r.step_seconds : 0.0},
                           {"formula", p.formula}};
    if (p.communication) {
      part["layers"] = p.layers;
      part["bytes_per_layer"] = p.bytes_per_layer();
      part["seconds_per_layer"] = p.seconds_per_layer();
    }
    parts.push_back(std::move(part));
  }
  j["parts"] = parts;
  j["memory_bytes"] = r.memory_bytes;
  j["memory_seconds"] = r.memory_seconds;
  j["comm_bytes"] = r.comm_bytes;
  j["comm_seconds"] = r.comm_seconds;
  j["comm_bytes_per_layer"] = r.comm_bytes_per_layer;
  j["comm_seconds_per_layer"] = r.comm_seconds_per_layer;
  j["step_seconds"] = r.step_seconds;
  j["per_token_seconds"] = r.step_seconds;
  j["tokens_per_s"] = r.tokens_per_s();
  return j;
}

std::string decode_roofline_table(const DecodeRoofline& r) {
  const RooflineOptions& o = r.options;
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line,
                "decode roofline on %s: tp %d, ep %d (%d GPUs), batch %lld, context %lld\n",
                r.gpu.c_str(), o.tp, o.ep, r.world, static_cast<long long>(o.batch),
                static_cast<long long>(o.context));
  os << line;
  std::snprintf(line, sizeof line, "HBM %.3g TB/s, link %.3g GB/s + %.3g us per collective\n",
                o.bandwidth_bytes_per_s / 1e12, o.link_bytes_per_s / 1e9, o.link_latency_s * 1e6);
  os << line;
  if (r.unique_experts_per_layer > 0) {
    std::snprintf(line, sizeof line, "unique experts per MoE layer: %.2f\n", r.unique_experts_per_layer);
    os << line;
  }
  std::snprintf(line, sizeof line, "%-22s %16s %12s %8s\n", "part", "bytes/GPU", "us", "%");
  os << line;
  for (const RooflinePart& p : r.parts) {
    std::snprintf(line, sizeof line, "%-22s %16.0f %12.2f %7.1f%%", p.name.c_str(), p.bytes,
                  p.seconds * 1e6, r.step_seconds > 0 ? 100.0 * p.seconds / r.step_seconds : 0.0);
    os << line;
    if (p.communication) {
      std::snprintf(line, sizeof line, "  per layer %.0f B, %.2f us (%lld layers)",
                    p.bytes_per_layer(), p.seconds_per_layer() * 1e6,
                    static_cast<long long>(p.layers));
      os << line;
    }
    os << "\n";
  }
  std::snprintf(line, sizeof line, "%-22s %16.0f %12.2f\n", "memory total", r.memory_bytes,
                r.memory_seconds * 1e6);
  os << line;
  if (r.comm_seconds > 0) {
    std::snprintf(line, sizeof line, "%-22s %16.0f %12.2f\n", "communication total", r.comm_bytes,
                  r.comm_seconds * 1e6);
    os << line;
    std::snprintf(line, sizeof line, "%-22s %16.0f %12.2f  (a layer with every collective)\n",
                  "communication/layer", r.comm_bytes_per_layer, r.comm_seconds_per_layer * 1e6);
    os << line;
  }
  std::snprintf(line, sizeof line,
                "per-token floor %.3f ms (step time), ceiling %.1f tokens/s for the batch\n",
                r.step_seconds * 1e3, r.tokens_per_s());
  os << line;
  return os.str();
}

}  // namespace tetra
