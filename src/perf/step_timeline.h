// Where a step's time goes, kernel by kernel: the analysis behind `tetra bench decode --timeline`.
// Input: the kernels the device ran (CUPTI records, server/kernel_tracer.h) and the host-side
// windows of the traced steps. Each step's kernels are ordered by start; for kernel i
//   frontier_i = max(end_j, j < i)          (the step's latest end before i)
//   gap_i      = max(0, start_i - frontier_i)  (time nothing of this step ran before i began)
//   exposed_i  = max(0, end_i - frontier_i)    (how much i pushed the step's end out)
// so the exposed times of a step add up to its span (first start to last end): a kernel that
// runs entirely under an earlier one (a PDL dependent resident early, a side stream) costs 0,
// and launch bubbles are charged to the kernel that ends them. Per position in the step and per
// kernel name, the median over steps of duration, gap and exposed time.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tetra::perf {

struct TimelineKernel {
  std::string name;  // mangled or plain
  uint64_t start_ns = 0, end_ns = 0;
};

struct TimelineWindow {  // one traced step, host clock on the records' timebase
  uint64_t begin_ns = 0, end_ns = 0;
};

struct TimelinePosition {  // the i-th kernel of every step
  std::string name;        // short name (perf/kernel_name.h)
  double start_us = 0;     // from the step's first kernel start
  double duration_us = 0, gap_us = 0, exposed_us = 0;
};

struct TimelineByName {
  std::string name;
  int per_step = 0;  // launches per step
  double duration_us = 0, gap_us = 0, exposed_us = 0;  // per step, summed over its launches
};

struct StepTimeline {
  int steps = 0;             // steps whose kernel sequences agreed (the others are dropped)
  int dropped_steps = 0;
  double span_us = 0;        // median first start -> last end
  double busy_us = 0;        // median time at least one kernel ran (span minus the gaps)
  std::vector<TimelinePosition> positions;  // medians per position
  std::vector<TimelineByName> by_name;      // sorted by exposed time, largest first
};

// Assigns kernels to the windows that contain their start and analyses the steps. Steps whose
// kernel-name sequence differs from the most common one are dropped (and counted). Throws
// tetra::Error when no window holds a kernel.
StepTimeline analyse_step_timeline(const std::vector<TimelineKernel>& kernels,
                                   const std::vector<TimelineWindow>& windows);

// One period of the step's repeating part (a layer), taken from the middle of the sequence:
// {first position, period}; {0, size} when nothing repeats.
struct TimelineRange {
  int first = 0, count = 0;
};
TimelineRange middle_period(const StepTimeline& t);

// Markdown: the per-name table, and the positions [first, first + count) of the sequence.
std::string step_timeline_markdown(const StepTimeline& t, int first, int count);

}  // namespace tetra::perf
