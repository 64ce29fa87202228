// Per-kernel analysis of traced steps (see step_timeline.h).
#include "perf/step_timeline.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "core/error.h"
#include "perf/kernel_name.h"

namespace tetra::perf {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct StepKernels {
  std::vector<const TimelineKernel*> k;  // by start
};

}  // namespace

StepTimeline analyse_step_timeline(const std::vector<TimelineKernel>& kernels,
                                   const std::vector<TimelineWindow>& windows) {
  std::vector<StepKernels> steps(windows.size());
  for (const TimelineKernel& k : kernels)
    for (size_t w = 0; w < windows.size(); ++w)
      if (k.start_ns >= windows[w].begin_ns && k.start_ns < windows[w].end_ns) {
        steps[w].k.push_back(&k);
        break;
      }
  std::erase_if(steps, [](const StepKernels& s) { return s.k.empty(); });
  if (steps.empty()) TETRA_FAIL("no traced kernel started inside a timed step");
  for (StepKernels& s : steps)
    std::stable_sort(s.k.begin(), s.k.end(), [](const TimelineKernel* a, const TimelineKernel* b) {
      return a->start_ns < b->start_ns;
    });

  // The most common name sequence is the step; a step with another one (a warm-up effect, a
  // stray kernel) would misalign the positions.
  std::map<std::vector<std::string>, int> seq_count;
  std::vector<std::vector<std::string>> seqs;
  for (const StepKernels& s : steps) {
    std::vector<std::string> names;
    for (const TimelineKernel* k : s.k) names.push_back(short_kernel_name(k->name));
    ++seq_count[names];
    seqs.push_back(std::move(names));
  }
  const auto best = std::max_element(seq_count.begin(), seq_count.end(),
                                     [](const auto& a, const auto& b) { return a.second < b.second; });
  const std::vector<std::string> names = best->first;
  const size_t P = names.size();

  StepTimeline t;
  std::vector<std::vector<double>> start(P), dur(P), gap(P), exposed(P);
  std::vector<double> spans, busy;
  std::map<std::string, std::vector<double>> name_dur, name_gap, name_exp;
  std::map<std::string, int> name_count;
  for (const std::string& n : names) ++name_count[n];
  for (size_t si = 0; si < steps.size(); ++si) {
    if (seqs[si] != names) {
      ++t.dropped_steps;
      continue;
    }
    ++t.steps;
    const auto& k = steps[si].k;
    const uint64_t t0 = k.front()->start_ns;
    uint64_t frontier = t0, last = t0;
    double gaps = 0;
    std::map<std::string, double> sd, sg, se;
    for (size_t i = 0; i < P; ++i) {
      const double g = k[i]->start_ns > frontier ? 1e-3 * double(k[i]->start_ns - frontier) : 0;
      const double e = k[i]->end_ns > frontier ? 1e-3 * double(k[i]->end_ns - frontier) : 0;
      const double d = k[i]->end_ns > k[i]->start_ns ? 1e-3 * double(k[i]->end_ns - k[i]->start_ns) : 0;
      start[i].push_back(1e-3 * double(k[i]->start_ns - t0));
      dur[i].push_back(d);
      gap[i].push_back(g);
      exposed[i].push_back(e);
      sd[names[i]] += d;
      sg[names[i]] += g;
      se[names[i]] += e;
      gaps += g;
      frontier = std::max(frontier, k[i]->end_ns);
      last = std::max(last, k[i]->end_ns);
    }
    spans.push_back(1e-3 * double(last - t0));
    busy.push_back(1e-3 * double(last - t0) - gaps);
    for (const auto& [n, v] : sd) {
      name_dur[n].push_back(v);
      name_gap[n].push_back(sg[n]);
      name_exp[n].push_back(se[n]);
    }
  }
  t.span_us = median(spans);
  t.busy_us = median(busy);
  for (size_t i = 0; i < P; ++i)
    t.positions.push_back({names[i], median(start[i]), median(dur[i]), median(gap[i]),
                           median(exposed[i])});
  for (const auto& [n, c] : name_count)
    t.by_name.push_back({n, c, median(name_dur[n]), median(name_gap[n]), median(name_exp[n])});
  std::sort(t.by_name.begin(), t.by_name.end(),
            [](const TimelineByName& a, const TimelineByName& b) { return a.exposed_us > b.exposed_us; });
  return t;
}

TimelineRange middle_period(const StepTimeline& t) {
  const int n = int(t.positions.size());
  const int mid = n / 2;
  for (int p = 1; 2 * p <= n; ++p) {
    // p repeats around the middle: positions [mid - p, mid + p) agree with their shift by p.
    const int lo = std::max(0, mid - p);
    if (lo + 2 * p > n) break;
    bool ok = true;
    for (int i = lo; i < lo + p && ok; ++i) ok = t.positions[size_t(i)].name == t.positions[size_t(i + p)].name;
    if (ok) return {lo, p};
  }
  return {0, n};
}

std::string step_timeline_markdown(const StepTimeline& t, int first, int count) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  os << "Kernel timeline (CUPTI, medians over " << t.steps << " traced steps"
     << (t.dropped_steps ? str(", ", t.dropped_steps, " with another kernel sequence dropped") : "")
     << "): span " << t.span_us << " us, busy " << t.busy_us << " us, idle "
     << t.span_us - t.busy_us << " us; exposed = how far a kernel pushed the step's end out "
     << "(the exposed times add up to the span)\n\n"
     << "| kernel | per step | duration us | gap before us | exposed us | exposed % |\n"
     << "|---|---|---|---|---|---|\n";
  for (const TimelineByName& b : t.by_name)
    os << "| `" << b.name.substr(0, 90) << "` | " << b.per_step << " | " << b.duration_us << " | "
       << b.gap_us << " | " << b.exposed_us << " | "
       << (t.span_us > 0 ? 100 * b.exposed_us / t.span_us : 0) << "% |\n";
  const int lo = std::max(0, first), hi = std::min(int(t.positions.size()), first + count);
  if (lo < hi) {
    os << "\nPositions " << lo << " .. " << hi - 1 << " (one period from the middle of the step)\n\n"
       << "| # | kernel | start us | duration us | gap us | exposed us |\n|---|---|---|---|---|---|\n";
    os.precision(2);
    for (int i = lo; i < hi; ++i) {
      const TimelinePosition& p = t.positions[size_t(i)];
      os << "| " << i << " | `" << p.name.substr(0, 70) << "` | " << p.start_us << " | "
         << p.duration_us << " | " << p.gap_us << " | " << p.exposed_us << " |\n";
    }
  }
  return os.str();
}

}  // namespace tetra::perf
