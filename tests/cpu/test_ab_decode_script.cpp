// scripts/gpu/ab_decode.sh against a stand-in `tetra` that prints the tables of `bench decode` and
// `bench moe` with figures set by an environment knob and a per-call counter: the summary must
// give each variant's lowest, highest and median (of the rounds' medians) per batch, apply `@K=V`
// knobs to its variant only, name the variants whose binary failed, (unless NULL_CONTROL=0)
// run the first variant a second time per round as "<name>-again", knobs included, and pass
// BENCH_ARGS to every `bench decode` and to nothing else.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

const std::string kScript = std::string(TETRA_TEST_DATA_DIR) + "/../../scripts/gpu/ab_decode.sh";

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A `tetra` whose batch-1 median is 3600 + SHIFT + 10 * (its call number), batch 2 4800 + SHIFT,
// and whose MoE layer takes 40.SHIFT us.
void write_fake_tetra(const fs::path& dir) {
  const fs::path bin = dir / "tetra";
  std::ofstream f(bin);
  f << "#!/usr/bin/env bash\n"
       "shift_us=${SHIFT:-0}\n"
       "n=$(cat \"$(dirname \"$0\")/calls\" 2>/dev/null || echo 0); echo $((n + 1)) > "
       "\"$(dirname \"$0\")/calls\"\n"
       "echo \"$*\" >> \"$(dirname \"$0\")/args\"\n"
       "if [ \"$2\" = decode ]; then\n"
       "  echo '| batch | context | median us/step | p90 us | tokens/s | floor us | efficiency | "
       "unique experts/layer |'\n"
       "  echo '|---|---|---|---|---|---|---|---|'\n"
       "  echo \"| 1 | 1024 | $((3600 + shift_us + 10 * n)).5 | 3700 | 270 | 1866.1 | 50% |"
       " 8.0 |\"\n"
       "  echo \"| 2 | 1024 | $((4800 + shift_us)).0 | 4900 | 410 | 2645.9 | 54% | 15.5 |\"\n"
       "  echo '| moe | 1929.1 | 45 |'\n"
       "else\n"
       "  echo \"| cuda-w4a16 | 1 | 8.0 | 40.$shift_us | 41.6 | 2176 | 7.7 | 19.9 | 48.8% |"
       " memory |\"\n"
       "  echo '| cuda-w4a16 | 1 | 14.5 | 20.1 | 13.0 | 4.5 | 52.3 |'\n"
       "fi\n";
  f.close();
  fs::permissions(bin, fs::perms::owner_all);
}

// A fresh scratch folder named after `tag` and this process, holding the stand-in `tetra`.
fs::path scratch_with_fake_tetra(const std::string& tag) {
  const fs::path dir = fs::temp_directory_path() / (tag + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_fake_tetra(dir);
  return dir;
}

// Runs `ENV bash ab_decode.sh DIR/out 2 VARIANTS` (stdout and stderr to DIR/stdout.txt) and returns
// its exit status.
int run_script(const fs::path& dir, const std::string& env, const std::string& variants) {
  const std::string cmd = env + " bash " + kScript + " " + (dir / "out").string() + " 2 " +
                          variants + " > " + (dir / "stdout.txt").string() + " 2>&1";
  return std::system(cmd.c_str());
}

TEST(AbDecodeScript, SummarisesInterleavedRoundsPerVariant) {
  const fs::path dir = scratch_with_fake_tetra("tetra_ab_");
  const std::string bin = (dir / "tetra").string();
  ASSERT_EQ(run_script(dir, "NULL_CONTROL=0 MOE_PRESETS=glm5",
                       "base=" + bin + " knob=" + bin + "@SHIFT=7 gone=" + (dir / "missing").string()),
            0)
      << read_file(dir / "stdout.txt");
  const std::string summary = read_file(dir / "out" / "ab_summary.md");
  // Calls in order: base r1 (decode n=0, moe n=1), knob r1 (n=2, 3), base r2 (n=4, 5), knob r2
  // (n=6, 7): batch 1 of base is 3600.5 and 3640.5, of knob 3627.5 and 3667.5.
  EXPECT_NE(summary.find("| base | 1 | 3600.5-3640.5 | 3620.5 |"), std::string::npos) << summary;
  EXPECT_NE(summary.find("| base | 2 | 4800.0-4800.0 |"), std::string::npos) << summary;
  EXPECT_NE(summary.find("| knob | 1 | 3627.5-3667.5 |"), std::string::npos) << summary;
  EXPECT_NE(summary.find("| knob | 2 | 4807.0-4807.0 |"), std::string::npos) << summary;
  EXPECT_NE(summary.find("| base | 1 | 40 40 |"), std::string::npos) << summary;
  EXPECT_NE(summary.find("| knob | 1 | 40.7 40.7 |"), std::string::npos) << summary;
  EXPECT_EQ(summary.find("| gone | 1 |"), std::string::npos) << summary;
  EXPECT_NE(summary.find("gone round 2: decode exit 127"), std::string::npos) << summary;
  EXPECT_TRUE(fs::exists(dir / "out" / "logs" / "knob.r2.decode.log"));
  EXPECT_EQ(summary.find("-again"), std::string::npos) << summary;
  fs::remove_all(dir);
}

TEST(AbDecodeScript, NullControlRerunsTheFirstVariantLastInEachRound) {
  const fs::path dir = scratch_with_fake_tetra("tetra_ab_null_");
  const std::string bin = (dir / "tetra").string();
  ASSERT_EQ(run_script(dir, "", "base=" + bin + "@SHIFT=3 other=" + bin), 0)
      << read_file(dir / "stdout.txt");
  const std::string summary = read_file(dir / "out" / "ab_summary.md");
  // Calls: base r1 (n=0), other r1 (1), base-again r1 (2), base r2 (3), other r2 (4), base-again
  // r2 (5); batch 1 is 3600 + SHIFT + 10 n, batch 2 4800 + SHIFT.
  EXPECT_NE(summary.find("| base | 1 | 3603.5-3633.5 | 3618.5 |"), std::string::npos) << summary;
  EXPECT_NE(summary.find("| other | 1 | 3610.5-3640.5 | 3625.5 |"), std::string::npos) << summary;
  EXPECT_NE(summary.find("| base-again | 1 | 3623.5-3653.5 | 3638.5 |"), std::string::npos)
      << summary;
  EXPECT_NE(summary.find("| base-again | 2 | 4803.0-4803.0 |"), std::string::npos) << summary;
  EXPECT_NE(summary.find("| other | 2 | 4800.0-4800.0 |"), std::string::npos) << summary;
  EXPECT_TRUE(fs::exists(dir / "out" / "logs" / "base-again.r2.decode.log"));
  fs::remove_all(dir);
}

TEST(AbDecodeScript, BenchArgsReachEveryDecodeRunOnly) {
  const fs::path dir = scratch_with_fake_tetra("tetra_ab_args_");
  const std::string bin = (dir / "tetra").string();
  ASSERT_EQ(run_script(dir, "NULL_CONTROL=0 MOE_PRESETS=glm5 BENCH_ARGS='--logprobs 20'",
                       "a=" + bin + " b=" + bin),
            0)
      << read_file(dir / "stdout.txt");
  std::istringstream calls(read_file(dir / "args"));
  int decode = 0, moe = 0;
  for (std::string line; std::getline(calls, line);) {
    const bool with = line.find("--logprobs 20") != std::string::npos;
    if (line.rfind("bench decode ", 0) == 0) {
      ++decode;
      EXPECT_TRUE(with) << line;
    } else {
      ++moe;
      EXPECT_FALSE(with) << line;
    }
  }
  EXPECT_EQ(decode, 4);  // 2 variants x 2 rounds
  EXPECT_EQ(moe, 4);
  fs::remove_all(dir);
}

}  // namespace
