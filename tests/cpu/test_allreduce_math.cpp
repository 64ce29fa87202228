// The CPU-checkable parts of the multi-GPU all-reduce: the reduction's CPU twin against a
// double-precision sum, the epoch comparison across the 32-bit wrap, the path choice, the size
// list parser, and NCCL's absence turning into a clear error (this machine has no libnccl).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "core/error.h"
#include "core/half.h"
#include "dist/allreduce.h"
#include "dist/allreduce_bench.h"
#include "dist/nccl_communicators.h"
#include "dist/nccl_library.h"
#include "dist/one_shot_math.h"

using namespace tetra;
using namespace tetra::dist;

TEST(OneShotReduceCpu, MatchesDoubleSumRoundedOnceForTwoRanks) {
  // Two bf16 values sum exactly in float32 (8-bit mantissas, exponents within range), so the
  // twin must equal the double sum rounded once to bf16.
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 100.0f);
  std::vector<uint16_t> a(4099), b(4099), out(4099);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = float_to_bf16(d(rng));
    b[i] = float_to_bf16(d(rng) * 1e-3f);
  }
  one_shot_reduce_cpu({a.data(), b.data()}, out.data(), out.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double exact = double(bf16_to_float(a[i])) + double(bf16_to_float(b[i]));
    ASSERT_EQ(out[i], float_to_bf16(float(exact))) << i;
  }
}

TEST(OneShotReduceCpu, SumsInRankOrder) {
  // Order is part of the contract (every rank must get the same bits). In float32,
  // ((1 + 2^-8) + 2^-24) + 2^-24 stays 1 + 2^-8 (each 2^-24 is a tie, rounded to even), a bf16
  // tie that rounds to 1; (2^-24 + 2^-24) + 2^-8 + 1 is exactly 1 + 2^-8 + 2^-23, which rounds
  // up to 1 + 2^-7 in bf16.
  const uint16_t one = float_to_bf16(1.0f), q = float_to_bf16(std::ldexp(1.0f, -8)),
                 t = float_to_bf16(std::ldexp(1.0f, -24));
  uint16_t forward = 0, backward = 0;
  one_shot_reduce_cpu({&one, &q, &t, &t}, &forward, 1);
  one_shot_reduce_cpu({&t, &t, &q, &one}, &backward, 1);
  EXPECT_EQ(bf16_to_float(forward), 1.0f);
  EXPECT_EQ(bf16_to_float(backward), 1.0f + std::ldexp(1.0f, -7));
}

TEST(EpochMath, ReachedAcrossTheWrap) {
  EXPECT_TRUE(epoch_reached(5, 5));
  EXPECT_TRUE(epoch_reached(6, 5));   // a peer one call ahead
  EXPECT_FALSE(epoch_reached(4, 5));  // a peer one call behind
  EXPECT_FALSE(epoch_reached(0, 1));  // fresh flags before the first call
  EXPECT_TRUE(epoch_reached(0, 0xFFFFFFFFu));   // wrapped ahead
  EXPECT_FALSE(epoch_reached(0xFFFFFFFFu, 0));  // behind, across the wrap
  EXPECT_NE(epoch_half(0xFFFFFFFFu), epoch_half(0));  // halves keep alternating over the wrap
}

TEST(AllReducePath, ChosenBySizeAndWorld) {
  AllReduceConfig cfg;
  cfg.one_shot_max_bytes = 1024;
  EXPECT_EQ(choose_all_reduce_path(1 << 20, 1, cfg), AllReducePath::Copy);
  EXPECT_EQ(choose_all_reduce_path(1024, 2, cfg), AllReducePath::OneShot);
  EXPECT_EQ(choose_all_reduce_path(1026, 2, cfg), AllReducePath::Nccl);
  cfg.use_nccl = false;
  EXPECT_THROW(choose_all_reduce_path(1026, 2, cfg), Error);
  cfg.one_shot_max_bytes = 0;
  cfg.use_nccl = true;
  EXPECT_EQ(choose_all_reduce_path(2, 8, cfg), AllReducePath::Nccl);
  EXPECT_EQ(all_reduce_path_name(AllReducePath::OneShot), "one-shot");
}

TEST(AllReduceBenchSizes, RangesListsAndErrors) {
  EXPECT_EQ(parse_byte_sizes("2K..16K"), (std::vector<size_t>{2048, 4096, 8192, 16384}));
  EXPECT_EQ(parse_byte_sizes("4096,1M,2K..4K"),
            (std::vector<size_t>{4096, 1 << 20, 2048, 4096}));
  EXPECT_THROW(parse_byte_sizes("3"), Error);        // odd: not whole bf16 values
  EXPECT_THROW(parse_byte_sizes("1M..2K"), Error);   // backwards
  EXPECT_THROW(parse_byte_sizes("2G"), Error);       // unknown suffix
  EXPECT_THROW(parse_byte_sizes("abc"), Error);
  EXPECT_THROW(parse_byte_sizes(""), Error);
  EXPECT_EQ(format_bytes(2048), "2K");
  EXPECT_EQ(format_bytes(1 << 20), "1M");
  EXPECT_EQ(format_bytes(3000), "3000");
}

TEST(NcclLibrary, MissingLibraryIsAClearError) {
  setenv("TETRA_NCCL_LIBRARY", "/nonexistent/libnccl-for-test.so", 1);
  EXPECT_FALSE(nccl_available());
  try {
    nccl();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/libnccl-for-test.so"), std::string::npos)
        << e.what();
  }
}

TEST(NcclLibrary, MulticastForcedOff) {
  setenv("NCCL_NVLS_ENABLE", "1", 1);
  disable_nvlink_multicast();
  EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
}

TEST(DeviceList, RefusesEmptyOutOfRangeAndRepeats) {
  EXPECT_THROW(check_device_list({}, 2), Error);
  EXPECT_THROW(check_device_list({0, 2}, 2), Error);
  EXPECT_THROW(check_device_list({1, 1}, 2), Error);
  EXPECT_NO_THROW(check_device_list({1, 0}, 2));
}
