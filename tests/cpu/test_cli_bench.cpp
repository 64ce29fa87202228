// `tetra bench moe` from the outside: argument errors exit 1 with a message naming the bad value
// (checked before any GPU work), a machine without a CUDA GPU exits 4 saying so.
#include <gtest/gtest.h>

#include "core/cuda_check.h"
#include "cpu/cli_runner.h"
#include "perf/block_stamps.h"

using tetra::test::run_tetra;

namespace {

void expect_error(const std::string& args, int code, const std::string& words) {
  const auto r = run_tetra(args);
  EXPECT_EQ(r.code, code) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(words), std::string::npos) << args << "\n" << r.output;
}

TEST(CliBench, BadArgumentsAreRefusedNamingTheValue) {
  expect_error("bench moe --tokens 1,x", 1, "--tokens: 'x' is not a whole number");
  expect_error("bench moe --tokens 4,,16", 1, "--tokens: '' is not a whole number");
  expect_error("bench moe --tokens 0", 1, "--tokens: 0 is below the minimum 1");
  expect_error("bench moe --tokens 70000", 1, "--tokens: 70000 is outside 1..65536");
  expect_error("bench moe --preset nope", 1, "unknown preset 'nope'");
  expect_error("bench moe --routing zipf", 1, "--routing: 'zipf' is neither uniform nor skewed");
  expect_error("bench moe --backend foo", 1, "unknown backend 'foo'; known: all, cpu, cuda-w4a16");
  expect_error("bench moe --iters -3", 1, "--iters must be >= 0");
}

TEST(CliBench, BenchNeedsASubcommand) {
  const auto r = run_tetra("bench");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("subcommand"), std::string::npos) << r.output;
  const auto help = run_tetra("bench --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.output.find("moe"), std::string::npos) << help.output;
}

TEST(CliBench, WithoutAGpuTheMoeBenchSaysSoAndExits4) {
  if (tetra::cuda_available()) GTEST_SKIP() << "this machine has a GPU";
  expect_error("bench moe --preset glm5 --tokens 1,4", 4, "needs a CUDA GPU; none was found");
}

// The per-block stamps are a build option: without it the flag is refused before any GPU work,
// saying how to get them; with --tp/--ep (several GPUs) it is refused too.
TEST(CliBench, BlockStampsNeedTheirBuildOptionAndOneGpu) {
  const std::string run = "bench decode --preset glm4.5-air --random-weights --block-stamps /tmp/s";
  if (!tetra::perf::block_stamps_compiled()) {
    expect_error(run, 1, "this build has no block stamps (configure with -DTETRA_BLOCK_STAMPS=ON)");
  } else {
    expect_error(run + " --tp 2", 1, "--block-stamps records one GPU");
  }
}

}  // namespace
