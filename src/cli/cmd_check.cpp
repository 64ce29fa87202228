// Placeholder until the capability table lands (helper E replaces this file).
#include "cli/commands.h"
namespace tetra::cli {
void add_check(CLI::App&) {}
}  // namespace tetra::cli
