// tetra inspect DIR [--json]: what a checkpoint holds, and the numerator of the decode floor.
#include <iostream>

#include "cli/commands.h"
#include "core/error.h"
#include "format/checkpoint.h"
#include "tools/inspect_report.h"

namespace tetra::cli {

static void add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Describe a Hugging Face checkpoint: architecture, "
                                            "quantization, total and active bytes per token");
  auto dir = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("DIR", *dir, "checkpoint directory (config.json + *.safetensors)")->required();
  cmd->add_flag("--json", *json, "print JSON instead of text");
  cmd->callback([dir, json] {
    const Checkpoint ck = Checkpoint::open(*dir);
    const nlohmann::json report = inspect_report(ck);
    if (*json)
      std::cout << report.dump(2) << "\n";
    else
      std::cout << format_inspect_report(report);
    if (!report["problems"].empty())
      TETRA_FAIL("checkpoint does not match its config (", report["problems"].size(),
                 " problems, listed above)");
  });
}

static const CommandRegistration kRegistration{"inspect", 10, &add_inspect};

}  // namespace tetra::cli
