// Writing safetensors checkpoints with bounded memory: every tensor's shard and offset is fixed
// up front, so a 400 GB checkpoint can be produced one tensor at a time (e.g. while quantizing)
// without holding more than one tensor in memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "format/safetensors_shard_file.h"

namespace tetra {

struct TensorPlan {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;  // [d0, d1, ...]; empty for a 0-d scalar
};

class ShardedSafetensorsWriter {
 public:
  // `max_shard_bytes` bounds the tensor bytes per shard (headers not counted, as in Hugging Face's
  // max_shard_size). `metadata` goes into every shard's __metadata__; "format": "pt" is added when
  // absent because transformers refuses safetensors metadata without a known format.
  ShardedSafetensorsWriter(std::filesystem::path out_dir, uint64_t max_shard_bytes,
                           std::map<std::string, std::string> metadata = {});
  ShardedSafetensorsWriter(const ShardedSafetensorsWriter&) = delete;
  ShardedSafetensorsWriter& operator=(const ShardedSafetensorsWriter&) = delete;
  ~ShardedSafetensorsWriter();  // unfinished: removes the partial files it created

  // Fixes shards and offsets: tensors packed in the given order, a new shard whenever the next
  // tensor would push the current one past the limit (a tensor larger than the limit gets a shard
  // of its own). Creates the files with their headers. Refuses a directory that already holds
  // *.safetensors files or an index (stale shards would mix with the new ones). Call once.
  void plan(std::vector<TensorPlan> tensors);
  // Stores one tensor's bytes at its planned place; any order, callable from several threads.
  // Refuses unknown names, a second write of a name and a size other than planned.
  void write(const std::string& name, const void* data, size_t nbytes);
  // Checks that every tensor was written, makes the shards durable, moves them to their final
  // names and, with more than one shard, writes model.safetensors.index.json.
  void finish();

  size_t num_shards() const { return shards_.size(); }
  // Final file names: "model.safetensors" alone, else "model-00001-of-00003.safetensors", ...
  std::vector<std::filesystem::path> shard_paths() const;

 private:
  enum class WriteState : uint8_t { Pending, InProgress, Done };
  struct Placement {
    size_t shard = 0;
    uint64_t begin = 0;  // offset in the shard's data section
    uint64_t nbytes = 0;
    WriteState state = WriteState::Pending;
  };

  std::filesystem::path out_dir_;
  uint64_t max_shard_bytes_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::unique_ptr<SafetensorsShardFile>> shards_;  // [num_shards]
  std::map<std::string, Placement, std::less<>> placements_;   // tensor name -> where it goes
  std::mutex mutex_;                                           // guards Placement::state
  bool planned_ = false;
  bool finished_ = false;
};

// One unsharded file at `path` (replaced if it exists), written through a ".partial" file.
// Each pointer holds the tensor's bytes (dtype size * numel; may be null for an empty tensor).
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<TensorPlan, const void*>>& tensors,
                       std::map<std::string, std::string> metadata = {});

}  // namespace tetra
