// Where a benchmark's report goes: stdout gets the markdown table, or, with --json and no path,
// the JSON report instead (to pipe into a tool); --json PATH and --markdown PATH also write files.
#pragma once
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

namespace tetra::bench {

// --json's value when it is given without a path.
inline constexpr const char* kJsonToStdout = "-";

struct ReportOutput {
  std::string json_path;      // "" none, kJsonToStdout, or a file
  std::string markdown_path;  // "" none, or a file
};

// Prints `json` (json_path == kJsonToStdout) or `markdown` to `out` and writes the files named.
// tetra::Error when a file cannot be written.
void emit_report(const ReportOutput& o, const std::string& markdown, const nlohmann::json& json,
                 std::ostream& out);

// Writes `text` to `path` (replacing it); tetra::Error when the file cannot be written.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace tetra::bench
