// Each subcommand lives in its own file and registers itself, so adding a command touches no
// other file:   static const CommandRegistration kReg{"inspect", 10, &add_inspect};
// main() adds the registered commands in `order` (the order `tetra --help` lists them).
// Handlers throw tetra::Error on bad input; main() prints it as one line and exits 1.
#pragma once
#include <CLI/CLI.hpp>

namespace tetra::cli {

using AddCommand = void (*)(CLI::App& app);

struct CommandRegistration {
  CommandRegistration(const char* name, int order, AddCommand add);
};

// Calls every registered AddCommand on `app`, lowest order first.
void add_registered_commands(CLI::App& app);

}  // namespace tetra::cli
