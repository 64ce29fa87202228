// tetra quantize IN_DIR OUT_DIR: a BF16/FP16/FP32 HF checkpoint -> ModelOpt-compatible NVFP4.
#include <cstdio>

#include "cli/commands.h"
#include "cli/size_option.h"
#include "tools/model_writer.h"

namespace tetra::cli {

static void add_quantize(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "quantize", "Quantize a BF16/FP16/FP32 Hugging Face checkpoint to ModelOpt NVFP4 "
                  "(W4A16_NVFP4: weights only)");
  struct Args {
    std::string in, out, shard = "5GB";
    QuantizeOptions opt;
    bool quiet = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("IN_DIR", a->in, "input checkpoint directory")->required();
  cmd->add_option("OUT_DIR", a->out, "output directory (created)")->required();
  cmd->add_option("--exclude", a->opt.exclude,
                  "module pattern to keep in high precision ('*' wildcard); repeatable");
  cmd->add_option("--device", a->opt.device, "where to quantize")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--max-shard-size", a->shard, "shard size limit (e.g. 5GB)")->capture_default_str();
  cmd->add_flag("--quiet", a->quiet, "no progress output");
  cmd->callback([a] {
    a->opt.max_shard_bytes = parse_size(a->shard);
    a->opt.progress = !a->quiet;
    const WriteResult r = quantize_checkpoint(a->in, a->out, a->opt);
    std::printf("quantized %lld linear layers; %lld tensors written; %.3f GB in -> %.3f GB out\n",
                (long long)r.linears_quantized, (long long)r.tensors_written, r.bytes_in / 1e9,
                r.bytes_out / 1e9);
    std::printf("time %.2f s total (%.2f GB/s of input), %.2f s in amax+quantize (%.2f GB/s)\n",
                r.seconds, r.bytes_in / 1e9 / std::max(r.seconds, 1e-9), r.quantize_seconds,
                r.bytes_in / 1e9 / std::max(r.quantize_seconds, 1e-9));
  });
}

static const CommandRegistration kRegistration{"quantize", 20, &add_quantize};

}  // namespace tetra::cli
