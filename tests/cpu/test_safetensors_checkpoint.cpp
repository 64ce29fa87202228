// SafetensorsCheckpoint: sharded directories with and without model.safetensors.index.json, and
// one broken layout per validation error, each on disk under a scratch directory.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "format/safetensors_checkpoint.h"
#include "test_safetensors_util.h"

using namespace tetra;
using namespace tetra::testing;

namespace {

// A file with one U8 tensor per name; tensor i holds `len(name)` bytes spelling its name.
std::string shard_image(const std::vector<std::string>& names) {
  std::string header = "{";
  std::string data;
  for (const std::string& n : names) {
    header += (header.size() > 1 ? "," : "") + std::string("\"") + n +
              R"(":{"dtype":"U8","shape":[)" + std::to_string(n.size()) + R"(],"data_offsets":[)" +
              std::to_string(data.size()) + "," + std::to_string(data.size() + n.size()) + "]}";
    data += n;
  }
  return file_image(header + "}", data);
}

std::string text_of(const TensorView& v) {
  return std::string(reinterpret_cast<const char*>(v.data), v.nbytes);
}

const char* kGoodIndex = R"({"metadata":{"total_size":14},"weight_map":{
  "alpha":"model-00001-of-00002.safetensors","beta":"model-00001-of-00002.safetensors",
  "gamma":"model-00002-of-00002.safetensors"}})";

void write_two_shards(const TempDir& dir) {
  write_bytes(dir / "model-00001-of-00002.safetensors", shard_image({"beta", "alpha"}));
  write_bytes(dir / "model-00002-of-00002.safetensors", shard_image({"gamma"}));
}

}  // namespace

TEST(SafetensorsCheckpoint, IndexedShards) {
  TempDir dir;
  write_two_shards(dir);
  write_bytes(dir / "model.safetensors.index.json", kGoodIndex);
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir.path());
  EXPECT_EQ(ckpt.num_files(), 2u);
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"alpha", "beta", "gamma"}));
  EXPECT_EQ(ckpt.total_tensor_bytes(), 5u + 4u + 5u);
  EXPECT_EQ(ckpt.file_of("gamma"), dir / "model-00002-of-00002.safetensors");
  EXPECT_EQ(ckpt.file_of("alpha"), dir / "model-00001-of-00002.safetensors");
  for (const char* name : {"alpha", "beta", "gamma"}) {
    EXPECT_TRUE(ckpt.contains(name));
    EXPECT_EQ(text_of(ckpt.view(name)), name);
    EXPECT_EQ(ckpt.view(name).dtype, DType::U8);
  }
  EXPECT_FALSE(ckpt.contains("delta"));
  EXPECT_EQ(ckpt.find("delta"), nullptr);
  expect_error([&] { ckpt.view("delta"); }, {"'delta'", dir.path().string()});
  expect_error([&] { ckpt.file_of("delta"); }, {"'delta'"});
}

TEST(SafetensorsCheckpoint, IndexIgnoresUnlistedTensorsAndFiles) {
  TempDir dir;
  write_bytes(dir / "a.safetensors", shard_image({"kept", "unlisted"}));
  write_bytes(dir / "stray.safetensors", shard_image({"stray"}));
  write_bytes(dir / "model.safetensors.index.json", R"({"weight_map":{"kept":"a.safetensors"}})");
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir.path());
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"kept"}));
  EXPECT_EQ(ckpt.num_files(), 1u);
  EXPECT_EQ(ckpt.total_tensor_bytes(), 4u);
}

TEST(SafetensorsCheckpoint, IndexPointsToMissingFile) {
  TempDir dir;
  write_two_shards(dir);
  write_bytes(dir / "model.safetensors.index.json",
              R"({"weight_map":{"alpha":"model-00001-of-00002.safetensors",)"
              R"("omega":"model-00003-of-00003.safetensors"}})");
  expect_error([&] { SafetensorsCheckpoint::open(dir.path()); },
               {(dir / "model.safetensors.index.json").string(), "'omega'",
                "model-00003-of-00003.safetensors", "does not exist"});
}

TEST(SafetensorsCheckpoint, IndexNamesTensorAbsentFromItsShard) {
  TempDir dir;
  write_two_shards(dir);
  write_bytes(dir / "model.safetensors.index.json",
              R"({"weight_map":{"alpha":"model-00001-of-00002.safetensors",)"
              R"("gamma":"model-00001-of-00002.safetensors"}})");
  expect_error([&] { SafetensorsCheckpoint::open(dir.path()); },
               {"model.safetensors.index.json", "'gamma'",
                (dir / "model-00001-of-00002.safetensors").string(), "does not contain it"});
}

TEST(SafetensorsCheckpoint, IndexedTensorStoredInTwoShards) {
  TempDir dir;
  write_bytes(dir / "model-00001-of-00002.safetensors", shard_image({"alpha", "beta"}));
  write_bytes(dir / "model-00002-of-00002.safetensors", shard_image({"gamma", "beta"}));
  write_bytes(dir / "model.safetensors.index.json", kGoodIndex);
  expect_error([&] { SafetensorsCheckpoint::open(dir.path()); },
               {"model.safetensors.index.json", "'beta'", "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors", "both"});
}

TEST(SafetensorsCheckpoint, MalformedIndex) {
  struct Case {
    const char* text;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"{not json", {"invalid JSON"}},
      {"[]", {"must be a JSON object"}},
      {R"({"metadata":{}})", {"missing \"weight_map\""}},
      {R"({"weight_map":[]})", {"\"weight_map\" must be an object"}},
      {R"({"weight_map":{}})", {"lists no tensors"}},
      {R"({"weight_map":{"alpha":3}})", {"'alpha'", "must be a file name"}},
      {R"({"weight_map":{"alpha":"../x.safetensors"}})", {"'alpha'", "not a file name inside"}},
      {R"({"weight_map":{"alpha":"/etc/x.safetensors"}})", {"'alpha'", "not a file name inside"}},
      {R"({"weight_map":{"alpha":"model-00001-of-00002.safetensors",)"
       R"("alpha":"model-00002-of-00002.safetensors"}})",
       {"duplicate", "'alpha'"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    TempDir dir;
    write_two_shards(dir);
    const auto index = dir / "model.safetensors.index.json";
    write_bytes(index, c.text);
    std::vector<std::string> parts = c.parts;
    parts.push_back(index.string());
    expect_error([&] { SafetensorsCheckpoint::open(dir.path()); }, parts);
  }
}

TEST(SafetensorsCheckpoint, BrokenShardNamesTheShard) {
  TempDir dir;
  write_bytes(dir / "model-00001-of-00002.safetensors", shard_image({"alpha", "beta"}));
  write_bytes(dir / "model-00002-of-00002.safetensors", "garbage!!");
  write_bytes(dir / "model.safetensors.index.json", kGoodIndex);
  expect_error([&] { SafetensorsCheckpoint::open(dir.path()); },
               {(dir / "model-00002-of-00002.safetensors").string()});
}

TEST(SafetensorsCheckpoint, DirectoryWithoutIndex) {
  TempDir dir;
  write_bytes(dir / "b.safetensors", shard_image({"two"}));
  write_bytes(dir / "a.safetensors", shard_image({"one", "three"}));
  write_bytes(dir / "notes.txt", "not a shard");
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir.path());
  EXPECT_EQ(ckpt.num_files(), 2u);
  ASSERT_EQ(ckpt.files().size(), 2u);
  EXPECT_EQ(ckpt.files()[0].path(), dir / "a.safetensors");  // sorted by name
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"one", "three", "two"}));
  EXPECT_EQ(ckpt.file_of("two"), dir / "b.safetensors");
  EXPECT_EQ(text_of(ckpt.view("three")), "three");
  EXPECT_EQ(ckpt.total_tensor_bytes(), 3u + 5u + 3u);
}

TEST(SafetensorsCheckpoint, DuplicateAcrossFilesWithoutIndex) {
  TempDir dir;
  write_bytes(dir / "a.safetensors", shard_image({"one", "dup"}));
  write_bytes(dir / "b.safetensors", shard_image({"dup"}));
  expect_error([&] { SafetensorsCheckpoint::open(dir.path()); },
               {dir.path().string(), "'dup'", "a.safetensors", "b.safetensors", "both"});
}

TEST(SafetensorsCheckpoint, EmptyOrMissingDirectory) {
  TempDir dir;
  write_bytes(dir / "config.json", "{}");
  expect_error([&] { SafetensorsCheckpoint::open(dir.path()); },
               {dir.path().string(), "no model.safetensors.index.json", "*.safetensors"});
  const auto missing = dir / "nope";
  expect_error([&] { SafetensorsCheckpoint::open(missing); }, {missing.string(), "does not exist"});
}

TEST(SafetensorsCheckpoint, SingleFilePath) {
  TempDir dir;
  const auto file = dir / "one.safetensors";
  write_bytes(file, shard_image({"x", "yy"}));
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(file);
  EXPECT_EQ(ckpt.num_files(), 1u);
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"x", "yy"}));
  EXPECT_EQ(text_of(ckpt.view("yy")), "yy");
}
