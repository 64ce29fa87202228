#include "cli/bench_commands.h"

namespace tetra::cli {

void add_report_options(CLI::App& cmd, bench::ReportOutput& out) {
  cmd.add_option("--json", out.json_path,
                 "also write the results as JSON to PATH; without PATH, print the JSON to stdout "
                 "instead of the markdown table")
      ->expected(0, 1)
      ->default_str(bench::kJsonToStdout)
      ->option_text("[PATH]");
  cmd.add_option("--markdown", out.markdown_path, "also write the markdown table to this file");
}

}  // namespace tetra::cli
