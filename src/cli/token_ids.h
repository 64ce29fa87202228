// Parsing of comma-separated token id lists given on the command line ("1,2,3").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tetra::cli {

// "1,2,3" -> {1, 2, 3}. Throws tetra::Error naming `option` and the bad piece for an empty
// list, an empty item, a non-number or a negative/too large id.
std::vector<int32_t> parse_token_ids(const std::string& text, const char* option);

}  // namespace tetra::cli
