// libFuzzer entry: the input is a whole safetensors file image (8-byte length, header, data).
// A finding is anything but a clean accept or a tetra::Error: another exception escapes (libFuzzer
// reports it), a sanitizer fires, or an accepted image breaks an invariant (abort below).
#include <cstdio>
#include <cstdlib>

#include "safetensors_fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string violation;
  try {
    violation = tetra::fuzz::check_safetensors_image(data, size);
  } catch (const tetra::Error&) {
    return 0;  // a clean refusal
  }
  if (!violation.empty()) {
    std::fprintf(stderr, "safetensors invariant violated: %s\n", violation.c_str());
    std::abort();
  }
  return 0;
}
