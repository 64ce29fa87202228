// What `tetra check` prints: an aligned text report for people, JSON for machines. Pure
// formatting of results computed elsewhere (moe/backend_*), so tests can read either form.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/backend_caps.h"

namespace tetra::cli {

struct CheckResult {
  MoeWorkload workload;
  Target target;
  std::vector<Verdict> verdicts;        // the rows shown (all backends, or the one asked for)
  std::vector<std::string> shared;      // reasons common to every GPU backend, printed once
  std::optional<std::string> auto_pick;
  std::string requested;                // "auto", "all" or a backend name
  bool can_run = false;                 // the requested backend (or auto's pick) can run
  bool show_declarations = false;       // --backend all: print what each backend declares
  std::string split_detail;             // what each GPU holds (dist::split_summary), may be empty
  // Why the model runtime (generate, serve, bench decode) cannot run the whole model, on any
  // backend or on the CUDA one ("cuda backend: ..."); empty when it can. Informational: the
  // verdicts and the exit code are about the MoE backends.
  std::vector<std::string> runtime_reasons;
};

std::string check_report_text(const CheckResult& r);
nlohmann::json check_report_json(const CheckResult& r, int exit_code);
nlohmann::json backend_caps_to_json(const BackendCaps& b);

}  // namespace tetra::cli
