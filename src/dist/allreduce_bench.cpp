#include "dist/allreduce_bench.h"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdio>
#include <ctime>
#include <random>
#include <sstream>

#include "core/cuda_check.h"
#include "core/half.h"
#include "core/version.h"
#include "dist/nccl_communicators.h"
#include "dist/nccl_library.h"
#include "dist/peer_allreduce.h"
#include "dist/rank_threads.h"

namespace tetra::dist {
namespace {

size_t parse_one_size(const std::string& piece) {
  size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(piece, &used);
  } catch (const std::exception&) {
    TETRA_FAIL("--sizes: '", piece, "' is not a size (expected e.g. 2K, 64K, 1M or 4096)");
  }
  const std::string suffix = piece.substr(used);
  if (suffix == "K" || suffix == "k")
    v <<= 10;
  else if (suffix == "M" || suffix == "m")
    v <<= 20;
  else if (!suffix.empty())
    TETRA_FAIL("--sizes: unknown suffix '", suffix, "' in '", piece, "' (use K or M)");
  if (v == 0 || v % 2 != 0)
    TETRA_FAIL("--sizes: ", piece, " is not a positive even byte count (messages are bf16)");
  return size_t(v);
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = float_to_bf16(dist(rng));
  return v;
}

int ulp_distance(uint16_t a, uint16_t b) {
  auto line = [](uint16_t x) { return (x & 0x8000) ? -int(x & 0x7FFF) : int(x); };
  return std::abs(line(a) - line(b));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Per rank: outputs of the correctness calls and rank 0's timings, by size index.
struct SizeResult {
  std::vector<std::vector<uint16_t>> inputs, one_shot_out, nccl_out;  // [rank][count]
  double one_shot_eager = 0, nccl_eager = 0, one_shot_graph = 0, nccl_graph = -1;
};

}  // namespace

std::vector<size_t> parse_byte_sizes(const std::string& text) {
  std::vector<size_t> out;
  std::stringstream ss(text);
  std::string piece;
  while (std::getline(ss, piece, ',')) {
    const size_t dots = piece.find("..");
    if (dots == std::string::npos) {
      out.push_back(parse_one_size(piece));
      continue;
    }
    const size_t lo = parse_one_size(piece.substr(0, dots));
    const size_t hi = parse_one_size(piece.substr(dots + 2));
    if (lo > hi) TETRA_FAIL("--sizes: range '", piece, "' runs backwards");
    for (size_t s = lo; s <= hi; s *= 2) out.push_back(s);
  }
  if (out.empty()) TETRA_FAIL("--sizes: give at least one size (e.g. 2K..1M)");
  return out;
}

std::string format_bytes(size_t b) {
  if (b >= (size_t(1) << 20) && b % (size_t(1) << 20) == 0) return str(b >> 20, "M");
  if (b >= 1024 && b % 1024 == 0) return str(b >> 10, "K");
  return std::to_string(b);
}

AllReduceBenchReport run_allreduce_bench(const AllReduceBenchOptions& o) {
  TETRA_CHECK(!o.sizes_bytes.empty(), "no sizes");
  if (o.gpus < 2) TETRA_FAIL("tetra bench allreduce needs --gpus 2 or more (got ", o.gpus, ")");
  const int visible = visible_gpu_count();
  if (visible < o.gpus)
    TETRA_FAIL("tetra bench allreduce --gpus ", o.gpus, " needs ", o.gpus, " GPUs; this machine has ",
               visible);
  const std::vector<int> devices = first_devices(o.gpus);
  const size_t max_bytes = *std::max_element(o.sizes_bytes.begin(), o.sizes_bytes.end());

  AllReduceBenchReport r;
  r.date = utc_now();
  r.commit = git_commit();
  r.command = o.command_line;
  r.gpus = o.gpus;
  r.blocks = o.blocks;
  r.threads = o.threads;
  r.reps = o.reps;
  r.calls_per_rep = o.calls_per_rep;
  r.push = o.push;
  cudaDeviceProp prop{};
  TETRA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  r.gpu = prop.name;

  NcclCommunicators nccl_comms(devices);
  r.nccl_version = nccl_version_string();
  PeerAllReduce peer(devices, PeerAllReduceOptions{max_bytes, o.blocks, o.threads, o.push});

  const int n = o.gpus;
  std::vector<SizeResult> results(o.sizes_bytes.size());
  for (size_t i = 0; i < results.size(); ++i) {
    const size_t count = o.sizes_bytes[i] / 2;
    results[i].one_shot_out.resize(size_t(n));
    results[i].nccl_out.resize(size_t(n));
    for (int k = 0; k < n; ++k)
      results[i].inputs.push_back(random_bf16(count, uint32_t(i * 131 + size_t(k))));
  }
  std::barrier sync(n);
  std::vector<std::atomic<int>> capture_ok(static_cast<size_t>(n));

  run_on_ranks(devices, [&](int rank) {
    uint16_t *in = nullptr, *out = nullptr;
    TETRA_CUDA_MALLOC(&in, max_bytes);
    TETRA_CUDA_MALLOC(&out, max_bytes);
    cudaStream_t s;
    TETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    TETRA_CUDA_CHECK(cudaEventCreate(&e0));
    TETRA_CUDA_CHECK(cudaEventCreate(&e1));

    for (size_t i = 0; i < results.size(); ++i) {
      SizeResult& res = results[i];
      const size_t count = o.sizes_bytes[i] / 2;
      auto one_shot = [&] { peer.run(rank, in, out, count, s); };
      auto nccl_call = [&] { nccl_comms.all_reduce_bf16(rank, in, out, count, s); };
      auto download = [&](std::vector<uint16_t>& dst) {
        dst.resize(count);
        TETRA_CUDA_CHECK(cudaMemcpyAsync(dst.data(), out, count * 2, cudaMemcpyDeviceToHost, s));
        TETRA_CUDA_CHECK(cudaStreamSynchronize(s));
      };
      // Correctness on fresh data, both paths.
      TETRA_CUDA_CHECK(cudaMemcpy(in, res.inputs[size_t(rank)].data(), count * 2,
                                  cudaMemcpyHostToDevice));
      sync.arrive_and_wait();
      one_shot();
      download(res.one_shot_out[size_t(rank)]);
      nccl_call();
      download(res.nccl_out[size_t(rank)]);

      auto time_eager = [&](auto&& call) {
        for (int w = 0; w < 10; ++w) call();
        TETRA_CUDA_CHECK(cudaStreamSynchronize(s));
        sync.arrive_and_wait();
        std::vector<double> per_call;
        for (int rep = 0; rep < o.reps; ++rep) {
          TETRA_CUDA_CHECK(cudaEventRecord(e0, s));
          for (int c = 0; c < o.calls_per_rep; ++c) call();
          TETRA_CUDA_CHECK(cudaEventRecord(e1, s));
          TETRA_CUDA_CHECK(cudaEventSynchronize(e1));
          float ms = 0;
          TETRA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
          per_call.push_back(double(ms) * 1000.0 / o.calls_per_rep);
        }
        return median(per_call);
      };
      // -1 when any rank could not capture (then no rank replays, so none waits for a peer).
      auto time_graph = [&](auto&& call) {
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        bool ok = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
        if (ok) {
          try {
            for (int c = 0; c < o.calls_per_rep; ++c) call();
          } catch (const Error&) {
            ok = false;
          }
          ok = cudaStreamEndCapture(s, &graph) == cudaSuccess && ok;
          ok = ok && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
        }
        cudaGetLastError();
        capture_ok[size_t(rank)] = ok ? 1 : 0;
        sync.arrive_and_wait();
        bool all_ok = true;
        for (int k = 0; k < n; ++k) all_ok = all_ok && capture_ok[size_t(k)] == 1;
        double result = -1;
        if (all_ok) {
          for (int w = 0; w < 3; ++w) TETRA_CUDA_CHECK(cudaGraphLaunch(exec, s));
          TETRA_CUDA_CHECK(cudaStreamSynchronize(s));
          sync.arrive_and_wait();
          std::vector<double> per_call;
          for (int rep = 0; rep < o.reps; ++rep) {
            TETRA_CUDA_CHECK(cudaEventRecord(e0, s));
            TETRA_CUDA_CHECK(cudaGraphLaunch(exec, s));
            TETRA_CUDA_CHECK(cudaEventRecord(e1, s));
            TETRA_CUDA_CHECK(cudaEventSynchronize(e1));
            float ms = 0;
            TETRA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            per_call.push_back(double(ms) * 1000.0 / o.calls_per_rep);
          }
          result = median(per_call);
        }
        if (exec) cudaGraphExecDestroy(exec);
        if (graph) cudaGraphDestroy(graph);
        sync.arrive_and_wait();  // capture_ok is reused by the next call
        return result;
      };
      const double a = time_eager(one_shot), b = time_eager(nccl_call);
      const double c = time_graph(one_shot), d = time_graph(nccl_call);
      if (rank == 0) {
        res.one_shot_eager = a;
        res.nccl_eager = b;
        res.one_shot_graph = c;
        res.nccl_graph = d;
      }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaStreamDestroy(s);
    cudaFree(in);
    cudaFree(out);
  });

  for (size_t i = 0; i < results.size(); ++i) {
    const SizeResult& res = results[i];
    AllReduceBenchRow row;
    row.bytes = o.sizes_bytes[i];
    row.one_shot_eager_us = res.one_shot_eager;
    row.nccl_eager_us = res.nccl_eager;
    row.one_shot_graph_us = res.one_shot_graph;
    row.nccl_graph_us = res.nccl_graph;
    std::vector<const uint16_t*> ptrs;
    for (const auto& v : res.inputs) ptrs.push_back(v.data());
    std::vector<uint16_t> want(row.bytes / 2);
    one_shot_reduce_cpu(ptrs, want.data(), want.size());
    row.one_shot_exact = true;
    for (int k = 0; k < n; ++k) {
      row.one_shot_exact = row.one_shot_exact && res.one_shot_out[size_t(k)] == want;
      for (size_t j = 0; j < want.size(); ++j)
        row.nccl_max_ulp = std::max(row.nccl_max_ulp, ulp_distance(res.nccl_out[size_t(k)][j], want[j]));
    }
    const double nccl_ref = row.nccl_graph_us > 0 ? row.nccl_graph_us : row.nccl_eager_us;
    const double one_ref = row.nccl_graph_us > 0 ? row.one_shot_graph_us : row.one_shot_eager_us;
    if (one_ref < nccl_ref) r.crossover_bytes = std::max(r.crossover_bytes, row.bytes);
    r.rows.push_back(row);
  }
  return r;
}

std::string allreduce_bench_markdown(const AllReduceBenchReport& r) {
  std::ostringstream os;
  char buf[256];
  os << "# All-reduce latency, bf16 sum: one-shot peer memory vs NCCL\n\n"
     << "- date " << r.date << ", commit " << r.commit << ", " << r.gpus << " x " << r.gpu
     << ", NCCL " << r.nccl_version << " (NCCL_NVLS_ENABLE=0)\n"
     << "- command: `" << r.command << "`\n"
     << "- one-shot variant " << (r.push ? "push (writes into peers' buffers)"
                                        : "pull (reads peers' buffers)") << ", grid " << r.blocks << " x " << r.threads << "; per-call time = median of "
     << r.reps << " runs of " << r.calls_per_rep << " back-to-back calls (eager launches, or one "
     << "CUDA graph of them), rank 0's stream\n\n"
     << "| size | one-shot eager us | NCCL eager us | one-shot graph us | NCCL graph us | "
        "graph speedup | one-shot = CPU twin | NCCL max ulp |\n"
     << "|---:|---:|---:|---:|---:|---:|:---:|---:|\n";
  for (const AllReduceBenchRow& w : r.rows) {
    std::string nccl_graph = "capture failed", speedup = "-";
    if (w.nccl_graph_us > 0) {
      std::snprintf(buf, sizeof buf, "%.2f", w.nccl_graph_us);
      nccl_graph = buf;
      std::snprintf(buf, sizeof buf, "%.2fx", w.nccl_graph_us / w.one_shot_graph_us);
      speedup = buf;
    }
    std::snprintf(buf, sizeof buf, "| %s | %.2f | %.2f | %.2f | %s | %s | %s | %d |\n",
                  format_bytes(w.bytes).c_str(), w.one_shot_eager_us, w.nccl_eager_us,
                  w.one_shot_graph_us, nccl_graph.c_str(), speedup.c_str(),
                  w.one_shot_exact ? "yes" : "NO", w.nccl_max_ulp);
    os << buf;
  }
  os << "\nOne-shot is faster up to " << format_bytes(r.crossover_bytes)
     << " (graph times where NCCL captured, else eager).\n";
  return os.str();
}

nlohmann::json allreduce_bench_json(const AllReduceBenchReport& r) {
  nlohmann::json j;
  j["benchmark"] = "allreduce";
  j["date"] = r.date;
  j["commit"] = r.commit;
  j["gpu"] = r.gpu;
  j["gpus"] = r.gpus;
  j["nccl_version"] = r.nccl_version;
  j["command"] = r.command;
  j["one_shot_blocks"] = r.blocks;
  j["one_shot_threads"] = r.threads;
  j["one_shot_variant"] = r.push ? "push" : "pull";
  j["reps"] = r.reps;
  j["calls_per_rep"] = r.calls_per_rep;
  j["crossover_bytes"] = r.crossover_bytes;
  j["rows"] = nlohmann::json::array();
  for (const AllReduceBenchRow& w : r.rows)
    j["rows"].push_back({{"bytes", w.bytes},
                         {"one_shot_eager_us", w.one_shot_eager_us},
                         {"nccl_eager_us", w.nccl_eager_us},
                         {"one_shot_graph_us", w.one_shot_graph_us},
                         {"nccl_graph_us", w.nccl_graph_us > 0 ? nlohmann::json(w.nccl_graph_us)
                                                               : nlohmann::json(nullptr)},
                         {"one_shot_equals_cpu_twin", w.one_shot_exact},
                         {"nccl_max_ulp", w.nccl_max_ulp}});
  return j;
}

}  // namespace tetra::dist
