// The demo model `tetra demo` caches (a tiny NVFP4 checkpoint made from a preset), found or made
// here too so `tetra serve` without --model serves it. The directory name keys on the preset's
// config exactly as cmd_demo.cpp does, so both commands share one cache entry.
#pragma once
#include <filesystem>
#include <string>

namespace tetra::server {

// cache_dir empty: ~/.cache/tetra. Makes the model when it is not there yet.
std::filesystem::path demo_model_dir(const std::string& cache_dir, const std::string& preset);

}  // namespace tetra::server
