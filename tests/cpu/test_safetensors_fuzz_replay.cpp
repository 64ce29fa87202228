// Replays the fuzz seed corpus and a few thousand deterministic mutations of valid files through
// the fuzzer's own check (fuzz/safetensors_fuzz_check.h), without libFuzzer: every input must be
// accepted with all invariants intact or refused with a tetra::Error, never anything else.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "../../fuzz/safetensors_fuzz_check.h"
#include "test_safetensors_util.h"

using namespace tetra;
using namespace tetra::testing;
namespace fs = std::filesystem;

namespace {

const fs::path kCorpus = fs::path(TETRA_TEST_DATA_DIR) / ".." / ".." / "fuzz" / "corpus";

enum class Outcome { Accepted, Refused };

// Runs one input; records a test failure for a broken invariant or a foreign exception.
Outcome run_one(const std::string& bytes, const std::string& what) {
  try {
    const std::string violation =
        fuzz::check_safetensors_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    EXPECT_EQ(violation, "") << what;
    return Outcome::Accepted;
  } catch (const Error&) {
    return Outcome::Refused;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": non-tetra exception: " << e.what();
  } catch (...) {
    ADD_FAILURE() << what << ": unknown exception";
  }
  return Outcome::Refused;
}

std::vector<std::pair<std::string, std::string>> corpus_files() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : fs::directory_iterator(kCorpus))
    out.emplace_back(e.path().filename().string(), read_bytes(e.path()));
  std::sort(out.begin(), out.end());
  return out;
}

// Pieces a mutation splices in: JSON tokens and numbers near the edges the parser guards.
const std::vector<std::string> kTokens = {"\"dtype\"",
                                          "\"shape\"",
                                          "\"data_offsets\"",
                                          "\"__metadata__\"",
                                          "\"F32\"",
                                          "\"BF16\"",
                                          "\"F64\"",
                                          "-1",
                                          "0",
                                          "18446744073709551615",
                                          "18446744073709551616",
                                          "9223372036854775807",
                                          "4294967296",
                                          "1.5",
                                          "1e3",
                                          "null",
                                          "[]",
                                          "{}",
                                          "[",
                                          "]",
                                          "{",
                                          "}",
                                          ",",
                                          ":",
                                          "\"",
                                          "\\u0000",
                                          "\xff",
                                          " "};

std::string mutate(std::string s, std::mt19937& rng) {
  auto pick = [&](size_t n) { return n ? size_t(rng() % n) : 0; };
  const int steps = 1 + int(rng() % 3);
  for (int step = 0; step < steps; ++step) {
    switch (rng() % 8) {
      case 0:  // flip one bit
        if (!s.empty()) s[pick(s.size())] ^= char(1u << (rng() % 8));
        break;
      case 1:  // overwrite a byte
        if (!s.empty()) s[pick(s.size())] = char(rng() & 0xff);
        break;
      case 2:  // insert a token
        s.insert(pick(s.size() + 1), kTokens[pick(kTokens.size())]);
        break;
      case 3: {  // erase a short range
        const size_t at = pick(s.size());
        s.erase(at, 1 + pick(8));
        break;
      }
      case 4:  // truncate
        s.resize(pick(s.size() + 1));
        break;
      case 5: {  // duplicate a range (e.g. a whole entry, giving duplicate keys or overlaps)
        const size_t at = pick(s.size());
        const std::string chunk = s.substr(at, 1 + pick(48));
        s.insert(pick(s.size() + 1), chunk);
        break;
      }
      case 6:  // change a digit inside the header
        for (int tries = 0; tries < 16 && !s.empty(); ++tries) {
          char& c = s[pick(s.size())];
          if (c >= '0' && c <= '9') {
            c = char('0' + rng() % 10);
            break;
          }
        }
        break;
      case 7:  // nudge the length prefix
        if (s.size() >= 8) s[0] = char(uint8_t(s[0]) + uint8_t(int(rng() % 17) - 8));
        break;
    }
  }
  return s;
}

}  // namespace

TEST(SafetensorsFuzzReplay, SeedCorpus) {
  const auto files = corpus_files();
  ASSERT_GE(files.size(), 10u) << "seed corpus missing at " << kCorpus;
  size_t valid = 0, broken = 0;
  for (const auto& [name, bytes] : files) {
    const Outcome o = run_one(bytes, name);
    if (name.starts_with("valid_")) {
      EXPECT_EQ(o, Outcome::Accepted) << name;
      ++valid;
    } else if (name.starts_with("broken_")) {
      EXPECT_EQ(o, Outcome::Refused) << name;
      ++broken;
    }
  }
  EXPECT_GE(valid, 3u);
  EXPECT_GE(broken, 5u);
}

TEST(SafetensorsFuzzReplay, DeterministicMutationsOfValidFiles) {
  std::vector<std::string> seeds;
  for (const auto& [name, bytes] : corpus_files())
    if (name.starts_with("valid_")) seeds.push_back(bytes);
  ASSERT_FALSE(seeds.empty());
  std::mt19937 rng(20240611);
  size_t accepted = 0, refused = 0;
  constexpr int kMutations = 6000;
  for (int i = 0; i < kMutations; ++i) {
    const std::string input = mutate(seeds[size_t(i) % seeds.size()], rng);
    (run_one(input, "mutation #" + std::to_string(i)) == Outcome::Accepted ? accepted : refused)++;
    if (::testing::Test::HasFailure()) break;  // one clear failure beats thousands
  }
  // Both outcomes must be common, or the mutations would test nothing.
  std::cout << "mutations: " << accepted << " accepted, " << refused << " refused\n";
  EXPECT_GT(accepted, size_t(kMutations) / 20) << "accepted " << accepted;
  EXPECT_GT(refused, size_t(kMutations) / 4) << "refused " << refused;
}
