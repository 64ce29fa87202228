#include "tools/checkpoint_writer.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <unordered_map>

#include "core/error.h"
#include "format/nvfp4.h"
#include "format/safetensors_writer.h"
#include "format/wildcard.h"

namespace tetra {
namespace {

using Clock = std::chrono::steady_clock;

bool is_float(DType t) { return t == DType::BF16 || t == DType::F16 || t == DType::F32; }

std::string module_of(const std::string& weight_name) {
  return weight_name.substr(0, weight_name.size() - std::string(".weight").size());
}

bool is_weight(const std::string& name) {
  return name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
}

// What happens to each source tensor, in the order it is processed.
struct Step {
  size_t source_index;
  bool quantize;
  std::string group;  // fuse group of a quantized weight
};

struct Plan {
  std::vector<Step> steps;                 // processing order: a group's members are adjacent
  std::vector<TensorPlan> outputs;         // every output tensor, in the same order
  std::vector<std::string> high_precision; // 2-D float weights not quantized
};

Plan make_plan(const TensorSource& source, const ModelLayout& layout, const WriteOptions& opt) {
  const auto& tensors = source.tensors();
  std::unordered_map<std::string, const LinearSpec*> linear_of;
  for (const LinearSpec& lin : layout.linears) linear_of[lin.module + ".weight"] = &lin;

  auto excluded = [&](const std::string& module) {
    for (const std::string& p : opt.exclude)
      if (wildcard_match_module(p, module)) return true;
    return false;
  };
  // Decide per tensor; collect group members in source order.
  std::vector<std::string> group_of(tensors.size());
  std::map<std::string, std::vector<size_t>> members;
  Plan plan;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SourceTensor& t = tensors[i];
    if (!is_weight(t.name) || t.shape.size() != 2 || !is_float(t.dtype)) continue;
    const auto it = linear_of.find(t.name);
    const std::string module = module_of(t.name);
    const bool quantize = opt.quantizer && it != linear_of.end() && it->second->quantizable &&
                          t.shape[1] % nvfp4::kBlock == 0 && !excluded(module);
    if (!quantize) {
      plan.high_precision.push_back(module);
      continue;
    }
    group_of[i] = it->second->fuse_group.empty() ? module : it->second->fuse_group;
    members[group_of[i]].push_back(i);
  }
  std::set<std::string> done;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (group_of[i].empty()) {
      plan.steps.push_back({i, false, {}});
      continue;
    }
    if (!done.insert(group_of[i]).second) continue;
    for (size_t m : members[group_of[i]]) plan.steps.push_back({m, true, group_of[i]});
  }
  for (const Step& s : plan.steps) {
    const SourceTensor& t = tensors[s.source_index];
    if (!s.quantize) {
      plan.outputs.push_back({t.name, t.dtype, t.shape});
      continue;
    }
    const std::string module = module_of(t.name);
    const int64_t n = t.shape[0], k = t.shape[1];
    plan.outputs.push_back({module + ".weight", DType::U8, {n, k / 2}});
    plan.outputs.push_back({module + ".weight_scale", DType::F8_E4M3, {n, k / nvfp4::kBlock}});
    plan.outputs.push_back({module + ".weight_scale_2", DType::F32, {}});
  }
  return plan;
}

class Progress {
 public:
  Progress(bool enabled, uint64_t total) : enabled_(enabled), total_(total) {}
  void advance(uint64_t bytes, bool force = false) {
    done_ += bytes;
    if (!enabled_) return;
    const double t = std::chrono::duration<double>(Clock::now() - start_).count();
    // A terminal gets one line redrawn each second; a log gets a line every 10 s.
    if (!force && t - last_ < (tty_ ? 1.0 : 10.0)) return;
    last_ = t;
    std::fprintf(stderr, tty_ ? "\r  %5.1f%%" : "  %5.1f%%  %8.2f / %.2f GB  %6.2f GB/s", 100.0 * done_ / std::max<uint64_t>(total_, 1),
                 done_ / 1e9, total_ / 1e9, done_ / 1e9 / std::max(t, 1e-9));
    if (force || !tty_) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  bool tty_ = isatty(2);
  uint64_t total_, done_ = 0;
  Clock::time_point start_ = Clock::now();
  double last_ = -1.0;
};

}  // namespace

WriteResult write_checkpoint_tensors(const TensorSource& source, const ModelLayout& layout,
                                     const WriteOptions& opt, const std::filesystem::path& out_dir) {
  const auto start = Clock::now();
  const auto& tensors = source.tensors();
  Plan plan = make_plan(source, layout, opt);
  WriteResult result;
  result.high_precision_modules = plan.high_precision;
  for (const SourceTensor& t : tensors) result.bytes_in += t.nbytes();

  std::filesystem::create_directories(out_dir);
  ShardedSafetensorsWriter writer(out_dir, opt.max_shard_bytes, {{"format", "pt"}});
  writer.plan(plan.outputs);
  Progress progress(opt.progress, result.bytes_in);

  std::vector<uint8_t> scratch, packed, scales;
  for (size_t s = 0; s < plan.steps.size();) {
    const Step& step = plan.steps[s];
    const SourceTensor& t = tensors[step.source_index];
    if (!step.quantize) {
      const uint8_t* data = source.bytes(t, scratch);
      writer.write(t.name, data, t.nbytes());
      result.bytes_out += t.nbytes();
      ++result.tensors_written;
      progress.advance(t.nbytes());
      ++s;
      continue;
    }
    // A fuse group: one global scale from the max of the members' amaxes (NVFP4.md).
    size_t end = s;
    while (end < plan.steps.size() && plan.steps[end].quantize && plan.steps[end].group == step.group) ++end;
    const auto q0 = Clock::now();
    float group_amax = 0.0f;
    for (size_t m = s; m < end; ++m) {
      const SourceTensor& mt = tensors[plan.steps[m].source_index];
      group_amax = std::max(group_amax, opt.quantizer->amax(source.bytes(mt, scratch), mt.dtype,
                                                            size_t(mt.numel()), mt.name));
    }
    const float s2 = nvfp4::global_scale_from_amax(group_amax);
    result.quantize_seconds += std::chrono::duration<double>(Clock::now() - q0).count();
    for (size_t m = s; m < end; ++m) {
      const SourceTensor& mt = tensors[plan.steps[m].source_index];
      const int64_t rows = mt.shape[0], cols = mt.shape[1];
      packed.resize(size_t(rows * cols / 2));
      scales.resize(size_t(rows * cols / nvfp4::kBlock));
      const uint8_t* data = source.bytes(mt, scratch);
      const auto q1 = Clock::now();
      opt.quantizer->quantize(data, mt.dtype, rows, cols, s2, packed.data(), scales.data());
      result.quantize_seconds += std::chrono::duration<double>(Clock::now() - q1).count();
      const std::string module = module_of(mt.name);
      writer.write(module + ".weight", packed.data(), packed.size());
      writer.write(module + ".weight_scale", scales.data(), scales.size());
      writer.write(module + ".weight_scale_2", &s2, sizeof(float));
      result.bytes_out += packed.size() + scales.size() + sizeof(float);
      result.tensors_written += 3;
      ++result.linears_quantized;
      progress.advance(mt.nbytes());
    }
    s = end;
  }
  writer.finish();
  progress.advance(0, true);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace tetra
