// Where the tensors of a checkpoint being written come from: an existing checkpoint on disk
// (zero-copy views) or a random generator for a model description.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "format/model_layout.h"
#include "format/safetensors_checkpoint.h"

namespace tetra {

struct SourceTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual const std::vector<SourceTensor>& tensors() const = 0;
  // The bytes of one tensor: a view, or data generated into `scratch`.
  virtual const uint8_t* bytes(const SourceTensor& t, std::vector<uint8_t>& scratch) const = 0;
};

class CheckpointSource : public TensorSource {
 public:
  explicit CheckpointSource(const SafetensorsCheckpoint& ck);
  const std::vector<SourceTensor>& tensors() const override { return tensors_; }
  const uint8_t* bytes(const SourceTensor& t, std::vector<uint8_t>& scratch) const override;

 private:
  const SafetensorsCheckpoint& ck_;
  std::vector<SourceTensor> tensors_;
};

// Random weights for every tensor of a high-precision layout, scaled so activations stay near
// unit size through depth: inputs ~ 1/sqrt(fan_in); output projections (o_proj, down_proj)
// additionally / sqrt(2 * layers) as residual branches; norms ~1; biases small.
class RandomSource : public TensorSource {
 public:
  RandomSource(const ModelLayout& layout, int64_t num_layers, DType dtype, uint64_t seed);
  const std::vector<SourceTensor>& tensors() const override { return tensors_; }
  const uint8_t* bytes(const SourceTensor& t, std::vector<uint8_t>& scratch) const override;

 private:
  struct Init {
    float mean, stddev;
  };
  void add(SourceTensor t, Init init);
  std::vector<SourceTensor> tensors_;
  std::vector<Init> init_;  // parallel to tensors_
  std::unordered_map<std::string, size_t> index_;
  uint64_t seed_;
};

}  // namespace tetra
