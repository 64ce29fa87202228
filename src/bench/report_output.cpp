#include "bench/report_output.h"

#include <fstream>

#include "core/error.h"

namespace tetra::bench {

void emit_report(const ReportOutput& o, const std::string& markdown, const nlohmann::json& json,
                 std::ostream& out) {
  const std::string json_text = json.dump(2) + "\n";
  if (o.json_path == kJsonToStdout)
    out << json_text;
  else
    out << markdown;
  if (!o.markdown_path.empty()) write_text_file(o.markdown_path, markdown);
  if (!o.json_path.empty() && o.json_path != kJsonToStdout) write_text_file(o.json_path, json_text);
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  if (!f) TETRA_FAIL("cannot write ", path);
  f << text;
  if (!f) TETRA_FAIL("error writing ", path);
}

}  // namespace tetra::bench
