#include "format/safetensors_checkpoint.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <system_error>

#include "core/error.h"
#include "format/safetensors_json.h"

namespace tetra {
namespace {

namespace fs = std::filesystem;

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) TETRA_FAIL(path.string(), ": cannot open for reading");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) TETRA_FAIL(path.string(), ": read error");
  return text.str();
}

// weight_map of the index: tensor name -> file name (relative to the checkpoint directory).
std::map<std::string, std::string> read_weight_map(const fs::path& index_path) {
  const std::string label = index_path.string();
  const std::string text = read_text_file(index_path);
  if (text.size() > kMaxSafetensorsHeaderBytes)
    TETRA_FAIL(label, ": index is ", text.size(), " bytes, larger than the ",
               kMaxSafetensorsHeaderBytes, "-byte limit");
  const nlohmann::json root = parse_strict_json(text, label);
  if (!root.is_object()) TETRA_FAIL(label, ": index must be a JSON object, got ", root.type_name());
  auto map_it = root.find("weight_map");
  if (map_it == root.end()) TETRA_FAIL(label, ": missing \"weight_map\"");
  if (!map_it->is_object())
    TETRA_FAIL(label, ": \"weight_map\" must be an object, got ", map_it->type_name());
  std::map<std::string, std::string> out;
  for (const auto& [tensor, file] : map_it->items()) {
    if (!file.is_string())
      TETRA_FAIL(label, ": weight_map entry of tensor '", tensor, "' must be a file name, got ",
                 file.type_name());
    const fs::path rel(file.get<std::string>());
    // Shards live in the checkpoint directory; an index must not reach outside it.
    if (rel.empty() || rel.is_absolute() ||
        std::any_of(rel.begin(), rel.end(), [](const fs::path& part) { return part == ".."; }))
      TETRA_FAIL(label, ": weight_map entry of tensor '", tensor, "' names '", rel.string(),
                 "', which is not a file name inside the checkpoint directory");
    out.emplace(tensor, rel.lexically_normal().string());
  }
  return out;
}

std::vector<fs::path> list_safetensors_files(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors" && e.is_regular_file()) out.push_back(e.path());
  }
  if (ec) TETRA_FAIL(dir.string(), ": cannot list directory: ", ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

SafetensorsCheckpoint SafetensorsCheckpoint::open(const fs::path& dir) {
  SafetensorsCheckpoint ckpt;
  ckpt.root_ = dir;
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) {
    ckpt.files_.push_back(SafetensorsFile::open(dir));
    for (const SafetensorsEntry& e : ckpt.files_[0].tensors())
      ckpt.file_by_tensor_.emplace(e.name, 0);
    return ckpt;
  }
  if (!fs::is_directory(dir, ec))
    TETRA_FAIL(dir.string(), ": not a checkpoint directory or safetensors file (",
               fs::exists(dir, ec) ? "not a directory" : "does not exist", ")");

  const fs::path index_path = dir / kSafetensorsIndexName;
  if (fs::exists(index_path, ec)) {
    const std::string label = index_path.string();
    const std::map<std::string, std::string> weight_map = read_weight_map(index_path);
    if (weight_map.empty()) TETRA_FAIL(label, ": weight_map lists no tensors");
    std::map<std::string, size_t> file_index;  // file name -> index into files_
    for (const auto& [tensor, file] : weight_map) {
      if (file_index.count(file)) continue;
      const fs::path path = dir / file;
      if (!fs::is_regular_file(path, ec))
        TETRA_FAIL(label, ": tensor '", tensor, "' is mapped to '", file, "', but ", path.string(),
                   " does not exist");
      file_index.emplace(file, ckpt.files_.size());
      ckpt.files_.push_back(SafetensorsFile::open(path));
    }
    for (const auto& [tensor, file] : weight_map) {
      const size_t idx = file_index.at(file);
      if (!ckpt.files_[idx].contains(tensor))
        TETRA_FAIL(label, ": tensor '", tensor, "' is mapped to ", ckpt.files_[idx].path().string(),
                   ", which does not contain it");
      ckpt.file_by_tensor_.emplace(tensor, idx);
    }
    // A mapped tensor also stored in another shard: two copies that may differ is corruption.
    for (size_t i = 0; i < ckpt.files_.size(); ++i) {
      for (const SafetensorsEntry& e : ckpt.files_[i].tensors()) {
        auto it = ckpt.file_by_tensor_.find(e.name);
        if (it != ckpt.file_by_tensor_.end() && it->second != i)
          TETRA_FAIL(label, ": tensor '", e.name, "' is stored in both ",
                     ckpt.files_[it->second].path().string(), " and ",
                     ckpt.files_[i].path().string());
      }
    }
    return ckpt;
  }

  const std::vector<fs::path> paths = list_safetensors_files(dir);
  if (paths.empty())
    TETRA_FAIL(dir.string(), ": no ", kSafetensorsIndexName, " and no *.safetensors files");
  for (const fs::path& path : paths) {
    const size_t idx = ckpt.files_.size();
    ckpt.files_.push_back(SafetensorsFile::open(path));
    for (const SafetensorsEntry& e : ckpt.files_[idx].tensors()) {
      auto [it, inserted] = ckpt.file_by_tensor_.emplace(e.name, idx);
      if (!inserted)
        TETRA_FAIL(dir.string(), ": tensor '", e.name, "' is stored in both ",
                   ckpt.files_[it->second].path().string(), " and ", path.string());
    }
  }
  return ckpt;
}

bool SafetensorsCheckpoint::contains(std::string_view name) const {
  return file_by_tensor_.find(name) != file_by_tensor_.end();
}

size_t SafetensorsCheckpoint::file_index_of(std::string_view name) const {
  auto it = file_by_tensor_.find(name);
  if (it == file_by_tensor_.end())
    TETRA_FAIL(root_.string(), ": checkpoint has no tensor named '", name, "'");
  return it->second;
}

const SafetensorsEntry* SafetensorsCheckpoint::find(std::string_view name) const {
  auto it = file_by_tensor_.find(name);
  return it == file_by_tensor_.end() ? nullptr : files_[it->second].find(name);
}

TensorView SafetensorsCheckpoint::view(std::string_view name) const {
  return files_[file_index_of(name)].view(name);
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(file_by_tensor_.size());
  for (const auto& [name, idx] : file_by_tensor_) out.push_back(name);
  return out;  // std::map iterates in sorted order
}

const fs::path& SafetensorsCheckpoint::file_of(std::string_view name) const {
  return files_[file_index_of(name)].path();
}

uint64_t SafetensorsCheckpoint::total_tensor_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, idx] : file_by_tensor_) total += files_[idx].find(name)->nbytes();
  return total;
}

}  // namespace tetra
