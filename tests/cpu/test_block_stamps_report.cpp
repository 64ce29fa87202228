// scripts/gpu/block_stamps.py read against records written in perf/block_stamps.h's layout:
// synthetic decode steps whose figures are known (phase times, blocks per SM, a GEMM2 second
// wave), so a change of the record layout on either side, or of what the report computes, fails
// here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "perf/block_stamps.h"

namespace {

const std::string kScript = std::string(TETRA_TEST_DATA_DIR) + "/../../scripts/gpu/block_stamps.py";

struct Record {
  int kind = 0;
  int launch = 0;
  uint32_t block = 0;
  uint32_t sm = 0;
  std::vector<uint64_t> t;  // ns; up to 8 phases
};

void write_records(const std::string& path, const std::vector<Record>& records) {
  std::ofstream f(path, std::ios::binary);
  for (const Record& r : records) {
    uint64_t w[tetra::perf::kBlockStampWords] = {};
    w[0] = (uint64_t(r.kind) << 56) | (uint64_t(r.launch) << 32) | r.block;
    w[1] = r.sm;
    for (size_t i = 0; i < r.t.size() && i + 2 < std::size(w); ++i) w[i + 2] = r.t[i];
    f.write(reinterpret_cast<const char*>(w), sizeof(w));
  }
}

struct ReportRun {
  int status = 0;
  std::string out;
};

ReportRun report(const std::string& path) {
  ReportRun r;
  const std::string cmd = "python3 " + kScript + " " + path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) r.out.append(buf, n);
  r.status = pclose(p);
  return r;
}

// The value printed after `key` on its report line (NaN when the line is missing).
double figure(const std::string& out, const std::string& key) {
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const size_t at = line.find(key);
    if (at == std::string::npos) continue;
    const std::string rest = line.substr(at + key.size());
    const size_t end = rest.find_last_not_of(" \t");
    const size_t start = rest.find_last_of(" \t", end);
    return std::stod(rest.substr(start + 1, end - start));
  }
  return std::nan("");
}

std::string temp_path(const char* name) {
  const int seed = ::testing::UnitTest::GetInstance()->random_seed();
  return testing::TempDir() + "/" + name + "_" + std::to_string(seed);
}

// One MoE chain per layer, times in ns from t0 (the first token-path block's start):
// token path 4 blocks (the last one routes), GEMM1 12 blocks on 4 SMs (3 each, SM 0 ends last),
// GEMM2 10 blocks, the last 2 starting after the first GEMM2 block ended.
std::vector<Record> moe_layer(uint64_t t0, int launch0) {
  using namespace tetra::perf;
  std::vector<Record> r;
  for (uint32_t b = 0; b < 4; ++b) {
    const bool last = b == 3;
    r.push_back({kStampTokenPath, launch0, b, b,
                 {t0 + 100 * b, t0 + 1000, t0 + 2000 + 100 * b, last ? t0 + 5000 : 0,
                  last ? t0 + 6000 : t0 + 2500}});
  }
  for (uint32_t b = 0; b < 12; ++b)
    r.push_back({kStampMoeGemm1, launch0 + 1, b, b % 4,
                 {t0 + 7000, t0 + 7500, t0 + 9000, t0 + (b % 4 == 0 ? 20000 : 18000)}});
  for (uint32_t b = 0; b < 10; ++b) {
    const bool second_wave = b >= 8;
    r.push_back({kStampMoeGemm2, launch0 + 2, b, b % 4,
                 {t0 + (second_wave ? 26000 : 8000), t0 + 21000, t0 + 22000,
                  t0 + (second_wave ? 30000 : 25000 + 100 * b)}});
  }
  return r;
}

}  // namespace

TEST(BlockStampsReport, MoeChainFiguresAreAveragedOverLayers) {
  std::vector<Record> all;
  for (int layer = 0; layer < 3; ++layer) {
    const auto l = moe_layer(1'000'000'000ull + uint64_t(layer) * 100'000, layer * 3);
    all.insert(all.end(), l.begin(), l.end());
  }
  const std::string path = temp_path("moe_stamps.bin");
  write_records(path, all);
  const ReportRun r = report(path);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("3 layers"), std::string::npos) << r.out;
  EXPECT_DOUBLE_EQ(figure(r.out, "token path: blocks"), 4.0) << r.out;
  EXPECT_DOUBLE_EQ(figure(r.out, "token path: routed"), 5.0) << r.out;
  EXPECT_DOUBLE_EQ(figure(r.out, "token path: last block end"), 6.0) << r.out;
  EXPECT_DOUBLE_EQ(figure(r.out, "GEMM1: first block start"), 7.0) << r.out;
  EXPECT_DOUBLE_EQ(figure(r.out, "GEMM1: first batch multiplied (median)"), 9.0) << r.out;
  EXPECT_DOUBLE_EQ(figure(r.out, "GEMM1: blocks per SM (min)"), 3.0) << r.out;
  EXPECT_DOUBLE_EQ(figure(r.out, "GEMM1: blocks per SM (max)"), 3.0) << r.out;
  EXPECT_DOUBLE_EQ(figure(r.out, "GEMM1: last block end"), 20.0) << r.out;
  EXPECT_DOUBLE_EQ(figure(r.out, "GEMM2: blocks started before GEMM1 end"), 8.0) << r.out;
  EXPECT_DOUBLE_EQ(figure(r.out, "GEMM2: blocks started after the first GEMM2 block ended"), 2.0)
      << r.out;
  EXPECT_DOUBLE_EQ(figure(r.out, "GEMM2: last block end"), 30.0) << r.out;
  std::remove(path.c_str());
}

TEST(BlockStampsReport, AttentionChainNeedsAllThreeKernels) {
  using namespace tetra::perf;
  const uint64_t t0 = 5'000'000'000ull;
  std::vector<Record> all;
  for (uint32_t b = 0; b < 6; ++b)
    all.push_back({kStampQkvGemv, 0, b, b, {t0, t0 + 500, t0 + 10000 + 100 * b}});
  for (uint32_t b = 0; b < 4; ++b)  // 4 attention blocks on 2 SMs
    all.push_back({kStampAttention, 1, b, b / 2,
                   {t0 + 9000, t0 + 11000, t0 + 13000, t0 + 13500, t0 + 14000, t0 + 16000,
                    t0 + 17000}});
  for (uint32_t b = 0; b < 5; ++b)  // blocks 3 and 4 start after the attention's last block ends
    all.push_back({kStampStreamGemv, 2, b, b,
                   {b < 3 ? t0 + 12000 : t0 + 17200, t0 + 17500, t0 + 17600,
                    b < 3 ? t0 + 22000 : t0 + 24000}});
  const std::string path = temp_path("attn_stamps.bin");
  write_records(path, all);
  ReportRun r = report(path);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_DOUBLE_EQ(figure(r.out, "attn: SMs"), 2.0) << r.out;
  EXPECT_DOUBLE_EQ(figure(r.out, "attn: blocks started before q/k/v end"), 4.0) << r.out;
  EXPECT_DOUBLE_EQ(figure(r.out, "o_proj: last block end"), 24.0) << r.out;
  EXPECT_DOUBLE_EQ(figure(r.out, "o_proj: blocks started before attn end"), 3.0) << r.out;
  EXPECT_DOUBLE_EQ(figure(r.out, "o_proj: last end, blocks started before attn end"), 22.0)
      << r.out;
  EXPECT_DOUBLE_EQ(figure(r.out, "o_proj: last end, blocks started after attn end"), 24.0)
      << r.out;

  // Without the o_proj launch the chain is incomplete: nothing to report, non-zero exit.
  all.resize(all.size() - 5);
  write_records(path, all);
  r = report(path);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("no q/k/v -> attention -> o_proj or MoE chains"), std::string::npos)
      << r.out;
  std::remove(path.c_str());
}
