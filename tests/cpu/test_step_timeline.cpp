// perf/step_timeline.h: kernel names, step assignment, gaps and exposed times on synthetic traces.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "perf/kernel_name.h"
#include "perf/step_timeline.h"

namespace tetra::perf {
namespace {

TEST(StepTimeline, ShortNamesDropNamespacesReturnTypeAndParameters) {
  // void tetra::moe_detail::decode_kernel<4, true>(tetra::moe_detail::Args, int)
  EXPECT_EQ(short_kernel_name("_ZN5tetra10moe_detail13decode_kernelILi4ELb1EEEvNS0_4ArgsEi"),
            "decode_kernel<4, true>");
  // void (anonymous namespace)::norm_kernel(float const*), and the same inside a namespace
  EXPECT_EQ(short_kernel_name("_ZN12_GLOBAL__N_111norm_kernelEPKf"), "norm_kernel");
  EXPECT_EQ(short_kernel_name("_ZN5tetra12_GLOBAL__N_111norm_kernelEPKf"), "norm_kernel");
  // A template argument that is itself qualified loses its qualifiers too.
  EXPECT_EQ(short_kernel_name("_ZN5tetra4gemvINS_2ns4WorkEEEvT_"), "gemv<Work>");
  EXPECT_EQ(short_kernel_name("plain_c_kernel"), "plain_c_kernel");
  EXPECT_EQ(short_kernel_name("y"), "y");  // not demangled as the type unsigned long long
}

// Three kernels per step (ns): a at [0, 10), b at [4, 8) under a, c at [13, 20) after a gap of 3.
std::vector<TimelineKernel> step_at(uint64_t t0) {
  return {{"a", t0 + 0, t0 + 10'000}, {"b", t0 + 4'000, t0 + 8'000}, {"c", t0 + 13'000, t0 + 20'000}};
}

TEST(StepTimeline, ExposedTimesAddUpToTheSpanAndGapsAreCharged) {
  std::vector<TimelineKernel> k;
  std::vector<TimelineWindow> w;
  for (uint64_t s = 0; s < 5; ++s) {
    const uint64_t t0 = 1'000'000 * (s + 1);
    auto one = step_at(t0);
    std::shuffle(one.begin(), one.end(), std::mt19937(uint32_t(s)));  // records arrive unordered
    k.insert(k.end(), one.begin(), one.end());
    w.push_back({t0 - 500, t0 + 500'000});
  }
  k.push_back({"outside", 100, 200});  // in no window: ignored
  const StepTimeline t = analyse_step_timeline(k, w);
  EXPECT_EQ(t.steps, 5);
  EXPECT_EQ(t.dropped_steps, 0);
  ASSERT_EQ(t.positions.size(), 3u);
  EXPECT_EQ(t.positions[1].name, "b");
  EXPECT_DOUBLE_EQ(t.span_us, 20.0);
  EXPECT_DOUBLE_EQ(t.busy_us, 17.0);
  EXPECT_DOUBLE_EQ(t.positions[0].exposed_us, 10.0);
  EXPECT_DOUBLE_EQ(t.positions[1].exposed_us, 0.0);  // entirely under a
  EXPECT_DOUBLE_EQ(t.positions[1].duration_us, 4.0);
  EXPECT_DOUBLE_EQ(t.positions[2].gap_us, 3.0);
  EXPECT_DOUBLE_EQ(t.positions[2].exposed_us, 10.0);  // its 7 us plus the 3 us bubble
  EXPECT_DOUBLE_EQ(t.positions[2].start_us, 13.0);
  double sum = 0;
  for (const auto& p : t.positions) sum += p.exposed_us;
  EXPECT_DOUBLE_EQ(sum, t.span_us);
  ASSERT_EQ(t.by_name.size(), 3u);
  EXPECT_EQ(t.by_name.back().name, "b");  // sorted by exposed time
}

TEST(StepTimeline, PerNameSumsOverRepeatsAndOddStepsAreDropped) {
  std::vector<TimelineKernel> k;
  std::vector<TimelineWindow> w;
  for (uint64_t s = 0; s < 4; ++s) {
    const uint64_t t0 = 1'000'000 * (s + 1);
    // x y x y: two "layers", x 2 us then y 1 us each, back to back.
    k.push_back({"x", t0, t0 + 2'000});
    k.push_back({"y", t0 + 2'000, t0 + 3'000});
    k.push_back({"x", t0 + 3'000, t0 + 5'000});
    k.push_back({"y", t0 + 5'000, t0 + 6'000});
    if (s == 2) k.push_back({"stray", t0 + 7'000, t0 + 8'000});
    w.push_back({t0, t0 + 100'000});
  }
  const StepTimeline t = analyse_step_timeline(k, w);
  EXPECT_EQ(t.steps, 3);
  EXPECT_EQ(t.dropped_steps, 1);
  ASSERT_EQ(t.by_name.size(), 2u);
  EXPECT_EQ(t.by_name[0].name, "x");
  EXPECT_EQ(t.by_name[0].per_step, 2);
  EXPECT_DOUBLE_EQ(t.by_name[0].exposed_us, 4.0);
  EXPECT_DOUBLE_EQ(t.by_name[1].duration_us, 2.0);
  const TimelineRange r = middle_period(t);
  EXPECT_EQ(r.count, 2);
  const std::string md = step_timeline_markdown(t, r.first, r.count);
  EXPECT_NE(md.find("| `x` | 2 | 4.0 | 0.0 | 4.0 | 66.7% |"), std::string::npos) << md;
}

TEST(StepTimeline, NoKernelInAnyWindowIsAnError) {
  EXPECT_THROW(analyse_step_timeline({{"a", 5, 6}}, {{10, 20}}), tetra::Error);
}

}  // namespace
}  // namespace tetra::perf
