// The facts `tetra inspect` reports, as JSON (machine form) and as text (human form).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "format/checkpoint.h"

namespace tetra {

nlohmann::json inspect_report(const Checkpoint& ck);
std::string format_inspect_report(const nlohmann::json& report);

}  // namespace tetra
