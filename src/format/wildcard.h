// Module-name patterns as ModelOpt writes them in exclude_modules / ignore lists
// ("lm_head", "*.mlp.gate", "model.layers.0.self_attn*").
#pragma once
#include <string_view>

namespace tetra {

// True when `pattern` matches ALL of `name`. '*' matches any run of characters, including
// '.' and the empty run; every other character matches only itself (no '?', no classes:
// module names never contain them, and a literal reading is the predictable one).
bool wildcard_match(std::string_view pattern, std::string_view name);

// True when `pattern` matches `module` or one of its dotted ancestors: excluding
// "model.layers.3.self_attn" also excludes "model.layers.3.self_attn.q_proj".
bool wildcard_match_module(std::string_view pattern, std::string_view module);

}  // namespace tetra
