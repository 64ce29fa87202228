// tetra make-model --preset NAME OUT_DIR: a random-weight checkpoint with a real config.
#include <cstdio>

#include "cli/commands.h"
#include "cli/size_option.h"
#include "format/model_config.h"
#include "tools/model_writer.h"

namespace tetra::cli {

static void add_make_model(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-model",
                                 "Write a random-weight checkpoint with a real architecture's config");
  struct Args {
    std::string out, shard = "5GB";
    MakeModelOptions opt;
  };
  auto a = std::make_shared<Args>();
  std::string presets;
  for (const std::string& p : preset_names()) presets += (presets.empty() ? "" : ", ") + p;
  cmd->add_option("--preset", a->opt.preset, "one of: " + presets)->required();
  cmd->add_option("--layers", a->opt.layers, "number of layers (default: the preset's)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  cmd->add_option("--dtype", a->opt.dtype, "weight format")
      ->check(CLI::IsMember({"bf16", "nvfp4"}))
      ->capture_default_str();
  cmd->add_option("--seed", a->opt.seed, "random seed")->capture_default_str();
  cmd->add_option("--max-shard-size", a->shard, "shard size limit (e.g. 5GB)")->capture_default_str();
  cmd->add_option("OUT_DIR", a->out, "output directory")->required();
  cmd->callback([a] {
    a->opt.max_shard_bytes = parse_size(a->shard);
    a->opt.progress = true;
    const WriteResult r = make_model(a->out, a->opt);
    std::printf("wrote %s: %lld tensors, %.3f GB (%s), %.2f s\n", a->out.c_str(),
                (long long)r.tensors_written, r.bytes_out / 1e9, a->opt.dtype.c_str(), r.seconds);
  });
}

static const CommandRegistration kRegistration{"make-model", 30, &add_make_model};

}  // namespace tetra::cli
