#include "tools/demo_model.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "format/model_config.h"
#include "format/presets.h"

namespace tetra {
namespace {

// FNV-1a of the preset's config JSON, 12 hex digits.
std::string config_key(const std::string& preset) {
  const std::string text = model_config_to_json(preset_config(preset)).dump();
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
  return std::string(buf, 12);
}

}  // namespace

std::filesystem::path demo_model_path(const std::string& cache_dir, const std::string& preset) {
  std::filesystem::path root = cache_dir;
  if (root.empty()) {
    const char* home = std::getenv("HOME");
    root = std::filesystem::path(home ? home : "/tmp") / ".cache" / "tetra";
  }
  return root / ("demo-" + preset + "-nvfp4-" + config_key(preset));
}

}  // namespace tetra
