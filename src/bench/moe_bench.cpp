// `tetra bench moe` (see moe_bench.h for the method).
#include "bench/moe_bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <ctime>
#include <iomanip>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/version.h"
#include "format/model_config.h"
#include "moe/backend_caps.h"
#include "moe/expert_weights.h"
#include "moe/moe_layer.h"
#include "ops/moe/moe_layer_cuda.h"
#include "perf/gpu_spec.h"
#include "perf/memory_fit.h"

namespace tetra::bench {
namespace {

constexpr double kL2Bytes = 60e6;             // H200 L2 (50 MB usable of 60): rotate beyond it
constexpr double kFallbackBandwidth = 4.46e12;  // DEVICE.md measured H200 HBM read
constexpr double kFallbackTflops = 785;         // DEVICE.md measured H200 bf16 GEMM

struct Shape {
  int E = 0, H = 0, I = 0, Is = 0, K = 0;
  moe::RouterParams router;
  bool has_bias = false;
};

Shape preset_shape(const std::string& preset) {
  const ModelConfig c = preset_config(preset);
  if (c.n_routed_experts <= 0 || c.num_moe_layers() == 0)
    TETRA_FAIL("preset '", preset, "' has no MoE layer");
  Shape s;
  s.E = int(c.n_routed_experts);
  s.H = int(c.hidden_size);
  s.I = int(c.moe_intermediate_size);
  s.Is = int(c.n_shared_experts * c.moe_intermediate_size);
  s.K = int(c.num_experts_per_tok);
  s.router = moe::router_params_of(c);
  s.has_bias = c.routing.has_correction_bias;
  return s;
}

// Fake bf16 in [-2, 2) from a hash: activations of the benchmark (values do not matter for
// speed; they only decide the routing, which must differ between buffers).
void fill_x(std::vector<uint16_t>& v, uint32_t seed) {
  uint32_t h = seed * 0x9E3779B1u + 1;
  for (auto& x : v) {
    h ^= h << 13, h ^= h >> 17, h ^= h << 5;
    x = uint16_t((h & 0x8000u) | ((126u + ((h >> 8) & 1u)) << 7) | (h & 0x7fu));
  }
}

// Input buffers of a T-token row: enough that the experts they route to, and the inputs themselves,
// cannot stay in the L2 between visits; 4 to 16.
int input_buffers(int T, int H) {
  const double bytes = 2.0 * T * H;  // one [T, H] bf16 buffer
  return int(std::clamp(std::ceil(2.5 * kL2Bytes / bytes), 4.0, 16.0));
}

// `experts` routed experts, the shared expert and the bf16 router weight in `backend`'s format.
double weight_bytes(const Shape& s, const std::string& backend, double experts) {
  const bool bf16 = backend == "cuda-bf16";
  return experts * double(expert_mlp_bytes(bf16, s.H, s.I)) +
         (s.Is > 0 ? double(expert_mlp_bytes(bf16, s.H, s.Is)) : 0.0) + 2.0 * s.E * s.H;
}

// See moe_bench_bytes: the weights read, x [T, H] read and out [T, H] written (bf16).
double layer_bytes(const Shape& s, const std::string& backend, double unique, int T) {
  return weight_bytes(s, backend, unique) + 2.0 * 2.0 * T * s.H;
}

// The workload `backend` is judged on: this preset's layer in that backend's format (NVFP4 with
// input scales for cuda-w4a4, a W4A4 checkpoint; BF16 for cuda-bf16; else W4A16 NVFP4).
MoeWorkload bench_workload(const Shape& s, const MoeBenchOptions& o, const std::string& backend) {
  moe::MoeLayerWeights probe;  // formats only; no data read
  probe.name = o.preset;
  probe.hidden = s.H;
  probe.inter = s.I;
  probe.router = s.router;
  probe.experts.resize(size_t(s.E));
  for (moe::ExpertMlpView& e : probe.experts) {
    if (backend == "cuda-bf16") e.format = moe::ExpertFormat::BF16;
    if (backend == "cuda-w4a4") e.gate.input_scale = e.up.input_scale = e.down.input_scale = 1.0f;
  }
  moe::MoeLayerOptions lo;
  lo.max_tokens = *std::max_element(o.tokens.begin(), o.tokens.end());
  return moe::layer_workload(probe, lo);
}

// GPU memory the benchmark holds for `backend` at its largest row: the layer's weights (routed
// experts, the shared expert, the router), its scratch for max_tokens (as CudaMoeLayer sizes it,
// bounded above: rows of pairs and shared slot, each with bf16 activations, f32 outputs and bf16
// reordered or quantized x; logits; the shared expert's own rows) and the row's input and output
// buffers.
struct BenchMemory {
  double weights = 0, scratch = 0;
};
BenchMemory bench_memory(const Shape& s, const std::string& backend, const std::vector<int>& tokens) {
  BenchMemory m;
  m.weights = weight_bytes(s, backend, s.E);
  const double T = *std::max_element(tokens.begin(), tokens.end());
  const double rows = T * (s.K + 1);
  m.scratch = rows * (2.0 * s.I + 4.0 * s.H + 2.0 * s.H) + T * (4.0 * s.E + 2.0 * s.Is + 2.0 * s.H);
  double inputs = 0;
  for (int t : tokens) inputs = std::max(inputs, input_buffers(t, s.H) * 2 * 2.0 * t * s.H);
  m.scratch += inputs;
  return m;
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5));
  return v[i];
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::ostringstream os;
  os << std::put_time(&tm, "%Y-%m-%dT%H:%M:%SZ");
  return os.str();
}

struct DeviceBuffers {  // nbuf input/output buffers of [T, H] bf16
  std::vector<uint16_t*> x, out;
  ~DeviceBuffers() {
    for (auto* p : x) cudaFree(p);
    for (auto* p : out) cudaFree(p);
  }
};

struct Events {
  std::vector<cudaEvent_t> ev;
  explicit Events(size_t n) : ev(n) {
    for (auto& e : ev) TETRA_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~Events() {
    for (auto& e : ev) cudaEventDestroy(e);
  }
  float ms(size_t a, size_t b) const {
    float t = 0;
    TETRA_CUDA_CHECK(cudaEventElapsedTime(&t, ev[a], ev[b]));
    return t;
  }
};

struct Graph {
  cudaGraphExec_t exec = nullptr;
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    if (exec) cudaGraphExecDestroy(exec);
  }
};

// One backend's rows on a random layer in its format: cuda-w4a16 (NVFP4 experts), cuda-w4a4 (the
// same with NVFP4 activations) or cuda-bf16 (BF16 experts).
void bench_random_layer(const Shape& s, const MoeBenchOptions& o, const GpuSpec& gpu,
                        const std::string& backend, MoeBenchReport& r) {
  int max_t = 0;
  for (int t : o.tokens) max_t = std::max(max_t, t);
  moe::RandomMoeLayer spec;
  spec.w4a4 = backend == "cuda-w4a4";
  spec.bf16 = backend == "cuda-bf16";
  spec.experts = s.E, spec.hidden = s.H, spec.inter = s.I, spec.shared_inter = s.Is;
  spec.router = s.router;
  if (s.has_bias || o.routing == "skewed") {
    spec.bias.assign(size_t(s.E), 0.0f);
    if (o.routing == "skewed")
      for (int e = 0; e < s.E; e += 8) spec.bias[size_t(e)] = 0.2f;
  }
  const moe::CudaTokenPath path = moe::cuda_token_path_from_env();
  r.token_path = moe::cuda_token_path_label(path);
  moe::CudaW4a16MoeLayer layer(spec, max_t, TokenLayout::Contiguous, path);
  cudaStream_t stream;
  TETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double bw = gpu.bandwidth_bytes_per_s > 0 ? gpu.bandwidth_bytes_per_s : kFallbackBandwidth;
  const double peak = (gpu.bf16_dense_tflops > 0 ? gpu.bf16_dense_tflops : kFallbackTflops) * 1e12;

  for (int T : o.tokens) {
    const size_t n = size_t(T) * s.H;
    const int nbuf = input_buffers(T, s.H);
    DeviceBuffers buf;
    std::vector<uint16_t> host(n);
    for (int b = 0; b < nbuf; ++b) {
      uint16_t *x, *out;
      TETRA_CUDA_MALLOC(&x, n * 2);
      TETRA_CUDA_MALLOC(&out, n * 2);
      buf.x.push_back(x), buf.out.push_back(out);
      fill_x(host, uint32_t(1000 * T + b));
      TETRA_CUDA_CHECK(cudaMemcpy(x, host.data(), n * 2, cudaMemcpyHostToDevice));
    }
    // Eager pass per buffer: routing -> unique experts; outputs must be finite.
    double unique = 0;
    for (int b = 0; b < nbuf; ++b) {
      layer.forward(buf.x[size_t(b)], T, buf.out[size_t(b)], nullptr, stream);
      TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
      const std::vector<int32_t> ids = layer.last_ids(T);
      unique += double(std::set<int32_t>(ids.begin(), ids.end()).size());
      TETRA_CUDA_CHECK(cudaMemcpy(host.data(), buf.out[size_t(b)], n * 2, cudaMemcpyDeviceToHost));
      for (uint16_t v : host)
        if ((v & 0x7f80u) == 0x7f80u) TETRA_FAIL("bench moe: non-finite output at T=", T);
    }
    unique /= nbuf;
    if (layer.dropped_pairs() != 0) TETRA_FAIL("bench moe: the layout dropped pairs at T=", T);

    // One graph per buffer: what a decode loop replays.
    std::vector<Graph> graphs(static_cast<size_t>(nbuf));
    for (int b = 0; b < nbuf; ++b) {
      cudaGraph_t g;
      TETRA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      layer.forward(buf.x[size_t(b)], T, buf.out[size_t(b)], nullptr, stream);
      TETRA_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
      TETRA_CUDA_CHECK(cudaGraphInstantiate(&graphs[size_t(b)].exec, g, 0));
      cudaGraphDestroy(g);
    }
    // Warm-up and a first estimate for the iteration count.
    Events probe(2);
    TETRA_CUDA_CHECK(cudaEventRecord(probe.ev[0], stream));
    for (int i = 0; i < 2 * nbuf; ++i) TETRA_CUDA_CHECK(cudaGraphLaunch(graphs[size_t(i % nbuf)].exec, stream));
    TETRA_CUDA_CHECK(cudaEventRecord(probe.ev[1], stream));
    TETRA_CUDA_CHECK(cudaEventSynchronize(probe.ev[1]));
    const double est_us = 1e3 * probe.ms(0, 1) / (2 * nbuf);
    const int iters = o.iters > 0 ? o.iters : int(std::clamp(3e5 / std::max(est_us, 1.0), 10.0, 200.0));
    Events ev(size_t(2 * iters));
    for (int i = 0; i < iters; ++i) {
      TETRA_CUDA_CHECK(cudaEventRecord(ev.ev[size_t(2 * i)], stream));
      TETRA_CUDA_CHECK(cudaGraphLaunch(graphs[size_t(i % nbuf)].exec, stream));
      TETRA_CUDA_CHECK(cudaEventRecord(ev.ev[size_t(2 * i + 1)], stream));
    }
    TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<double> us;
    for (int i = 0; i < iters; ++i) us.push_back(1e3 * ev.ms(size_t(2 * i), size_t(2 * i + 1)));

    MoeBenchRow row;
    row.backend = backend;
    row.tokens = T;
    row.unique_experts = unique;
    row.median_us = percentile(us, 0.5);
    row.p90_us = percentile(us, 0.9);
    row.bytes = layer_bytes(s, backend, unique, T);
    row.flops = 2.0 * (double(T) * s.K * 3.0 * s.H * s.I + double(T) * 3.0 * s.H * s.Is +
                       double(T) * s.E * s.H);
    row.gbs = row.bytes / (row.median_us * 1e-6) / 1e9;
    row.tflops = row.flops / (row.median_us * 1e-6) / 1e12;
    row.memory_floor_us = row.bytes / bw * 1e6;
    row.compute_floor_us = row.flops / peak * 1e6;
    row.floor_us = std::max(row.memory_floor_us, row.compute_floor_us);
    row.bound = row.memory_floor_us >= row.compute_floor_us ? "memory" : "compute";
    row.efficiency = row.floor_us / row.median_us;
    row.buffers = nbuf;
    row.iters = iters;
    r.rows.push_back(row);

    // Parts, eager, on buffer rotation too.
    Events marks(5);
    std::vector<double> p[5];
    const int part_runs = std::clamp(iters / 4, 5, 50);
    for (int i = 0; i < part_runs; ++i) {
      const int b = i % nbuf;
      layer.forward_marked(buf.x[size_t(b)], T, buf.out[size_t(b)], nullptr, stream, marks.ev.data());
      TETRA_CUDA_CHECK(cudaEventSynchronize(marks.ev[4]));
      for (int k = 0; k < 4; ++k) p[k].push_back(1e3 * marks.ms(size_t(k), size_t(k + 1)));
      p[4].push_back(1e3 * marks.ms(0, 4));
    }
    MoeBenchParts parts;
    parts.backend = row.backend;
    parts.tokens = T;
    parts.route_layout_us = percentile(p[0], 0.5);
    parts.gemm1_us = percentile(p[1], 0.5);
    parts.gemm2_us = percentile(p[2], 0.5);
    parts.combine_us = percentile(p[3], 0.5);
    parts.total_us = percentile(p[4], 0.5);
    r.parts.push_back(parts);
  }
  cudaStreamDestroy(stream);
}

std::string fixed(double v, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}

}  // namespace

void validate_moe_bench_options(const MoeBenchOptions& o) {
  preset_shape(o.preset);  // unknown preset / no MoE layer
  if (o.tokens.empty()) TETRA_FAIL("--tokens: give at least one token count");
  for (int t : o.tokens)
    if (t <= 0 || t > 65536) TETRA_FAIL("--tokens: ", t, " is outside 1..65536");
  if (o.routing != "uniform" && o.routing != "skewed")
    TETRA_FAIL("--routing: '", o.routing, "' is neither uniform nor skewed");
  if (o.backend != "all" && !find_backend(o.backend)) {
    std::string names;
    for (const std::string& n : backend_names()) names += ", " + n;
    TETRA_FAIL("--backend: unknown backend '", o.backend, "'; known: all", names);
  }
  if (o.iters < 0) TETRA_FAIL("--iters must be >= 0 (0 = automatic), got ", o.iters);
}

double moe_bench_bytes(const std::string& preset, const std::string& backend, double unique,
                       int tokens) {
  return layer_bytes(preset_shape(preset), backend, unique, tokens);
}

std::string moe_bench_memory_reason(const MoeBenchOptions& o, const std::string& backend,
                                    int64_t memory_bytes) {
  const BenchMemory m = bench_memory(preset_shape(o.preset), backend, o.tokens);
  const double usable = double(memory_bytes) * kUsableMemoryFraction;
  if (m.weights + m.scratch <= usable) return "";
  return str("one ", backend, " layer of ", o.preset, " needs ", format_gb(m.weights + m.scratch),
             " of GPU memory (weights ", format_gb(m.weights), ", scratch and inputs up to ",
             format_gb(m.scratch), "); ", int(kUsableMemoryFraction * 100), "% of ",
             format_gb(double(memory_bytes)), " is ", format_gb(usable));
}

MoeBenchReport run_moe_bench(const MoeBenchOptions& o) {
  validate_moe_bench_options(o);
  const std::optional<GpuSpec> gpu = detect_local_gpu();
  if (!gpu) TETRA_FAIL("tetra bench moe needs a CUDA GPU; none was found on this machine");
  const Shape s = preset_shape(o.preset);
  MoeBenchReport r;
  r.date = utc_now();
  r.commit = git_commit();
  r.gpu = gpu->product.empty() ? gpu->name : gpu->product;
  r.command = o.command_line;
  r.preset = o.preset;
  r.routing = o.routing;
  r.experts = s.E, r.hidden = s.H, r.inter = s.I, r.shared_inter = s.Is, r.top_k = s.K;
  r.bandwidth_bytes_per_s = gpu->bandwidth_bytes_per_s > 0 ? gpu->bandwidth_bytes_per_s : kFallbackBandwidth;
  r.bf16_tflops = gpu->bf16_dense_tflops > 0 ? gpu->bf16_dense_tflops : kFallbackTflops;

  Target t;
  t.gpu = gpu;
  t.host_memory_bytes = host_memory_bytes();

  for (const BackendCaps& b : moe_backends()) {
    if (o.backend != "all" && o.backend != b.name) continue;
    if (b.runs_on_cpu) {
      r.skipped.push_back({b.name, "the CPU reference is not a GPU benchmark"});
      continue;
    }
    const Verdict v = evaluate(b, bench_workload(s, o, b.name), t);
    if (!v.ok) {
      std::string why;
      for (const std::string& x : v.reasons) why += (why.empty() ? "" : "; ") + x;
      r.skipped.push_back({b.name, why});
      continue;
    }
    if (b.name != "cuda-w4a16" && b.name != "cuda-w4a4" && b.name != "cuda-bf16") {
      r.skipped.push_back({b.name, "no benchmark driver for this backend yet"});
      continue;
    }
    const std::string no_room = moe_bench_memory_reason(o, b.name, gpu->memory_bytes);
    if (!no_room.empty()) {
      r.skipped.push_back({b.name, no_room});
      continue;
    }
    bench_random_layer(s, o, *gpu, b.name, r);
  }
  return r;
}

std::string moe_bench_markdown(const MoeBenchReport& r) {
  std::ostringstream os;
  os << "# tetra bench moe: " << r.preset << " (E" << r.experts << " H" << r.hidden << " I"
     << r.inter << " shared " << r.shared_inter << " top-" << r.top_k << "), routing "
     << r.routing << "\n\n";
  os << "- Date: " << r.date << ". Commit: " << r.commit << ". GPU: " << r.gpu << ".\n";
  os << "- Command: `" << r.command << "`\n";
  if (!r.token_path.empty())
    os << "- Token path (moe::CudaTokenPath, TETRA_MOE_TOKEN_PATH): " << r.token_path << ".\n";
  os << "- Floors at " << fixed(r.bandwidth_bytes_per_s / 1e12, 2) << " TB/s and "
     << fixed(r.bf16_tflops, 0) << " TFLOP/s (bf16 peak). Bytes: unique routed experts' "
        "weights in the backend's format (NVFP4 + scales, or bf16 for cuda-bf16), shared expert, "
        "router weight, x in, out. Times: CUDA graph of one "
        "forward, median (p90) of the launches, inputs rotated over the buffers.\n\n";
  os << "| backend | tokens | unique experts | median us | p90 us | GB/s | TFLOP/s | floor us | "
        "efficiency | bound |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const MoeBenchRow& x : r.rows)
    os << "| " << x.backend << " | " << x.tokens << " | " << fixed(x.unique_experts, 1) << " | "
       << fixed(x.median_us, 1) << " | " << fixed(x.p90_us, 1) << " | " << fixed(x.gbs, 0)
       << " | " << fixed(x.tflops, 1) << " | " << fixed(x.floor_us, 1) << " | "
       << fixed(100 * x.efficiency, 1) << "% | " << x.bound << " |\n";
  if (!r.parts.empty()) {
    os << "\nParts of one forward (eager launches, events between parts, median; where the whole "
          "layer is one persistent launch, at T <= the token path's persist setting, all of it is "
          "in route+layout; at one token the token path routes here, where the timed forward "
          "leaves the routing to GEMM1):\n\n"
          "| backend | tokens | route+layout us | GEMM1 us | GEMM2 us | combine us | total us |\n"
          "|---|---|---|---|---|---|---|\n";
    for (const MoeBenchParts& p : r.parts)
      os << "| " << p.backend << " | " << p.tokens << " | " << fixed(p.route_layout_us, 1) << " | "
         << fixed(p.gemm1_us, 1) << " | " << fixed(p.gemm2_us, 1) << " | "
         << fixed(p.combine_us, 1) << " | " << fixed(p.total_us, 1) << " |\n";
  }
  if (!r.skipped.empty()) {
    os << "\nSkipped:\n\n";
    for (const MoeBenchSkip& k : r.skipped) os << "- " << k.backend << ": " << k.reason << "\n";
  }
  return os.str();
}

nlohmann::json moe_bench_json(const MoeBenchReport& r) {
  nlohmann::json j;
  j["date"] = r.date;
  j["commit"] = r.commit;
  j["gpu"] = r.gpu;
  j["command"] = r.command;
  j["preset"] = r.preset;
  j["routing"] = r.routing;
  j["token_path"] = r.token_path;
  j["shape"] = {{"experts", r.experts}, {"hidden", r.hidden}, {"moe_intermediate", r.inter},
                {"shared_intermediate", r.shared_inter}, {"top_k", r.top_k}};
  j["bandwidth_bytes_per_s"] = r.bandwidth_bytes_per_s;
  j["bf16_tflops"] = r.bf16_tflops;
  j["rows"] = nlohmann::json::array();
  for (const MoeBenchRow& x : r.rows)
    j["rows"].push_back({{"backend", x.backend}, {"tokens", x.tokens},
                         {"unique_experts", x.unique_experts}, {"median_us", x.median_us},
                         {"p90_us", x.p90_us}, {"bytes", x.bytes}, {"flops", x.flops},
                         {"gbs", x.gbs}, {"tflops", x.tflops},
                         {"memory_floor_us", x.memory_floor_us},
                         {"compute_floor_us", x.compute_floor_us}, {"floor_us", x.floor_us},
                         {"efficiency", x.efficiency}, {"bound", x.bound},
                         {"buffers", x.buffers}, {"iters", x.iters}});
  j["parts"] = nlohmann::json::array();
  for (const MoeBenchParts& p : r.parts)
    j["parts"].push_back({{"backend", p.backend}, {"tokens", p.tokens},
                          {"route_layout_us", p.route_layout_us}, {"gemm1_us", p.gemm1_us},
                          {"gemm2_us", p.gemm2_us}, {"combine_us", p.combine_us},
                          {"total_us", p.total_us}});
  j["skipped"] = nlohmann::json::array();
  for (const MoeBenchSkip& k : r.skipped)
    j["skipped"].push_back({{"backend", k.backend}, {"reason", k.reason}});
  return j;
}

}  // namespace tetra::bench
