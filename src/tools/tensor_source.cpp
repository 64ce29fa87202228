#include "tools/tensor_source.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/parallel.h"
#include "tools/random_weights.h"

namespace tetra {

int64_t SourceTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

CheckpointSource::CheckpointSource(const SafetensorsCheckpoint& ck) : ck_(ck) {
  for (const std::string& name : ck.names()) {
    const TensorView v = ck.view(name);
    tensors_.push_back({name, v.dtype, v.shape});
  }
}

const uint8_t* CheckpointSource::bytes(const SourceTensor& t, std::vector<uint8_t>&) const {
  return ck_.view(t.name).data;
}

namespace {
bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

void RandomSource::add(SourceTensor t, Init init) {
  index_.emplace(t.name, tensors_.size());
  tensors_.push_back(std::move(t));
  init_.push_back(init);
}

RandomSource::RandomSource(const ModelLayout& layout, int64_t num_layers, DType dtype,
                           uint64_t seed)
    : seed_(seed) {
  const float residual_scale = 1.0f / std::sqrt(2.0f * float(std::max<int64_t>(num_layers, 1)));
  for (const LinearSpec& lin : layout.linears) {
    const bool output_proj = ends_with(lin.module, "o_proj") || ends_with(lin.module, "down_proj");
    float stddev = 1.0f / std::sqrt(float(lin.in_features));
    if (output_proj) stddev *= residual_scale;
    add({lin.module + ".weight", dtype, {lin.out_features, lin.in_features}}, {0.0f, stddev});
    if (lin.bias) add({lin.module + ".bias", dtype, {lin.out_features}}, {0.0f, 0.02f});
  }
  for (const TensorSpec& t : layout.others) {
    if (index_.count(t.name)) continue;  // a linear's bias already added above
    Init init{0.0f, 0.02f};
    if (t.kind == ModuleKind::Norm || ends_with(t.name, "norm.weight")) init = {1.0f, 0.05f};
    if (t.kind == ModuleKind::Embedding) init = {0.0f, 1.0f};
    if (ends_with(t.name, "e_score_correction_bias")) init = {0.0f, 0.01f};
    add({t.name, t.dtype == DType::F32 ? DType::F32 : dtype, t.shape}, init);
  }
}

const uint8_t* RandomSource::bytes(const SourceTensor& t, std::vector<uint8_t>& scratch) const {
  const auto it = index_.find(t.name);
  TETRA_CHECK(it != index_.end(), "unknown tensor ", t.name);
  const size_t index = it->second;
  scratch.resize(t.nbytes());
  const uint64_t tseed = tensor_seed(seed_, t.name);
  const Init init = init_[index];
  const size_t esize = dtype_size(t.dtype);
  parallel_for(t.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    fill_random(scratch.data() + begin * esize, t.dtype, begin, end, tseed, init.mean, init.stddev);
  });
  return scratch.data();
}

}  // namespace tetra
