#include <algorithm>
#include <string>
#include <vector>

#include "cli/commands.h"

namespace tetra::cli {
namespace {

struct Entry {
  std::string name;
  int order;
  AddCommand add;
};

// Function-local so registrations from other files' static initialisers never see it unbuilt.
std::vector<Entry>& registry() {
  static std::vector<Entry> entries;
  return entries;
}

}  // namespace

CommandRegistration::CommandRegistration(const char* name, int order, AddCommand add) {
  registry().push_back({name, order, add});
}

void add_registered_commands(CLI::App& app) {
  std::vector<Entry> sorted = registry();
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const Entry& a, const Entry& b) { return a.order < b.order; });
  for (const Entry& e : sorted) e.add(app);
}

}  // namespace tetra::cli
