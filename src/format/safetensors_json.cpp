#include "format/safetensors_json.h"

#include <set>
#include <string>
#include <vector>

#include "core/error.h"

namespace tetra {

nlohmann::json parse_strict_json(std::string_view text, std::string_view label) {
  using nlohmann::json;
  struct OpenObject {
    std::set<std::string> seen_keys;
    std::string last_key;  // names the object a nested duplicate sits in
  };
  std::vector<OpenObject> open_objects;  // innermost last
  int open_containers = 0;
  json::parser_callback_t check = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (++open_containers > kMaxSafetensorsJsonDepth)
          TETRA_FAIL(label, ": JSON nested deeper than ", kMaxSafetensorsJsonDepth, " levels");
        if (event == json::parse_event_t::object_start) open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        --open_containers;
        if (event == json::parse_event_t::object_end) open_objects.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        OpenObject& innermost = open_objects.back();
        if (!innermost.seen_keys.insert(key).second) {
          std::string where;
          for (size_t i = 0; i + 1 < open_objects.size(); ++i)
            where += str(i ? "." : "", "'", open_objects[i].last_key, "'");
          TETRA_FAIL(label, ": duplicate JSON key '", key, "'",
                     where.empty() ? std::string() : str(" inside ", where));
        }
        innermost.last_key = key;
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), check, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    TETRA_FAIL(label, ": invalid JSON: ", e.what());
  }
}

}  // namespace tetra
