// libFuzzer entry: the input is a config.json (or hf_quant_config.json) text. A finding is anything
// but a clean parse or a tetra::Error: another exception (std::bad_alloc included), a sanitizer
// report (signed overflow in the size arithmetic among them), or an accepted config that breaks
// an invariant: its layout, sizes and expected tensors must be computable, and writing it back
// to JSON and parsing that must give a config that writes the same JSON.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "format/model_config.h"
#include "format/model_layout.h"
#include "format/model_size.h"
#include "format/quant_config.h"

namespace {

[[noreturn]] void violated(const std::string& what) {
  std::fprintf(stderr, "model config invariant violated: %s\n", what.c_str());
  std::abort();
}

// The walks below list every expert's tensors: linear in layers x experts. The parser bounds
// that product (kMaxExpertInstances in model_config.cpp); the harness walks the smaller ones so
// that one input stays within libFuzzer's memory limit under ASan.
constexpr int64_t kWalkedExpertInstances = 20000;

void check(const tetra::ModelConfig& c, const tetra::QuantConfig& q) {
  const nlohmann::json written = tetra::model_config_to_json(c);
  tetra::ModelConfig again;
  try {
    again = tetra::parse_model_config(written, "rewritten config.json");
  } catch (const tetra::Error& e) {
    violated(std::string("an accepted config, written back, is refused: ") + e.what());
  }
  if (tetra::model_config_to_json(again) != written)
    violated("writing, parsing and writing again changed the config");
  if (c.num_layers * (c.n_routed_experts + 1) > kWalkedExpertInstances) return;
  const tetra::ModelLayout layout = tetra::model_layout(c);
  try {  // the quant config may name an algorithm Tetra does not load (FP8): a clean refusal
    const tetra::ModelSize size = tetra::model_size(c, q);
    (void)size;
    if (tetra::expected_tensors(layout, q).empty()) violated("an accepted config expects no tensors");
  } catch (const tetra::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;  // not JSON: the loaders refuse it before these parsers
  tetra::QuantConfig q;
  try {
    q = tetra::parse_quant_config(j, nlohmann::json());
  } catch (const tetra::Error&) {  // a clean refusal; the model config is tried on its own
  }
  try {
    q = tetra::parse_quant_config(nlohmann::json(), j);  // as config.json's quantization_config
  } catch (const tetra::Error&) {
  }
  tetra::ModelConfig c;
  try {
    c = tetra::parse_model_config(j, "fuzz config.json");
  } catch (const tetra::Error&) {
    return 0;  // a clean refusal
  }
  check(c, q);
  return 0;
}
