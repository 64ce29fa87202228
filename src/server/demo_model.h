// The demo model `tetra demo` caches (a tiny NVFP4 checkpoint made from a preset), found or made
// here too so `tetra serve` without --model serves it (same cache entry: tools/demo_model.h).
#pragma once
#include <filesystem>
#include <string>

namespace tetra::server {

// cache_dir empty: ~/.cache/tetra. Makes the model when it is not there yet.
std::filesystem::path demo_model_dir(const std::string& cache_dir, const std::string& preset);

}  // namespace tetra::server
