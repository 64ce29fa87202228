// ShardedSafetensorsWriter and write_safetensors: round trips through the reader, and the bytes on
// disk checked independently (plain nlohmann JSON and manual offsets), plus every misuse refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "format/safetensors_checkpoint.h"
#include "format/safetensors_writer.h"
#include "test_safetensors_util.h"

using namespace tetra;
using namespace tetra::testing;
namespace fs = std::filesystem;

namespace {

// Deterministic pseudo-random payload of n bytes.
std::string payload(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out(n, '\0');
  for (char& c : out) c = char(rng() & 0xff);
  return out;
}

struct RawFile {
  uint64_t header_len = 0;
  nlohmann::json header;
  std::string bytes;
};

// Reads a written file without the library: length prefix, JSON, everything.
RawFile read_raw(const fs::path& path) {
  RawFile f;
  f.bytes = read_bytes(path);
  if (f.bytes.size() < 8) throw std::runtime_error("short file " + path.string());
  for (int i = 0; i < 8; ++i) f.header_len |= uint64_t(uint8_t(f.bytes[i])) << (8 * i);
  f.header = nlohmann::json::parse(f.bytes.substr(8, f.header_len));
  return f;
}

std::string view_bytes(const TensorView& v) {
  return std::string(reinterpret_cast<const char*>(v.data), v.nbytes);
}

std::vector<std::string> dir_listing(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(SafetensorsWriter, SingleShardAllDtypesRoundTrip) {
  TempDir dir;
  const auto out = dir / "ckpt";
  // One tensor of every dtype; byte counts written out by hand: numel * element size.
  struct T {
    TensorPlan plan;
    size_t bytes;
  };
  const std::vector<T> ts = {
      {{"f32", DType::F32, {2, 3}}, 24},     {{"f16", DType::F16, {5}}, 10},
      {{"bf16", DType::BF16, {1, 1, 3}}, 6}, {{"e4m3", DType::F8_E4M3, {7}}, 7},
      {{"u8", DType::U8, {3, 3}}, 9},        {{"i8", DType::I8, {1}}, 1},
      {{"i32", DType::I32, {2}}, 8},         {{"i64", DType::I64, {3}}, 24},
      {{"bool", DType::BOOL, {4}}, 4},       {{"scalar", DType::F32, {}}, 4},
      {{"empty", DType::BF16, {0, 8}}, 0},
  };
  std::vector<std::string> data;
  std::vector<TensorPlan> plan;
  for (size_t i = 0; i < ts.size(); ++i) {
    data.push_back(payload(ts[i].bytes, uint32_t(i)));
    plan.push_back(ts[i].plan);
  }
  {
    ShardedSafetensorsWriter w(out, 1 << 20, {{"producer", "tetra-test"}});
    w.plan(plan);
    EXPECT_EQ(w.num_shards(), 1u);
    for (size_t i = ts.size(); i-- > 0;)  // reverse order: writes land at planned offsets
      w.write(ts[i].plan.name, data[i].data(), data[i].size());
    w.finish();
  }
  EXPECT_EQ(dir_listing(out), (std::vector<std::string>{"model.safetensors"}));

  // Independent check of the bytes: padding, metadata, contiguous offsets in plan order.
  const RawFile raw = read_raw(out / "model.safetensors");
  EXPECT_EQ(raw.header_len % 8, 0u);
  EXPECT_EQ(raw.header["__metadata__"]["format"], "pt");
  EXPECT_EQ(raw.header["__metadata__"]["producer"], "tetra-test");
  size_t offset = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto& e = raw.header.at(ts[i].plan.name);
    EXPECT_EQ(e["dtype"], std::string(dtype_name(ts[i].plan.dtype)));
    EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), ts[i].plan.shape);
    EXPECT_EQ(e["data_offsets"][0].get<size_t>(), offset) << ts[i].plan.name;
    EXPECT_EQ(e["data_offsets"][1].get<size_t>(), offset + ts[i].bytes) << ts[i].plan.name;
    EXPECT_EQ(raw.bytes.substr(8 + raw.header_len + offset, ts[i].bytes), data[i]);
    offset += ts[i].bytes;
  }
  EXPECT_EQ(raw.bytes.size(), 8 + raw.header_len + offset);

  // And through the reader.
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(out);
  EXPECT_EQ(ckpt.names().size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const TensorView v = ckpt.view(ts[i].plan.name);
    EXPECT_EQ(v.dtype, ts[i].plan.dtype);
    EXPECT_EQ(v.shape, ts[i].plan.shape);
    EXPECT_EQ(view_bytes(v), data[i]);
  }
  EXPECT_EQ(ckpt.files()[0].metadata().at("producer"), "tetra-test");
}

TEST(SafetensorsWriter, ShardsAtTheLimit) {
  TempDir dir;
  const auto out = dir / "sharded";
  // Limit 100 bytes. 60 + 40 = 100 exactly fills shard 1; the empty tensor still fits; 1 byte
  // opens shard 2; 250 > limit gets shard 3 alone; 10 opens shard 4; 90 fills it to 100.
  const std::vector<std::pair<std::string, size_t>> sizes = {
      {"t60", 60}, {"t40", 40}, {"t0", 0}, {"t1", 1}, {"big", 250}, {"t10", 10}, {"t90", 90}};
  const std::vector<int> expected_shard = {1, 1, 1, 2, 3, 4, 4};
  std::vector<TensorPlan> plan;
  for (const auto& [name, n] : sizes) plan.push_back({name, DType::U8, {int64_t(n)}});
  {
    ShardedSafetensorsWriter w(out, 100);
    w.plan(plan);
    ASSERT_EQ(w.num_shards(), 4u);
    EXPECT_EQ(w.shard_paths()[1], out / "model-00002-of-00004.safetensors");
    // Before finish only partial files exist: a crash cannot leave a valid-looking checkpoint.
    for (const std::string& name : dir_listing(out))
      EXPECT_TRUE(name.ends_with(".partial")) << name;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::string d = payload(sizes[i].second, uint32_t(100 + i));
      w.write(sizes[i].first, d.data(), d.size());
    }
    w.finish();
  }
  EXPECT_EQ(dir_listing(out),
            (std::vector<std::string>{
                "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors",
                "model.safetensors.index.json"}));

  const nlohmann::json index =
      nlohmann::json::parse(read_bytes(out / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), 60u + 40 + 0 + 1 + 250 + 10 + 90);
  ASSERT_EQ(index["weight_map"].size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::string file =
        "model-0000" + std::to_string(expected_shard[i]) + "-of-00004.safetensors";
    EXPECT_EQ(index["weight_map"][sizes[i].first], file) << sizes[i].first;
    const RawFile raw = read_raw(out / file);
    EXPECT_TRUE(raw.header.contains(sizes[i].first));
  }
  // Tensors start at offset 0 of each shard.
  EXPECT_EQ(read_raw(out / "model-00004-of-00004.safetensors").header["t10"]["data_offsets"][0], 0);

  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(out);
  EXPECT_EQ(ckpt.num_files(), 4u);
  EXPECT_EQ(ckpt.total_tensor_bytes(), 451u);
  for (size_t i = 0; i < sizes.size(); ++i)
    EXPECT_EQ(view_bytes(ckpt.view(sizes[i].first)), payload(sizes[i].second, uint32_t(100 + i)));
}

TEST(SafetensorsWriter, EmptyPlanWritesAnEmptyFile) {
  TempDir dir;
  ShardedSafetensorsWriter w(dir / "e", 10);
  w.plan({});
  w.finish();
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir / "e");
  EXPECT_TRUE(ckpt.names().empty());
  EXPECT_EQ(ckpt.files()[0].metadata().at("format"), "pt");
}

TEST(SafetensorsWriter, ConcurrentWrites) {
  TempDir dir;
  const auto out = dir / "mt";
  constexpr int kTensors = 64;
  std::vector<TensorPlan> plan;
  for (int i = 0; i < kTensors; ++i)
    plan.push_back({"t" + std::to_string(i), DType::F16, {i + 1, 3}});
  ShardedSafetensorsWriter w(out, 500);
  w.plan(plan);
  EXPECT_GT(w.num_shards(), 1u);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = t; i < kTensors; i += 4) {
        const std::string d = payload(size_t(i + 1) * 3 * 2, uint32_t(i));
        w.write("t" + std::to_string(i), d.data(), d.size());
      }
    });
  for (auto& th : threads) th.join();
  w.finish();
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(out);
  for (int i = 0; i < kTensors; ++i)
    EXPECT_EQ(view_bytes(ckpt.view("t" + std::to_string(i))),
              payload(size_t(i + 1) * 6, uint32_t(i)));
}

TEST(SafetensorsWriter, MisuseIsRefused) {
  TempDir dir;
  const auto out = dir / "m";
  const std::string four = "abcd";
  ShardedSafetensorsWriter w(out, 1000);
  expect_error([&] { w.write("a", four.data(), 4); }, {"before plan"});
  expect_error([&] { w.finish(); }, {"before plan"});
  w.plan({{"a", DType::F32, {1}}, {"b", DType::U8, {4}}, {"c", DType::I32, {2}}});
  expect_error([&] { w.plan({}); }, {out.string(), "already planned"});
  expect_error([&] { w.write("zzz", four.data(), 4); }, {out.string(), "'zzz'", "not planned"});
  expect_error([&] { w.write("a", four.data(), 3); }, {"'a'", "planned with 4 bytes, got 3"});
  expect_error([&] { w.write("a", nullptr, 4); }, {"'a'", "null"});
  w.write("a", four.data(), 4);
  expect_error([&] { w.write("a", four.data(), 4); }, {"'a'", "written twice"});
  w.write("b", four.data(), 4);
  expect_error([&] { w.finish(); }, {out.string(), "1 planned tensor(s) never written", "'c'"});
  w.write("c", "12345678", 8);
  w.finish();
  expect_error([&] { w.finish(); }, {"twice"});
  expect_error([&] { w.write("c", "12345678", 8); }, {"after finish"});
  EXPECT_EQ(view_bytes(SafetensorsFile::open(out / "model.safetensors").view("c")), "12345678");
}

TEST(SafetensorsWriter, BadPlansAreRefused) {
  TempDir dir;
  expect_error([&] { ShardedSafetensorsWriter(dir / "z", 0); }, {"max shard size"});
  {
    ShardedSafetensorsWriter w(dir / "p1", 100);
    expect_error(
        [&] {
          w.plan({{"x", DType::U8, {1}}, {"x", DType::U8, {2}}});
        },
        {"'x'", "planned twice"});
  }
  {
    ShardedSafetensorsWriter w(dir / "p2", 100);
    expect_error([&] { w.plan({{"x", DType::U8, {-1}}}); }, {"'x'", "negative"});
  }
  {
    ShardedSafetensorsWriter w(dir / "p3", 100);
    expect_error([&] { w.plan({{"__metadata__", DType::U8, {1}}}); }, {"reserved"});
  }
  {
    ShardedSafetensorsWriter w(dir / "p4", 100);
    expect_error([&] { w.plan({{"", DType::U8, {1}}}); }, {"empty name"});
  }
}

TEST(SafetensorsWriter, RefusesToMixWithAnOldCheckpoint) {
  TempDir dir;
  const auto out = dir / "old";
  fs::create_directories(out);
  write_bytes(out / "model-00001-of-00009.safetensors", "stale");
  ShardedSafetensorsWriter w(out, 100);
  expect_error(
      [&] {
        w.plan({{"x", DType::U8, {1}}});
      },
      {out.string(), "model-00001-of-00009.safetensors", "remove"});
}

TEST(SafetensorsWriter, UnfinishedWriterLeavesNothing) {
  TempDir dir;
  const auto out = dir / "u";
  {
    ShardedSafetensorsWriter w(out, 4);
    w.plan({{"a", DType::U8, {4}}, {"b", DType::U8, {4}}});
    w.write("a", "1234", 4);
    EXPECT_EQ(dir_listing(out).size(), 2u);  // the two .partial shards
  }  // destroyed without finish(), e.g. by an exception while quantizing
  EXPECT_TRUE(dir_listing(out).empty());
}

TEST(SafetensorsWriter, WriteSafetensorsConvenience) {
  TempDir dir;
  const auto path = dir / "tiny.safetensors";
  write_bytes(path, "old contents are replaced");
  const float scalar = 2.5f;
  const uint16_t halves[3] = {1, 2, 3};
  write_safetensors(path,
                    {{{"s", DType::F32, {}}, &scalar},
                     {{"h", DType::BF16, {3}}, halves},
                     {{"none", DType::I64, {0}}, nullptr}},
                    {{"format", "custom"}});
  const RawFile raw = read_raw(path);
  EXPECT_EQ(raw.header_len % 8, 0u);
  EXPECT_EQ(raw.header["__metadata__"]["format"], "custom");  // the caller's value is kept
  EXPECT_EQ(raw.header["s"]["data_offsets"], nlohmann::json::array({0, 4}));
  EXPECT_EQ(raw.header["h"]["data_offsets"], nlohmann::json::array({4, 10}));
  EXPECT_EQ(raw.header["none"]["data_offsets"], nlohmann::json::array({10, 10}));
  const SafetensorsFile f = SafetensorsFile::open(path);
  float got = 0;
  std::memcpy(&got, f.view("s").data, 4);
  EXPECT_EQ(got, 2.5f);
  EXPECT_EQ(std::memcmp(f.view("h").data, halves, 6), 0);
  EXPECT_EQ(f.view("none").nbytes, 0u);
  EXPECT_FALSE(fs::exists(dir / "tiny.safetensors.partial"));

  expect_error(
      [&] {
        write_safetensors(dir / "n.safetensors", {{{"x", DType::U8, {2}}, nullptr}});
      },
      {"'x'", "null"});
  EXPECT_FALSE(fs::exists(dir / "n.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "n.safetensors.partial"));
}
