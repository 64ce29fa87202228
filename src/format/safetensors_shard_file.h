// One safetensors file being written: created under a temporary name with its header in place and
// its final size reserved, filled by positioned writes in any order, then made durable and renamed
// into place. A crash mid-way leaves only "<name>.partial", never a valid-looking file whose
// unwritten tensors read back as zeros.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "format/safetensors_header.h"

namespace tetra {

class SafetensorsShardFile {
 public:
  // Creates final_path + ".partial" holding the header for `entries` (offsets already assigned,
  // relative to the data section) and sized to end at the largest `end`.
  SafetensorsShardFile(std::filesystem::path final_path,
                       const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata);
  SafetensorsShardFile(const SafetensorsShardFile&) = delete;
  SafetensorsShardFile& operator=(const SafetensorsShardFile&) = delete;
  ~SafetensorsShardFile();  // not committed: closes and removes the partial file

  // Writes `nbytes` at data-section offset `begin` (thread-safe: pwrite on a shared descriptor).
  void write_at(uint64_t begin, const void* data, size_t nbytes) const;
  // fsync, close, rename to the final path.
  void commit();

  const std::filesystem::path& final_path() const { return final_path_; }

 private:
  std::filesystem::path final_path_;
  std::filesystem::path partial_path_;
  int fd_ = -1;
  uint64_t data_offset_ = 0;  // 8 + header length
  bool committed_ = false;
};

// fsync of a directory, so that renames in it survive a power loss.
void fsync_directory(const std::filesystem::path& dir);

}  // namespace tetra
