// Where a benchmark's report goes (bench/report_output.h): the markdown table on stdout, or the
// JSON instead for `--json` without a path; `--json PATH` and `--markdown PATH` write files too.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <sstream>

#include "bench/report_output.h"
#include "core/error.h"
#include "cpu/cli_runner.h"

namespace tetra::bench {
namespace {

const std::string kMarkdown = "| backend | tokens |\n|---|---|\n| cuda-bf16 | 1 |\n";
const nlohmann::json kJson = {{"rows", {{{"backend", "cuda-bf16"}, {"tokens", 1}}}}};

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(ReportOutput, JsonWithoutAPathReplacesTheMarkdownOnStdout) {
  test::TempDir dir("report");
  ReportOutput o;
  o.json_path = kJsonToStdout;
  o.markdown_path = (dir.path() / "table.md").string();
  std::ostringstream out;
  emit_report(o, kMarkdown, kJson, out);
  EXPECT_EQ(nlohmann::json::parse(out.str()), kJson);
  EXPECT_EQ(out.str().find("| backend"), std::string::npos);
  EXPECT_EQ(read(dir.path() / "table.md"), kMarkdown);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "-"));
}

TEST(ReportOutput, JsonPathKeepsTheMarkdownOnStdout) {
  test::TempDir dir("report");
  ReportOutput o;
  o.json_path = (dir.path() / "r.json").string();
  std::ostringstream out;
  emit_report(o, kMarkdown, kJson, out);
  EXPECT_EQ(out.str(), kMarkdown);
  EXPECT_EQ(nlohmann::json::parse(read(dir.path() / "r.json")), kJson);
  std::ostringstream plain;
  emit_report(ReportOutput{}, kMarkdown, kJson, plain);
  EXPECT_EQ(plain.str(), kMarkdown);
  o.json_path = (dir.path() / "no-such-dir" / "r.json").string();
  EXPECT_THROW(emit_report(o, kMarkdown, kJson, out), Error);
}

// The command lines: --json takes an optional path and never swallows the option after it (the
// argument errors below are checked before any GPU is looked for).
TEST(ReportOutput, BenchCommandsTakeJsonWithOrWithoutAPath) {
  for (const std::string cmd : {"bench moe", "bench decode --preset glm4.5-air --random-weights"}) {
    const std::string bad = cmd == "bench moe" ? "--tokens 0" : "--batch 0";
    const std::string said = cmd == "bench moe" ? "--tokens: 0" : "--batch: 0";
    for (const std::string json : {"--json", "--json out.json", "--json -"}) {
      const test::RunResult r = test::run_tetra(cmd + " " + json + " " + bad);
      EXPECT_EQ(r.code, 1) << cmd << " " << json << "\n" << r.output;
      EXPECT_NE(r.output.find(said), std::string::npos) << cmd << " " << json << "\n" << r.output;
    }
    const test::RunResult help = test::run_tetra(cmd + " --help");
    EXPECT_NE(help.output.find("--json [PATH]"), std::string::npos) << help.output;
    EXPECT_NE(help.output.find("without PATH, print the JSON to stdout"), std::string::npos)
        << help.output;
  }
}

}  // namespace
}  // namespace tetra::bench
