#include "format/checkpoint.h"

#include <unordered_map>

#include "core/error.h"

namespace tetra {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A scalar may be saved 0-d or as [1].
bool shapes_match(const std::vector<int64_t>& want, const std::vector<int64_t>& got) {
  if (want == got) return true;
  const bool want_scalar = want.empty() || want == std::vector<int64_t>{1};
  const bool got_scalar = got.empty() || got == std::vector<int64_t>{1};
  return want_scalar && got_scalar;
}

bool dtype_acceptable(DType want, DType got) {
  return want == got || (is_float_dtype(want) && is_float_dtype(got));
}

}  // namespace

bool is_float_dtype(DType t) { return t == DType::BF16 || t == DType::F16 || t == DType::F32; }

Checkpoint Checkpoint::open(const std::filesystem::path& dir) {
  if (!std::filesystem::is_directory(dir)) TETRA_FAIL("checkpoint directory not found: ", dir.string());
  Checkpoint ck;
  ck.dir_ = dir;
  ck.config_ = load_model_config(dir);
  ck.quant_ = load_quant_config(dir);
  ck.layout_ = model_layout(ck.config_);
  ck.tensors_ = SafetensorsCheckpoint::open(dir);
  return ck;
}

std::vector<std::string> Checkpoint::problems() const {
  std::vector<std::string> out;
  for (const TensorSpec& spec : expected_tensors(layout_, quant_)) {
    if (!tensors_.contains(spec.name)) {
      out.push_back(str("missing tensor ", spec.name, " (", dtype_name(spec.dtype), " ",
                        shape_str(spec.shape), ")"));
      continue;
    }
    const TensorView v = tensors_.view(spec.name);
    const std::string where = tensors_.file_of(spec.name).string();
    if (!dtype_acceptable(spec.dtype, v.dtype))
      out.push_back(str("tensor ", spec.name, " in ", where, " has dtype ", dtype_name(v.dtype),
                        ", expected ", dtype_name(spec.dtype)));
    if (!shapes_match(spec.shape, v.shape))
      out.push_back(str("tensor ", spec.name, " in ", where, " has shape ", shape_str(v.shape),
                        ", expected ", shape_str(spec.shape)));
  }
  return out;
}

void Checkpoint::validate() const {
  const std::vector<std::string> found = problems();
  if (found.empty()) return;
  std::string msg = str("checkpoint ", dir_.string(), " does not match its ",
                        arch_hf_name(config_.arch), " config (", found.size(), " problems):");
  for (size_t i = 0; i < found.size() && i < 20; ++i) msg += "\n  " + found[i];
  if (found.size() > 20) msg += str("\n  ... and ", found.size() - 20, " more");
  TETRA_FAIL(msg);
}

LinearTensors Checkpoint::linear(const std::string& module) const {
  LinearTensors lin;
  for (const LinearSpec& s : layout_.linears)
    if (s.module == module) lin.spec = &s;
  if (!lin.spec) TETRA_FAIL("no linear module named ", module, " in a ", arch_hf_name(config_.arch));
  auto opt = [&](const std::string& name) -> std::optional<TensorView> {
    if (!tensors_.contains(name)) return std::nullopt;
    return tensors_.view(name);
  };
  lin.weight = tensors_.view(module + ".weight");
  lin.weight_scale = opt(module + ".weight_scale");
  lin.weight_scale_2 = opt(module + ".weight_scale_2");
  lin.input_scale = opt(module + ".input_scale");
  lin.bias = opt(module + ".bias");
  lin.quantized = lin.weight.dtype == DType::U8 && lin.weight_scale.has_value();
  if (lin.weight.dtype == DType::U8 && !lin.weight_scale)
    TETRA_FAIL("tensor ", module, ".weight is packed FP4 (U8) but ", module,
               ".weight_scale is missing");
  if (lin.quantized && !lin.weight_scale_2)
    TETRA_FAIL("quantized module ", module, " has no weight_scale_2");
  return lin;
}

void Checkpoint::check_scales_finite(const LinearTensors& lin) const {
  if (!lin.quantized) return;
  const TensorView& s = *lin.weight_scale;
  for (size_t i = 0; i < s.nbytes; ++i) {
    const uint8_t b = s.data[i];
    if ((b & 0x7f) == 0x7f)
      TETRA_FAIL("tensor ", s.name, " in ", tensors_.file_of(s.name).string(), " holds a NaN block scale (0x",
                 std::hex, int(b), std::dec, ") at byte ", i);
  }
}

}  // namespace tetra
