#include "server/demo_model.h"

#include <cstdio>
#include <cstdlib>

#include "format/model_config.h"
#include "format/presets.h"
#include "tools/model_writer.h"

namespace tetra::server {

std::filesystem::path demo_model_dir(const std::string& cache_dir, const std::string& preset) {
  namespace fs = std::filesystem;
  // FNV-1a of the preset's config, 12 hex digits (the key cmd_demo.cpp uses).
  const std::string text = model_config_to_json(preset_config(preset)).dump();
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  char key[17];
  std::snprintf(key, sizeof key, "%016llx", (unsigned long long)h);
  fs::path root = cache_dir;
  if (root.empty()) {
    const char* home = std::getenv("HOME");
    root = fs::path(home ? home : "/tmp") / ".cache" / "tetra";
  }
  const fs::path dir = root / ("demo-" + preset + "-nvfp4-" + std::string(key, 12));
  if (!fs::exists(dir / "config.json")) {
    MakeModelOptions opt;
    opt.preset = preset;
    opt.dtype = "nvfp4";
    opt.seed = 1;
    make_model(dir, opt);
  }
  return dir;
}

}  // namespace tetra::server
