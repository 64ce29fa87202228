#include "format/generation_config.h"

#include <fstream>
#include <nlohmann/json.hpp>

namespace tetra {

std::vector<int32_t> generation_config_eos_ids(const std::filesystem::path& dir, int64_t vocab) {
  std::vector<int32_t> ids;
  std::ifstream in(dir / "generation_config.json");
  if (!in) return ids;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object() || !j.contains("eos_token_id")) return ids;
  const nlohmann::json& e = j["eos_token_id"];
  auto keep = [&](const nlohmann::json& v) {
    if (!v.is_number_integer()) return;
    const int64_t id = v.get<int64_t>();
    if (id >= 0 && id < vocab) ids.push_back(int32_t(id));
  };
  if (e.is_array())
    for (const auto& v : e) keep(v);
  else
    keep(e);
  return ids;
}

}  // namespace tetra
