// SafetensorsFile: one real file on disk per validation error (every message must name the file
// and the tensor), plus reading, scalars, empty tensors and zero-copy views.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "format/safetensors.h"
#include "test_safetensors_util.h"

using namespace tetra;
using namespace tetra::testing;

namespace {

// Writes `bytes` as <tmp>/<name>.safetensors; opening must fail naming the path and every part.
void expect_open_error(const std::string& name, const std::string& bytes,
                       std::vector<std::string> parts) {
  SCOPED_TRACE(name);
  TempDir dir;
  const auto path = dir / (name + ".safetensors");
  write_bytes(path, bytes);
  parts.push_back(path.string());
  expect_error([&] { SafetensorsFile::open(path); }, parts);
}

const std::string kA8 = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

}  // namespace

TEST(SafetensorsFileErrors, TruncatedFiles) {
  expect_open_error("empty", "", {"0 bytes", "too short"});
  expect_open_error("seven_bytes", std::string(7, '\0'), {"7 bytes", "too short"});
  const std::string whole = file_image(kA8, std::string(8, '\0'));
  expect_open_error("header_cut", whole.substr(0, 8 + kA8.size() / 2),
                    {"header length " + std::to_string(kA8.size()), "truncated"});
  expect_open_error("data_cut", whole.substr(0, whole.size() - 3),
                    {"'a'", "data_offsets [0, 8]", "data section of 5 bytes", "truncated"});
}

TEST(SafetensorsFileErrors, HeaderLengthBeyondFileOrLimit) {
  expect_open_error("len_beyond_file", u64_le(1000) + "{}",
                    {"header length 1000", "exceeds the 2"});
  expect_open_error("len_beyond_limit", u64_le(100'000'001) + "{}", {"100000001", "limit"});
  expect_open_error("len_all_ones", u64_le(~uint64_t(0)) + "{}", {"limit"});
}

TEST(SafetensorsFileErrors, NotJsonOrNotAnObject) {
  expect_open_error("not_json", file_image("{\"a\": nope}"), {"invalid JSON"});
  expect_open_error("empty_header", file_image(""), {"invalid JSON"});
  expect_open_error("json_array", file_image("[1,2,3]"), {"must be a JSON object", "array"});
  expect_open_error("json_string", file_image("\"x\""), {"must be a JSON object", "string"});
  expect_open_error("entry_not_object", file_image(R"({"a":[1,2]})"), {"'a'", "must be an object"});
  expect_open_error("deep_nesting", file_image(std::string(100, '[') + std::string(100, ']')),
                    {"nested deeper"});
}

TEST(SafetensorsFileErrors, MissingFields) {
  const std::string d8(8, '\0');
  expect_open_error("no_dtype", file_image(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", d8),
                    {"'w'", "missing \"dtype\""});
  expect_open_error("no_shape", file_image(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", d8),
                    {"'w'", "missing \"shape\""});
  expect_open_error("no_offsets", file_image(R"({"w":{"dtype":"F32","shape":[2]}})", d8),
                    {"'w'", "missing \"data_offsets\""});
}

TEST(SafetensorsFileErrors, WrongJsonTypes) {
  const std::string d8(8, '\0');
  expect_open_error("dtype_number",
                    file_image(R"({"w":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", d8),
                    {"'w'", "\"dtype\" must be a string"});
  expect_open_error("shape_string",
                    file_image(R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", d8),
                    {"'w'", "\"shape\" must be an array"});
  expect_open_error("shape_float",
                    file_image(R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", d8),
                    {"'w'", "shape[0] must be an integer"});
  expect_open_error("offsets_three",
                    file_image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}})", d8),
                    {"'w'", "\"data_offsets\" must be an array [begin, end]", "3 elements"});
  expect_open_error("offsets_object",
                    file_image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":{}}})", d8),
                    {"'w'", "\"data_offsets\" must be an array"});
  expect_open_error("offset_string",
                    file_image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":["0",8]}})", d8),
                    {"'w'", "begin must be an integer"});
  expect_open_error("offset_negative",
                    file_image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", d8),
                    {"'w'", "begin = -8 is negative"});
}

TEST(SafetensorsFileErrors, UnknownDtypeIsNamed) {
  for (const char* dtype : {"F64", "I16", "F8_E5M2", "float32", ""}) {
    const std::string header =
        std::string(R"({"w":{"dtype":")") + dtype + R"(","shape":[1],"data_offsets":[0,8]}})";
    expect_open_error(std::string("dtype_") + dtype, file_image(header, std::string(8, '\0')),
                      {"'w'", std::string("dtype '") + dtype + "' is not supported", "BF16"});
  }
}

TEST(SafetensorsFileErrors, BadShapes) {
  const std::string d8(8, '\0');
  expect_open_error("negative_dim",
                    file_image(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8),
                    {"'w'", "shape[0] = -2 is negative"});
  expect_open_error(
      "dim_too_large",
      file_image(R"({"w":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,8]}})", d8),
      {"'w'", "too large"});
  expect_open_error(
      "numel_overflow",
      file_image(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})"),
      {"'w'", "more elements than fit"});
  // Overflow in an early prefix is refused even though a later 0 would make the product 0.
  expect_open_error(
      "prefix_overflow",
      file_image(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})"),
      {"'w'", "more elements than fit"});
  expect_open_error(
      "bytes_overflow",
      file_image(R"({"w":{"dtype":"I64","shape":[4611686018427387904],"data_offsets":[0,0]}})"),
      {"'w'", "more bytes than fit"});
}

TEST(SafetensorsFileErrors, SizeMismatchAndRanges) {
  const std::string d16(16, '\0');
  expect_open_error("size_mismatch",
                    file_image(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d16),
                    {"'w'", "shape [3] of F32 needs 12 bytes", "[0, 8] hold 8"});
  expect_open_error("past_end",
                    file_image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", d16),
                    {"'w'", "[12, 20]", "data section of 16 bytes"});
  expect_open_error("begin_after_end",
                    file_image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d16),
                    {"'w'", "end before they begin"});
}

TEST(SafetensorsFileErrors, OverlapNamesBothTensors) {
  const std::string d16(16, '\0');
  expect_open_error("overlap",
                    file_image(R"({"first":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                               R"("second":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                               d16),
                    {"'first'", "'second'", "overlap"});
  // A range inside a longer earlier range that is not its direct predecessor.
  expect_open_error("nested_overlap",
                    file_image(R"({"big":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},)"
                               R"("p":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},)"
                               R"("q":{"dtype":"U8","shape":[2],"data_offsets":[8,10]}})",
                               d16),
                    {"'big'", "overlap"});
  expect_open_error("same_range",
                    file_image(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                               R"("y":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                               d16),
                    {"'x'", "'y'", "overlap"});
}

TEST(SafetensorsFileErrors, DuplicateNames) {
  expect_open_error("duplicate",
                    file_image(R"({"dup":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                               R"("dup":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                               std::string(2, '\0')),
                    {"duplicate", "'dup'"});
  expect_open_error("duplicate_field",
                    file_image(R"({"w":{"dtype":"U8","dtype":"F32","shape":[1],)"
                               R"("data_offsets":[0,1]}})",
                               std::string(1, '\0')),
                    {"duplicate", "'dtype'", "'w'"});
  expect_open_error(
      "empty_name",
      file_image(R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", std::string(1, '\0')),
      {"empty name"});
}

TEST(SafetensorsFileErrors, BadMetadata) {
  expect_open_error("metadata_array", file_image(R"({"__metadata__":["pt"]})"),
                    {"__metadata__ must be an object", "array"});
  expect_open_error("metadata_number_value", file_image(R"({"__metadata__":{"format":1}})"),
                    {"__metadata__ value of 'format' must be a string", "number"});
  expect_open_error("metadata_nested", file_image(R"({"__metadata__":{"x":{"y":"z"}}})"),
                    {"'x'", "must be a string"});
}

TEST(SafetensorsFileErrors, NotARegularFile) {
  TempDir dir;
  expect_error([&] { SafetensorsFile::open(dir.path()); },
               {dir.path().string(), "not a regular file"});
  const auto missing = dir / "missing.safetensors";
  expect_error([&] { SafetensorsFile::open(missing); }, {missing.string(), "cannot open"});
}

TEST(SafetensorsFile, ReadsTensorsMetadataAndBytes) {
  TempDir dir;
  const auto path = dir / "ok.safetensors";
  // "z" comes first in the data section, "a" second: tensors() follows offsets, not names.
  const std::string header = R"({"__metadata__":{"format":"pt","note":"hi"},)"
                             R"("a":{"dtype":"BF16","shape":[1,3],"data_offsets":[8,14]},)"
                             R"("z":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data = std::string("\x01\x00\x00\x00\xff\xff\xff\xff", 8) + "abcdef";
  write_bytes(path, file_image(header + "   ", data));  // trailing spaces: padding is legal

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.path(), path);
  ASSERT_EQ(file.tensors().size(), 2u);
  EXPECT_EQ(file.tensors()[0].name, "z");
  EXPECT_EQ(file.tensors()[1].name, "a");
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("note"), "hi");
  EXPECT_EQ(file.data_offset(), 8 + header.size() + 3);

  const TensorView z = file.view("z");
  EXPECT_EQ(z.dtype, DType::I32);
  EXPECT_EQ(z.shape, (std::vector<int64_t>{2}));
  ASSERT_EQ(z.nbytes, 8u);
  int32_t zv[2];
  std::memcpy(zv, z.data, 8);
  EXPECT_EQ(zv[0], 1);
  EXPECT_EQ(zv[1], -1);

  const TensorView a = file.view("a");
  EXPECT_EQ(a.dtype, DType::BF16);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(a.numel(), 3);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(a.data), a.nbytes), "abcdef");

  ASSERT_NE(file.find("a"), nullptr);
  EXPECT_EQ(file.find("a")->begin, 8u);
  EXPECT_EQ(file.find("missing"), nullptr);
  EXPECT_FALSE(file.contains("missing"));
  expect_error([&] { file.view("missing"); }, {path.string(), "'missing'"});
}

TEST(SafetensorsFile, ScalarsAndZeroSizeTensors) {
  TempDir dir;
  const auto path = dir / "small.safetensors";
  const float one = 1.0f;
  std::string data(4, '\0');
  std::memcpy(data.data(), &one, 4);
  // "inner" is empty and sits inside "s"'s range; "tail" is empty at the very end of the data.
  write_bytes(path, file_image(R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                               R"("e":{"dtype":"BF16","shape":[0,5],"data_offsets":[0,0]},)"
                               R"("inner":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},)"
                               R"("tail":{"dtype":"I64","shape":[3,0],"data_offsets":[4,4]}})",
                               data));
  const SafetensorsFile file = SafetensorsFile::open(path);
  const TensorView s = file.view("s");
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.numel(), 1);
  ASSERT_EQ(s.nbytes, 4u);
  float got = 0;
  std::memcpy(&got, s.data, 4);
  EXPECT_EQ(got, 1.0f);

  for (const char* name : {"e", "inner", "tail"}) {
    const TensorView v = file.view(name);
    EXPECT_EQ(v.nbytes, 0u) << name;
    EXPECT_EQ(v.numel(), 0) << name;
  }
  EXPECT_EQ(file.view("e").shape, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(file.view("tail").data, file.mapping() + file.file_size());
}

TEST(SafetensorsFile, GapsBetweenTensorsAreAccepted) {
  TempDir dir;
  const auto path = dir / "gaps.safetensors";
  write_bytes(path,
              file_image(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})", "....xy.."));
  const SafetensorsFile file = SafetensorsFile::open(path);
  const TensorView a = file.view("a");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(a.data), a.nbytes), "xy");
}

TEST(SafetensorsFile, ViewsAreZeroCopyIntoTheMapping) {
  TempDir dir;
  const auto path = dir / "map.safetensors";
  const std::string header = R"({"p":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                             R"("q":{"dtype":"F16","shape":[2,2],"data_offsets":[4,12]}})";
  const std::string bytes = file_image(header, "0123456789AB");
  write_bytes(path, bytes);
  const SafetensorsFile file = SafetensorsFile::open(path);
  ASSERT_EQ(file.file_size(), bytes.size());
  const uint8_t* lo = file.mapping();
  const uint8_t* hi = lo + file.file_size();
  for (const char* name : {"p", "q"}) {
    const TensorView v = file.view(name);
    EXPECT_GE(v.data, lo) << name;
    EXPECT_LE(v.data + v.nbytes, hi) << name;
    EXPECT_EQ(v.data, lo + 8 + header.size() + file.find(name)->begin) << name;
    EXPECT_EQ(v.data, file.view(name).data) << "each view must point at the same bytes";
    // The mapping holds the file's bytes verbatim.
    EXPECT_EQ(std::memcmp(v.data, bytes.data() + (v.data - lo), v.nbytes), 0);
  }
}

TEST(SafetensorsFile, MoveKeepsTheMapping) {
  TempDir dir;
  const auto path = dir / "move.safetensors";
  write_bytes(path, file_image(R"({"t":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})", "xyz"));
  SafetensorsFile a = SafetensorsFile::open(path);
  const uint8_t* data = a.view("t").data;
  SafetensorsFile b = std::move(a);
  EXPECT_EQ(a.mapping(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(b.view("t").data, data);
  SafetensorsFile c = SafetensorsFile::open(path);
  c = std::move(b);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(c.view("t").data), 3), "xyz");
}
