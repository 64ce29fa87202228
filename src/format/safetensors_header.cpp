#include "format/safetensors_header.h"

#include <algorithm>
#include <array>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "format/safetensors_json.h"

namespace tetra {
namespace {

using nlohmann::json;

constexpr std::array<DType, 9> kSupportedDTypes = {DType::F32,     DType::F16, DType::BF16,
                                                   DType::F8_E4M3, DType::U8,  DType::I8,
                                                   DType::I32,     DType::I64, DType::BOOL};

std::string supported_dtype_list() {
  std::string out;
  for (DType t : kSupportedDTypes) out += str(out.empty() ? "" : ", ", dtype_name(t));
  return out;
}

// A JSON number that is a whole number (nlohmann keeps "2.0" and "1e3" as floats: refused).
bool is_json_integer(const json& v) { return v.is_number_integer(); }

// A JSON value for an error message, cut short: a fuzzed header can put megabytes anywhere.
std::string brief(const json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

// Reads one shape dim; `what` names the tensor for errors.
int64_t read_dim(const json& v, size_t axis, const std::string& what) {
  if (!is_json_integer(v))
    TETRA_FAIL(what, ": shape[", axis, "] must be an integer, got ", v.type_name(), " ", brief(v));
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max()))
      TETRA_FAIL(what, ": shape[", axis, "] = ", u, " is too large");
    return int64_t(u);
  }
  const int64_t d = v.get<int64_t>();
  if (d < 0) TETRA_FAIL(what, ": shape[", axis, "] = ", d, " is negative");
  return d;
}

uint64_t read_offset(const json& v, const char* which, const std::string& what) {
  if (!is_json_integer(v))
    TETRA_FAIL(what, ": data_offsets ", which, " must be an integer, got ", v.type_name(), " ",
               brief(v));
  if (!v.is_number_unsigned())
    TETRA_FAIL(what, ": data_offsets ", which, " = ", v.get<int64_t>(), " is negative");
  return v.get<uint64_t>();
}

const json& require_field(const json& entry, const char* field, const std::string& what) {
  auto it = entry.find(field);
  if (it == entry.end()) TETRA_FAIL(what, ": missing \"", field, "\"");
  return *it;
}

SafetensorsEntry parse_entry(const std::string& name, const json& value, uint64_t data_bytes,
                             std::string_view file_label) {
  const std::string what = str(file_label, ": tensor '", name, "'");
  if (name.empty()) TETRA_FAIL(file_label, ": a tensor has an empty name");
  if (!value.is_object())
    TETRA_FAIL(what, ": entry must be an object with dtype, shape and data_offsets, got ",
               value.type_name());

  SafetensorsEntry e;
  e.name = name;

  const json& dtype = require_field(value, "dtype", what);
  if (!dtype.is_string()) TETRA_FAIL(what, ": \"dtype\" must be a string, got ", dtype.type_name());
  const std::string& dtype_text = dtype.get_ref<const std::string&>();
  auto parsed = parse_dtype(dtype_text);
  if (!parsed)
    TETRA_FAIL(what, ": dtype '", dtype_text,
               "' is not supported (supported: ", supported_dtype_list(), ")");
  e.dtype = *parsed;

  const json& shape = require_field(value, "shape", what);
  if (!shape.is_array())
    TETRA_FAIL(what, ": \"shape\" must be an array of integers, got ", shape.type_name());
  e.shape.reserve(shape.size());
  for (size_t axis = 0; axis < shape.size(); ++axis)
    e.shape.push_back(read_dim(shape[axis], axis, what));

  const json& offsets = require_field(value, "data_offsets", what);
  if (!offsets.is_array() || offsets.size() != 2)
    TETRA_FAIL(what, ": \"data_offsets\" must be an array [begin, end], got ", offsets.type_name(),
               offsets.is_array() ? str(" of ", offsets.size(), " elements") : std::string());
  e.begin = read_offset(offsets[0], "begin", what);
  e.end = read_offset(offsets[1], "end", what);
  if (e.begin > e.end)
    TETRA_FAIL(what, ": data_offsets [", e.begin, ", ", e.end, "] end before they begin");
  if (e.end > data_bytes)
    TETRA_FAIL(what, ": data_offsets [", e.begin, ", ", e.end, "] reach past the data section of ",
               data_bytes, " bytes (file truncated?)");

  const uint64_t needed = safetensors_tensor_bytes(e.dtype, e.shape, what);
  if (needed != e.nbytes())
    TETRA_FAIL(what, ": shape ", shape_to_string(e.shape), " of ", dtype_name(e.dtype), " needs ",
               needed, " bytes but data_offsets [", e.begin, ", ", e.end, "] hold ", e.nbytes());
  return e;
}

std::map<std::string, std::string> parse_metadata(const json& value, std::string_view file_label) {
  if (!value.is_object())
    TETRA_FAIL(file_label, ": __metadata__ must be an object of strings, got ", value.type_name());
  std::map<std::string, std::string> out;
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string())
      TETRA_FAIL(file_label, ": __metadata__ value of '", key, "' must be a string, got ",
                 v.type_name());
    out.emplace(key, v.get<std::string>());
  }
  return out;
}

// Sorted by begin: a non-empty range must start at or after every earlier range's end.
void check_no_overlap(const std::vector<SafetensorsEntry>& sorted, std::string_view file_label) {
  const SafetensorsEntry* reach = nullptr;  // the non-empty range that ends furthest so far
  for (const SafetensorsEntry& e : sorted) {
    if (e.nbytes() == 0) continue;
    if (reach && e.begin < reach->end)
      TETRA_FAIL(file_label, ": tensors '", reach->name, "' [", reach->begin, ", ", reach->end,
                 ") and '", e.name, "' [", e.begin, ", ", e.end, ") overlap");
    if (!reach || e.end > reach->end) reach = &e;
  }
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const SafetensorsEntry* SafetensorsHeader::find(std::string_view name) const {
  auto it = index_by_name.find(name);
  return it == index_by_name.end() ? nullptr : &tensors[it->second];
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += str(i ? ", " : "", shape[i]);
  return out + "]";
}

uint64_t safetensors_tensor_bytes(DType dtype, const std::vector<int64_t>& shape,
                                  std::string_view what) {
  int64_t numel = 1;
  for (size_t axis = 0; axis < shape.size(); ++axis) {
    if (shape[axis] < 0) TETRA_FAIL(what, ": shape[", axis, "] = ", shape[axis], " is negative");
    // Every prefix product must fit so that numel() is well defined even with a 0 dim later.
    if (__builtin_mul_overflow(numel, shape[axis], &numel))
      TETRA_FAIL(what, ": shape ", shape_to_string(shape), " has more elements than fit in int64");
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(uint64_t(numel), uint64_t(dtype_size(dtype)), &bytes))
    TETRA_FAIL(what, ": shape ", shape_to_string(shape), " of ", dtype_name(dtype),
               " needs more bytes than fit in uint64");
  return bytes;
}

SafetensorsHeader parse_safetensors_header(std::string_view json_text, uint64_t data_bytes,
                                           std::string_view file_label) {
  const json root = parse_strict_json(json_text, str(file_label, ": safetensors header"));
  if (!root.is_object())
    TETRA_FAIL(file_label, ": safetensors header must be a JSON object, got ", root.type_name());

  SafetensorsHeader header;
  header.tensors.reserve(root.size());
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__")
      header.metadata = parse_metadata(value, file_label);
    else
      header.tensors.push_back(parse_entry(key, value, data_bytes, file_label));
  }

  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              if (a.begin != b.begin) return a.begin < b.begin;
              if (a.end != b.end) return a.end < b.end;
              return a.name < b.name;
            });
  check_no_overlap(header.tensors, file_label);
  for (size_t i = 0; i < header.tensors.size(); ++i)
    header.index_by_name.emplace(header.tensors[i].name, i);
  return header;
}

std::string safetensors_header_json(const std::vector<SafetensorsEntry>& entries,
                                    const std::map<std::string, std::string>& metadata,
                                    std::string_view file_label) {
  json root = json::object();
  if (!metadata.empty()) root["__metadata__"] = metadata;
  for (const SafetensorsEntry& e : entries) {
    if (e.name == "__metadata__" || root.contains(e.name))
      TETRA_FAIL(file_label, ": tensor '", e.name, "' cannot be written: ",
                 e.name == "__metadata__" ? "reserved name" : "name used twice");
    root[e.name] = json{{"dtype", std::string(dtype_name(e.dtype))},
                        {"shape", e.shape},
                        {"data_offsets", {e.begin, e.end}}};
  }
  std::string text;
  try {
    text = root.dump();
  } catch (const json::exception& e) {  // a name or metadata string that is not UTF-8
    TETRA_FAIL(file_label, ": cannot write the safetensors header: ", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

SafetensorsImage parse_safetensors_image(const uint8_t* bytes, size_t size,
                                         std::string_view file_label) {
  if (size < 8)
    TETRA_FAIL(file_label, ": file is ", size,
               " bytes, too short for a safetensors file (needs an 8-byte header length)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian
  if (header_len > kMaxSafetensorsHeaderBytes)
    TETRA_FAIL(file_label, ": header length ", header_len, " exceeds the limit of ",
               kMaxSafetensorsHeaderBytes, " bytes (corrupt or not a safetensors file)");
  if (header_len > size - 8)
    TETRA_FAIL(file_label, ": header length ", header_len, " exceeds the ", size - 8,
               " bytes that follow the length prefix (file truncated?)");

  SafetensorsImage image;
  image.data_offset = 8 + header_len;
  image.data_bytes = size - image.data_offset;
  const std::string_view json_text(reinterpret_cast<const char*>(bytes) + 8, header_len);
  image.header = parse_safetensors_header(json_text, image.data_bytes, file_label);
  return image;
}

}  // namespace tetra
