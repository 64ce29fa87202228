// A Hugging Face checkpoint directory as Tetra sees it: config + quantization config + tensors
// (headers mapped, data zero-copy), with a validation pass that runs before any GPU memory is
// touched.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "format/model_config.h"
#include "format/model_layout.h"
#include "format/quant_config.h"
#include "format/safetensors_checkpoint.h"

namespace tetra {

// The tensors of one linear layer, quantized or not. Views point into the mapped files.
struct LinearTensors {
  const LinearSpec* spec = nullptr;
  bool quantized = false;
  TensorView weight;                     // [N, K/2] U8 e2m1 pairs, or [N, K] high precision
  std::optional<TensorView> weight_scale;    // [N, K/16] F8_E4M3 block scales (plain layout)
  std::optional<TensorView> weight_scale_2;  // [] or [1] F32 global scale
  std::optional<TensorView> input_scale;     // [] or [1] F32 activation scale (NVFP4 only)
  std::optional<TensorView> bias;            // [N] high precision
};

class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const QuantConfig& quant() const { return quant_; }
  const ModelLayout& layout() const { return layout_; }
  const SafetensorsCheckpoint& tensors() const { return tensors_; }

  // Every tensor the architecture needs is present with an acceptable dtype and the right
  // shape. Throws one Error listing every problem (first 20), naming tensor and file.
  void validate() const;
  // Problems as a list (empty when valid); validate() throws with these.
  std::vector<std::string> problems() const;

  // Lookup by module name, e.g. "model.layers.3.mlp.experts.7.up_proj".
  LinearTensors linear(const std::string& module) const;
  // Reads the block scales of a quantized linear and refuses NaN scale bytes (0x7F/0xFF).
  void check_scales_finite(const LinearTensors& lin) const;

 private:
  std::filesystem::path dir_;
  ModelConfig config_;
  QuantConfig quant_;
  ModelLayout layout_;
  SafetensorsCheckpoint tensors_;
};

// High-precision float tensors may be stored as BF16, F16 or F32 interchangeably.
bool is_float_dtype(DType t);

}  // namespace tetra
