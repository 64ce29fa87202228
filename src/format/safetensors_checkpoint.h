// A Hugging Face checkpoint directory: one or more safetensors files, optionally tied together
// by model.safetensors.index.json. Every file stays memory-mapped for the checkpoint's lifetime.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "format/safetensors.h"

namespace tetra {

inline constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";

class SafetensorsCheckpoint {
 public:
  // `dir` holding model.safetensors.index.json: its weight_map decides which tensor lives in which
  // file; every named file must exist and hold its tensors, and a tensor present in two of the
  // files is refused (tensors in the files but not in the map are ignored). Without an index:
  // every *.safetensors file in `dir` (sorted), a tensor name in two files being an error.
  // `dir` may also be a single .safetensors file. Errors name the file and the tensor.
  static SafetensorsCheckpoint open(const std::filesystem::path& dir);

  bool contains(std::string_view name) const;
  const SafetensorsEntry* find(std::string_view name) const;  // nullptr if absent
  // Zero-copy view; Error naming the tensor and the checkpoint if it is absent.
  TensorView view(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  const std::filesystem::path& file_of(std::string_view name) const;
  uint64_t total_tensor_bytes() const;  // sum over the checkpoint's tensors
  size_t num_files() const { return files_.size(); }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  const std::filesystem::path& root() const { return root_; }

 private:
  size_t file_index_of(std::string_view name) const;  // Error if absent

  std::filesystem::path root_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t, std::less<>> file_by_tensor_;  // name -> index into files_
};

}  // namespace tetra
