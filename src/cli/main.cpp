// tetra: one binary, one subcommand per job.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"Tetra: an inference engine for NVFP4 Mixture-of-Experts models", "tetra"};
  app.set_version_flag("--version", std::string("tetra 0.1.0 (") + TETRA_GIT_COMMIT + ")");
  app.require_subcommand(1);
  tetra::cli::add_inspect(app);
  tetra::cli::add_quantize(app);
  tetra::cli::add_make_model(app);
  tetra::cli::add_check(app);
  tetra::cli::add_demo(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tetra::Error& e) {
    std::fprintf(stderr, "tetra: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tetra: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
