// Each subcommand lives in its own file and registers itself on the root app.
// Handlers throw tetra::Error on bad input; main() prints it as one line and exits 1.
#pragma once
#include <CLI/CLI.hpp>

namespace tetra::cli {

void add_inspect(CLI::App& app);
void add_quantize(CLI::App& app);
void add_make_model(CLI::App& app);
void add_demo(CLI::App& app);
void add_check(CLI::App& app);

}  // namespace tetra::cli
