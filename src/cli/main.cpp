// tetra: one binary, one subcommand per job.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"
#include "core/version.h"

int main(int argc, char** argv) {
  CLI::App app{"Tetra: an inference engine for NVFP4 Mixture-of-Experts models", "tetra"};
  app.set_version_flag("--version", std::string("tetra 0.1.0 (") + tetra::git_commit() + ")");
  app.require_subcommand(1);
  tetra::cli::add_registered_commands(app);
  // CLI11 answers an unknown first word with "a subcommand is required": name it instead.
  std::string names;
  bool known = false;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names += " " + sub->get_name();
    known = known || (argc > 1 && sub->get_name() == argv[1]);
  }
  if (argc > 1 && argv[1][0] != '-' && !known) {
    std::fprintf(stderr, "tetra: error: unknown command '%s' (commands:%s)\n", argv[1], names.c_str());
    return 109;
  }
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
