// Writes the tensors of a checkpoint from any TensorSource, optionally quantizing the linear
// layers to NVFP4 exactly as ModelOpt's export does (shared global scale per fuse group).
// Streams group by group, so memory stays bounded by the largest group, not the model.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "format/model_layout.h"
#include "tools/tensor_source.h"
#include "tools/weight_quantizer.h"

namespace tetra {

struct WriteOptions {
  WeightQuantizer* quantizer = nullptr;   // null: copy everything as is
  std::vector<std::string> exclude;       // wildcard patterns on module names kept high precision
  uint64_t max_shard_bytes = 5ull << 30;  // as Hugging Face's default shard size
  bool progress = false;                  // a progress line on stderr
};

struct WriteResult {
  int64_t tensors_written = 0;
  int64_t linears_quantized = 0;
  // Modules with a 2-D float weight left in high precision (for the quant config's exclude list).
  std::vector<std::string> high_precision_modules;
  uint64_t bytes_in = 0, bytes_out = 0;
  double seconds = 0;
  double quantize_seconds = 0;  // time inside amax + quantize
};

WriteResult write_checkpoint_tensors(const TensorSource& source, const ModelLayout& layout,
                                     const WriteOptions& options,
                                     const std::filesystem::path& out_dir);

}  // namespace tetra
