#include "format/safetensors_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/error.h"
#include "format/safetensors_checkpoint.h"
#include "format/safetensors_header.h"

namespace tetra {
namespace {

namespace fs = std::filesystem;

std::map<std::string, std::string> with_format(std::map<std::string, std::string> metadata) {
  metadata.emplace("format", "pt");  // keeps a caller's own "format"
  return metadata;
}

std::string shard_file_name(size_t index, size_t count) {
  if (count == 1) return "model.safetensors";
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

// Entries in plan order with contiguous offsets; checks names and sizes.
std::vector<SafetensorsEntry> entries_from_plan(const std::vector<TensorPlan>& plan,
                                                const std::string& label) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(plan.size());
  std::map<std::string_view, size_t> seen;
  for (const TensorPlan& t : plan) {
    const std::string what = str(label, ": tensor '", t.name, "'");
    if (t.name.empty()) TETRA_FAIL(label, ": a planned tensor has an empty name");
    if (t.name == "__metadata__") TETRA_FAIL(what, ": name is reserved by the format");
    if (!seen.emplace(t.name, entries.size()).second) TETRA_FAIL(what, ": planned twice");
    SafetensorsEntry e;
    e.name = t.name;
    e.dtype = t.dtype;
    e.shape = t.shape;
    e.end = safetensors_tensor_bytes(t.dtype, t.shape, what);  // begin assigned by the caller
    entries.push_back(std::move(e));
  }
  return entries;
}

void write_text_file_durably(const fs::path& path, const std::string& text) {
  fs::path partial = path;
  partial += ".partial";
  std::FILE* f = std::fopen(partial.c_str(), "wb");
  if (!f) TETRA_FAIL(partial.string(), ": cannot create: ", std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() &&
                  std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int err = errno;
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    std::error_code ec;
    fs::remove(partial, ec);
    TETRA_FAIL(partial.string(), ": write failed: ", std::strerror(ok ? errno : err));
  }
  std::error_code ec;
  fs::rename(partial, path, ec);
  if (ec) TETRA_FAIL(partial.string(), ": cannot rename to ", path.string(), ": ", ec.message());
}

}  // namespace

ShardedSafetensorsWriter::ShardedSafetensorsWriter(fs::path out_dir, uint64_t max_shard_bytes,
                                                   std::map<std::string, std::string> metadata)
    : out_dir_(std::move(out_dir)),
      max_shard_bytes_(max_shard_bytes),
      metadata_(with_format(std::move(metadata))) {
  if (max_shard_bytes_ == 0) TETRA_FAIL(out_dir_.string(), ": max shard size must be positive");
}

ShardedSafetensorsWriter::~ShardedSafetensorsWriter() = default;  // shards clean up themselves

void ShardedSafetensorsWriter::plan(std::vector<TensorPlan> tensors) {
  const std::string label = out_dir_.string();
  if (planned_) TETRA_FAIL(label, ": writer already planned");
  std::error_code ec;
  fs::create_directories(out_dir_, ec);
  if (ec) TETRA_FAIL(label, ": cannot create directory: ", ec.message());
  for (const fs::directory_entry& e : fs::directory_iterator(out_dir_, ec)) {
    const fs::path name = e.path().filename();
    if (name == kSafetensorsIndexName || name.extension() == ".safetensors")
      TETRA_FAIL(label, ": already holds ", name.string(),
                 "; remove the old checkpoint files before writing a new one");
  }
  if (ec) TETRA_FAIL(label, ": cannot list directory: ", ec.message());

  // Assign shards and offsets.
  std::vector<SafetensorsEntry> entries = entries_from_plan(tensors, label);
  std::vector<std::vector<SafetensorsEntry>> shard_entries(1);  // [num_shards][tensors in shard]
  uint64_t shard_bytes = 0;
  for (SafetensorsEntry& e : entries) {
    const uint64_t nbytes = e.end;
    const bool fits = shard_bytes <= max_shard_bytes_ && nbytes <= max_shard_bytes_ - shard_bytes;
    // A tensor that does not fit opens a new shard, unless the current one is still empty.
    if (!fits && !shard_entries.back().empty()) {
      shard_entries.emplace_back();
      shard_bytes = 0;
    }
    e.begin = shard_bytes;
    if (__builtin_add_overflow(shard_bytes, nbytes, &e.end))
      TETRA_FAIL(label, ": tensor '", e.name, "' overflows the shard's byte offsets");
    shard_bytes = e.end;
    placements_[e.name] = Placement{shard_entries.size() - 1, e.begin, nbytes, WriteState::Pending};
    shard_entries.back().push_back(std::move(e));
  }

  planned_ = true;  // even if creating a file fails below: the writer is then unusable
  for (size_t s = 0; s < shard_entries.size(); ++s)
    shards_.push_back(std::make_unique<SafetensorsShardFile>(
        out_dir_ / shard_file_name(s, shard_entries.size()), shard_entries[s], metadata_));
}

void ShardedSafetensorsWriter::write(const std::string& name, const void* data, size_t nbytes) {
  const std::string label = out_dir_.string();
  if (!planned_) TETRA_FAIL(label, ": write('", name, "') before plan()");
  if (finished_) TETRA_FAIL(label, ": write('", name, "') after finish()");
  auto it = placements_.find(name);
  if (it == placements_.end()) TETRA_FAIL(label, ": tensor '", name, "' was not planned");
  Placement& p = it->second;
  if (nbytes != p.nbytes)
    TETRA_FAIL(label, ": tensor '", name, "' was planned with ", p.nbytes, " bytes, got ", nbytes);
  if (nbytes > 0 && data == nullptr) TETRA_FAIL(label, ": tensor '", name, "': data is null");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (p.state != WriteState::Pending) TETRA_FAIL(label, ": tensor '", name, "' written twice");
    p.state = WriteState::InProgress;
  }
  try {
    shards_[p.shard]->write_at(p.begin, data, nbytes);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    p.state = WriteState::Pending;  // a failed write may be retried
    throw;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  p.state = WriteState::Done;
}

void ShardedSafetensorsWriter::finish() {
  const std::string label = out_dir_.string();
  if (!planned_) TETRA_FAIL(label, ": finish() before plan()");
  if (finished_) TETRA_FAIL(label, ": finish() called twice");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t missing = 0;
    std::string examples;
    for (const auto& [name, p] : placements_) {
      if (p.state == WriteState::Done) continue;
      if (++missing <= 3) examples += str(missing > 1 ? ", " : "", "'", name, "'");
    }
    if (missing)
      TETRA_FAIL(label, ": ", missing, " planned tensor(s) never written, e.g. ", examples);
  }
  for (auto& shard : shards_) shard->commit();

  if (shards_.size() > 1) {
    uint64_t total = 0;
    nlohmann::json weight_map = nlohmann::json::object();
    for (const auto& [name, p] : placements_) {
      total += p.nbytes;
      weight_map[name] = shards_[p.shard]->final_path().filename().string();
    }
    const nlohmann::json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", weight_map}};
    write_text_file_durably(out_dir_ / kSafetensorsIndexName, index.dump(2) + "\n");
  }
  fsync_directory(out_dir_);
  finished_ = true;
}

std::vector<fs::path> ShardedSafetensorsWriter::shard_paths() const {
  std::vector<fs::path> out;
  for (const auto& shard : shards_) out.push_back(shard->final_path());
  return out;
}

void write_safetensors(const fs::path& path,
                       const std::vector<std::pair<TensorPlan, const void*>>& tensors,
                       std::map<std::string, std::string> metadata) {
  const std::string label = path.string();
  std::vector<TensorPlan> plan;
  plan.reserve(tensors.size());
  for (const auto& [t, data] : tensors) plan.push_back(t);
  std::vector<SafetensorsEntry> entries = entries_from_plan(plan, label);
  uint64_t offset = 0;
  for (SafetensorsEntry& e : entries) {
    const uint64_t nbytes = e.end;
    e.begin = offset;
    e.end = offset + nbytes;
    offset = e.end;
  }
  SafetensorsShardFile file(path, entries, with_format(std::move(metadata)));
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].nbytes() > 0 && tensors[i].second == nullptr)
      TETRA_FAIL(label, ": tensor '", entries[i].name, "': data is null");
    file.write_at(entries[i].begin, tensors[i].second, size_t(entries[i].nbytes()));
  }
  file.commit();
  fs::path dir = path.parent_path();
  fsync_directory(dir.empty() ? fs::path(".") : dir);
}

}  // namespace tetra
