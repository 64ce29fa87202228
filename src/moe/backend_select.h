// Choosing a MoE backend from the declarations: `auto` takes the highest-priority backend that
// can run; naming one that cannot is refused with the reasons `tetra check` prints.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moe/backend_caps.h"

namespace tetra {

// One verdict per declared backend, in declaration order.
std::vector<Verdict> evaluate_all(const MoeWorkload& w, const Target& t);

// Name of the backend `auto` would take, nullopt when none can run.
std::optional<std::string> auto_backend(const MoeWorkload& w, const Target& t);

// Reasons every GPU backend shares (model/parallel problems, GPU memory): check prints them once.
std::vector<std::string> shared_gpu_reasons(const MoeWorkload& w, const Target& t);

// For the runtime: "auto" or a backend name -> the backend to run. Error when the name is
// unknown (listing the names) or the backend cannot run (with every reason evaluate gives).
const BackendCaps& require_compatible(std::string_view name, const MoeWorkload& w, const Target& t);

}  // namespace tetra
