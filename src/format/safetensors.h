// One safetensors file, memory-mapped read-only: tensors are handed out as zero-copy views.
// Sharded checkpoints: format/safetensors_checkpoint.h. Writing: format/safetensors_writer.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "format/safetensors_header.h"
#include "format/tensor_view.h"

namespace tetra {

class SafetensorsFile {
 public:
  // Maps the file and validates it completely (see parse_safetensors_image): a file that opens
  // has every tensor's bytes inside the mapping. Errors name the path and the tensor.
  static SafetensorsFile open(const std::filesystem::path& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::vector<SafetensorsEntry>& tensors() const { return header_.tensors; }  // by offset
  const SafetensorsEntry* find(std::string_view name) const { return header_.find(name); }
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  // Zero-copy view into the mapping; Error naming the file and tensor if it is absent.
  TensorView view(std::string_view name) const;
  TensorView view(const SafetensorsEntry& entry) const;  // entry must come from tensors()
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const std::filesystem::path& path() const { return path_; }

  // The whole mapped file ([file_size] bytes) and where its data section starts in it.
  const uint8_t* mapping() const { return base_; }
  size_t file_size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }

 private:
  SafetensorsFile() = default;
  void release() noexcept;

  std::filesystem::path path_;
  const uint8_t* base_ = nullptr;  // [size_] bytes, PROT_READ mapping of the whole file
  size_t size_ = 0;
  uint64_t data_offset_ = 0;
  SafetensorsHeader header_;
};

}  // namespace tetra
