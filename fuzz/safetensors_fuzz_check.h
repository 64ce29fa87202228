// The property the safetensors fuzzer checks, shared with the CPU replay test
// (tests/cpu/test_safetensors_fuzz_replay.cpp) so both run exactly the same code.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "format/safetensors_header.h"

namespace tetra::fuzz {

// Parses `data` as a whole safetensors file image. A refusal throws tetra::Error (and must be the
// only exception ever thrown). For an accepted image, returns "" when every promised invariant
// holds and else a description of the first broken one.
inline std::string check_safetensors_image(const uint8_t* data, size_t size) {
  const SafetensorsImage image = parse_safetensors_image(data, size, "fuzz-input");
  const SafetensorsHeader& h = image.header;

  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t(data[i]) << (8 * i);
  if (image.data_offset != 8 + header_len) return "data_offset is not 8 + header length";
  if (image.data_offset + image.data_bytes != size) return "data section does not end the file";
  if (h.index_by_name.size() != h.tensors.size()) return "name index size differs from tensors";

  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const SafetensorsEntry& e = h.tensors[i];
    if (e.name.empty() || e.name == "__metadata__") return str("bad name '", e.name, "'");
    if (h.find(e.name) != &e) return str("find('", e.name, "') misses its entry");
    if (e.begin > e.end || e.end > image.data_bytes)
      return str("'", e.name, "' range outside data");
    if (i > 0 && h.tensors[i - 1].begin > e.begin) return "tensors not ordered by offset";
    // Element count in 128 bits: independent of the parser's overflow handling.
    unsigned __int128 numel = 1;
    for (int64_t d : e.shape) {
      if (d < 0) return str("'", e.name, "' has a negative dim");
      numel *= static_cast<unsigned __int128>(d);
      if (numel > static_cast<unsigned __int128>(INT64_MAX))
        return str("'", e.name, "' element count exceeds int64");
    }
    if (numel * dtype_size(e.dtype) != e.nbytes()) return str("'", e.name, "' size mismatch");
    if (uint64_t(e.numel()) != uint64_t(numel)) return str("'", e.name, "' numel() wrong");
  }
  // Non-empty ranges must be pairwise disjoint; checked quadratically (independent of the
  // parser's sweep) when small enough to stay fast.
  if (h.tensors.size() <= 256) {
    for (size_t i = 0; i < h.tensors.size(); ++i)
      for (size_t j = i + 1; j < h.tensors.size(); ++j) {
        const SafetensorsEntry& a = h.tensors[i];
        const SafetensorsEntry& b = h.tensors[j];
        if (a.nbytes() && b.nbytes() && a.begin < b.end && b.begin < a.end)
          return str("'", a.name, "' and '", b.name, "' overlap");
      }
  }

  // Writing the parsed header back and parsing that must give the same tensors and metadata.
  SafetensorsHeader again;
  try {
    const std::string text = safetensors_header_json(h.tensors, h.metadata, "fuzz-rewrite");
    if (text.size() % 8 != 0) return "rewritten header not padded to 8 bytes";
    again = parse_safetensors_header(text, image.data_bytes, "fuzz-rewrite");
  } catch (const Error& e) {
    return str("rewritten header refused: ", e.what());
  }
  if (again.metadata != h.metadata) return "metadata changed by a rewrite";
  if (again.tensors.size() != h.tensors.size()) return "tensor count changed by a rewrite";
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const SafetensorsEntry& a = h.tensors[i];
    const SafetensorsEntry& b = again.tensors[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.begin != b.begin ||
        a.end != b.end)
      return str("tensor '", a.name, "' changed by a rewrite");
  }
  return "";
}

}  // namespace tetra::fuzz
