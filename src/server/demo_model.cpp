#include "server/demo_model.h"

#include "tools/demo_model.h"
#include "tools/model_writer.h"

namespace tetra::server {

std::filesystem::path demo_model_dir(const std::string& cache_dir, const std::string& preset) {
  const std::filesystem::path dir = demo_model_path(cache_dir, preset);
  if (!std::filesystem::exists(dir / "config.json")) {
    MakeModelOptions opt;
    opt.preset = preset;
    opt.dtype = "nvfp4";
    opt.seed = 1;
    make_model(dir, opt);
  }
  return dir;
}

}  // namespace tetra::server
