// Parses sizes like "5GB", "500MB", "1.5G", "4096" (bytes) for --max-shard-size.
#pragma once
#include <cstdint>
#include <string>

namespace tetra::cli {
uint64_t parse_size(const std::string& text);
}  // namespace tetra::cli
