// The safetensors header: parsing and validation as pure functions over bytes in memory (no
// files), so that the fuzzer and the tests drive exactly what SafetensorsFile::open runs.
//
// File layout: [8 bytes: header length N, u64 little-endian] [N bytes: JSON header]
//              [data section: tensor bytes, addressed by data_offsets relative to its start]
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace tetra {

// Longest header accepted (the Hugging Face implementation uses the same bound): a larger length
// prefix means a corrupt or foreign file, and refusing it avoids parsing gigabytes of garbage.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;  // [d0, d1, ...]; empty for a 0-d scalar
  uint64_t begin = 0;          // byte range [begin, end) relative to the data section
  uint64_t end = 0;

  uint64_t nbytes() const { return end - begin; }
  int64_t numel() const;  // fits in int64 for every parsed entry
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;        // ordered by begin offset, then by name
  std::map<std::string, std::string> metadata;  // "__metadata__", e.g. {"format": "pt"}
  std::map<std::string, size_t, std::less<>> index_by_name;  // name -> position in tensors

  const SafetensorsEntry* find(std::string_view name) const;  // nullptr if absent
};

// A whole file image split into its parts.
struct SafetensorsImage {
  SafetensorsHeader header;
  uint64_t data_offset = 0;  // 8 + header length: where the data section starts in the file
  uint64_t data_bytes = 0;   // size of the data section
};

// Parses and validates the JSON header of a file whose data section holds `data_bytes` bytes.
// Every refusal is a tetra::Error that starts with `file_label` and names the tensor involved:
// bad JSON or duplicate keys, a non-object top level, entries lacking dtype/shape/data_offsets or
// holding the wrong JSON types, unsupported dtypes, negative or overflowing shapes, byte sizes
// that disagree with shape * dtype size, ranges outside the data section, overlapping tensors and
// an __metadata__ that is not an object of strings. Ranges may leave gaps; empty ranges overlap
// nothing.
SafetensorsHeader parse_safetensors_header(std::string_view json, uint64_t data_bytes,
                                           std::string_view file_label);

// Splits and validates a complete file image of `size` bytes (length prefix, header, data).
SafetensorsImage parse_safetensors_image(const uint8_t* bytes, size_t size,
                                         std::string_view file_label);

// The inverse of parse_safetensors_header: the JSON header for these entries (offsets as given)
// plus "__metadata__" when `metadata` is not empty, padded with spaces to a multiple of 8 bytes so
// that the data section starts 8-byte aligned. `file_label` names the file in errors.
std::string safetensors_header_json(const std::vector<SafetensorsEntry>& entries,
                                    const std::map<std::string, std::string>& metadata,
                                    std::string_view file_label);

// Bytes a tensor of this dtype and shape occupies; refuses negative dims and any overflow of the
// element count (in int64) or the byte count (in uint64), naming `what` (e.g. "file: tensor 'x'").
uint64_t safetensors_tensor_bytes(DType dtype, const std::vector<int64_t>& shape,
                                  std::string_view what);

// "[2, 3]" for messages.
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace tetra
