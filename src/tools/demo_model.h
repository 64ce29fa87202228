// Where `tetra demo` keeps its tiny NVFP4 model, shared by every command that uses it (demo,
// serve without --model): <cache>/demo-<preset>-nvfp4-<hash of the preset's config>, so a preset
// whose shape changes gets a new entry instead of a stale one.
#pragma once
#include <filesystem>
#include <string>

namespace tetra {

// cache_dir empty: $HOME/.cache/tetra (/tmp/.cache/tetra without HOME).
std::filesystem::path demo_model_path(const std::string& cache_dir, const std::string& preset);

}  // namespace tetra
