#include "cli/commands.h"
namespace tetra::cli {
void add_inspect(CLI::App&) {}
void add_quantize(CLI::App&) {}
void add_make_model(CLI::App&) {}
void add_demo(CLI::App&) {}
}
