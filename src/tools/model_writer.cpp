#include "tools/model_writer.h"

#include <fstream>
#include <set>

#include "core/error.h"
#include "format/checkpoint.h"
#include "format/presets.h"
#include "format/quant_config.h"
#include "format/wildcard.h"

namespace tetra {
namespace {

namespace fs = std::filesystem;

void write_json(const fs::path& path, const nlohmann::json& j) {
  std::ofstream out(path);
  if (!out) TETRA_FAIL("cannot write ", path.string());
  out << j.dump(2) << "\n";
  if (!out) TETRA_FAIL("failed writing ", path.string());
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) TETRA_FAIL("cannot read ", path.string());
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    TETRA_FAIL(path.string(), ": invalid JSON: ", e.what());
  }
}

// ModelOpt's exclude list: the user's patterns, then the defaults, then every other
// high-precision module no pattern covers yet.
std::vector<std::string> exclude_list(const std::vector<std::string>& user,
                                      const std::vector<std::string>& high_precision) {
  std::vector<std::string> patterns = user;
  for (const char* p : {"lm_head", "*.mlp.gate", "model.embed_tokens", "*.indexer.weights_proj"})
    if (std::find(patterns.begin(), patterns.end(), p) == patterns.end()) patterns.push_back(p);
  for (const std::string& module : high_precision) {
    bool covered = false;
    for (const std::string& p : patterns) covered = covered || wildcard_match_module(p, module);
    if (!covered) patterns.push_back(module);
  }
  return patterns;
}

}  // namespace

void write_model_configs(const fs::path& out_dir, nlohmann::json config_json,
                         const WriteResult& written, const std::vector<std::string>& exclude,
                         bool quantized) {
  config_json.erase("quantization_config");
  if (quantized) {
    QuantConfig q;
    q.algo = QuantAlgo::W4A16_NVFP4;  // weight-only: no calibrated input_scale is recorded
    q.group_size = 16;
    q.producer = "modelopt";
    q.exclude = exclude_list(exclude, written.high_precision_modules);
    config_json["quantization_config"] = quant_config_to_config_json(q);
    write_json(out_dir / "hf_quant_config.json", quant_config_to_hf_json(q));
  }
  write_json(out_dir / "config.json", config_json);
}

WriteResult quantize_checkpoint(const fs::path& in_dir, const fs::path& out_dir,
                                const QuantizeOptions& opt) {
  const Checkpoint ck = Checkpoint::open(in_dir);
  if (ck.quant().quantized())
    TETRA_FAIL(in_dir.string(), " is already quantized; tetra quantize takes a BF16/FP16/FP32 checkpoint");
  ck.validate();
  if (fs::exists(out_dir) && fs::equivalent(in_dir, out_dir))
    TETRA_FAIL("output directory must differ from the input directory");
  auto quantizer = make_weight_quantizer(opt.device);
  if (opt.progress) std::fprintf(stderr, "quantizing %s -> %s on %s\n", in_dir.c_str(), out_dir.c_str(),
                                 quantizer->device().c_str());
  CheckpointSource source(ck.tensors());
  WriteOptions wopt;
  wopt.quantizer = quantizer.get();
  wopt.exclude = opt.exclude;
  wopt.max_shard_bytes = opt.max_shard_bytes;
  wopt.progress = opt.progress;
  // Clear stale shards from an earlier run so the directory holds one checkpoint.
  if (fs::exists(out_dir))
    for (const auto& e : fs::directory_iterator(out_dir))
      if (e.path().extension() == ".safetensors" || e.path().filename() == "model.safetensors.index.json")
        fs::remove(e.path());
  WriteResult result = write_checkpoint_tensors(source, ck.layout(), wopt, out_dir);
  write_model_configs(out_dir, read_json(in_dir / "config.json"), result, opt.exclude, true);
  // Tokenizer, generation config, chat template, README...: everything else travels unchanged.
  for (const auto& e : fs::directory_iterator(in_dir)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || e.path().extension() == ".safetensors" ||
        name == "model.safetensors.index.json" || name == "config.json" || name == "hf_quant_config.json")
      continue;
    fs::copy_file(e.path(), out_dir / name, fs::copy_options::overwrite_existing);
  }
  return result;
}

WriteResult make_model(const fs::path& out_dir, const MakeModelOptions& opt) {
  ModelConfig cfg = preset_config(opt.preset);
  if (opt.layers > 0) cfg = with_num_layers(cfg, opt.layers);
  if (opt.dtype != "bf16" && opt.dtype != "nvfp4")
    TETRA_FAIL("--dtype must be bf16 or nvfp4, got '", opt.dtype, "'");
  const bool quantized = opt.dtype == "nvfp4";
  const ModelLayout layout = model_layout(cfg);
  RandomSource source(layout, cfg.num_layers, DType::BF16, opt.seed);
  std::unique_ptr<WeightQuantizer> quantizer;
  if (quantized) quantizer = make_weight_quantizer("auto");
  WriteOptions wopt;
  wopt.quantizer = quantizer.get();
  wopt.max_shard_bytes = opt.max_shard_bytes;
  wopt.progress = opt.progress;
  fs::create_directories(out_dir);
  for (const auto& e : fs::directory_iterator(out_dir))
    if (e.path().extension() == ".safetensors" || e.path().filename() == "model.safetensors.index.json")
      fs::remove(e.path());
  WriteResult result = write_checkpoint_tensors(source, layout, wopt, out_dir);
  write_model_configs(out_dir, model_config_to_json(cfg), result, {}, quantized);
  return result;
}

}  // namespace tetra
