// Small pieces several subcommands share: comma-separated number lists.
#pragma once
#include <string>
#include <vector>

namespace tetra::cli {

// "1,4,16" -> {1, 4, 16}. Refuses an empty list, a piece that is not a whole number and a value
// below `min_value`, naming `option` and the bad piece (tetra::Error).
std::vector<int> parse_int_list(const std::string& text, const std::string& option,
                                int min_value = 1);

}  // namespace tetra::cli
