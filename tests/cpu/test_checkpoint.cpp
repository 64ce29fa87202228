// The checkpoint validation pass: every tensor the architecture needs, with the right dtype and
// shape, checked from headers alone; NaN block scales refused by name. Real files on disk: a
// tiny NVFP4 model is made with the CLI, then rewritten with one thing broken.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <vector>

#include "cli_runner.h"
#include "core/error.h"
#include "format/checkpoint.h"
#include "format/safetensors_writer.h"

namespace fs = std::filesystem;
using namespace tetra;
using tetra::test::run_tetra;
using tetra::test::TempDir;

namespace {

const std::string kExpertUp = "model.layers.1.mlp.experts.2.up_proj";

// Copies `src` into `dst` with `edit` applied to the plan and bytes of each tensor; returning
// false drops the tensor.
using Edit = std::function<bool(TensorPlan&, std::vector<uint8_t>&)>;
void rewrite(const fs::path& src, const fs::path& dst, const Edit& edit) {
  fs::create_directories(dst);
  for (const char* f : {"config.json", "hf_quant_config.json"}) fs::copy_file(src / f, dst / f);
  const auto ck = SafetensorsCheckpoint::open(src);
  std::vector<TensorPlan> plans;
  std::vector<std::vector<uint8_t>> data;
  for (const std::string& name : ck.names()) {
    const TensorView v = ck.view(name);
    TensorPlan p{name, v.dtype, v.shape};
    std::vector<uint8_t> bytes(v.data, v.data + v.nbytes);
    if (!edit(p, bytes)) continue;
    plans.push_back(p);
    data.push_back(std::move(bytes));
  }
  std::vector<std::pair<TensorPlan, const void*>> tensors;
  for (size_t i = 0; i < plans.size(); ++i) tensors.push_back({plans[i], data[i].data()});
  write_safetensors(dst / "model.safetensors", tensors);
}

class CheckpointValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto r = run_tetra("make-model --preset tiny-glm4.5-air --dtype nvfp4 " + good().string());
    ASSERT_EQ(r.code, 0) << r.output;
  }
  fs::path good() const { return dir_.path() / "good"; }
  fs::path broken() const { return dir_.path() / "broken"; }
  std::string problems_of(const Edit& edit) {
    rewrite(good(), broken(), edit);
    const Checkpoint ck = Checkpoint::open(broken());
    std::string all;
    for (const std::string& p : ck.problems()) all += p + "\n";
    return all;
  }
  TempDir dir_{"checkpoint"};
};

}  // namespace

TEST_F(CheckpointValidation, GoodCheckpointHasNoProblems) {
  const Checkpoint ck = Checkpoint::open(good());
  EXPECT_TRUE(ck.problems().empty());
  EXPECT_NO_THROW(ck.validate());
  const LinearTensors lin = ck.linear(kExpertUp);
  EXPECT_TRUE(lin.quantized);
  ASSERT_TRUE(lin.weight_scale.has_value());
  EXPECT_EQ(lin.weight.shape[1] * 2 / 16, lin.weight_scale->shape[1]);
  EXPECT_NO_THROW(ck.check_scales_finite(lin));
  EXPECT_THROW(ck.linear("model.layers.1.mlp.no_such_proj"), tetra::Error);
}

TEST_F(CheckpointValidation, MissingTensorIsNamed) {
  const std::string p = problems_of([](TensorPlan& t, std::vector<uint8_t>&) {
    return t.name != kExpertUp + ".weight_scale";
  });
  EXPECT_NE(p.find("missing tensor " + kExpertUp + ".weight_scale"), std::string::npos) << p;
  const Checkpoint ck = Checkpoint::open(broken());
  try {
    ck.validate();
    FAIL() << "validate() accepted a checkpoint with a missing tensor";
  } catch (const tetra::Error& e) {
    EXPECT_NE(std::string(e.what()).find(kExpertUp + ".weight_scale"), std::string::npos) << e.what();
  }
}

TEST_F(CheckpointValidation, WrongDtypeIsNamedWithTheFile) {
  const std::string p = problems_of([](TensorPlan& t, std::vector<uint8_t>&) {
    if (t.name == kExpertUp + ".weight") t.dtype = DType::I8;  // same size, wrong meaning
    return true;
  });
  EXPECT_NE(p.find(kExpertUp + ".weight in "), std::string::npos) << p;
  EXPECT_NE(p.find("has dtype I8, expected U8"), std::string::npos) << p;
  EXPECT_NE(p.find("model.safetensors"), std::string::npos) << p;
}

TEST_F(CheckpointValidation, WrongShapeIsNamed) {
  const std::string p = problems_of([](TensorPlan& t, std::vector<uint8_t>& bytes) {
    if (t.name == kExpertUp + ".weight_scale") {  // drop the last row
      bytes.resize(bytes.size() - size_t(t.shape[1]));
      t.shape[0] -= 1;
    }
    return true;
  });
  EXPECT_NE(p.find(kExpertUp + ".weight_scale in "), std::string::npos) << p;
  EXPECT_NE(p.find("has shape"), std::string::npos) << p;
}

TEST_F(CheckpointValidation, HighPrecisionMayBeAnyFloatDtype) {
  // A norm stored as F32 instead of BF16 is fine; as I32 it is not.
  const std::string ok = problems_of([](TensorPlan& t, std::vector<uint8_t>& bytes) {
    if (t.name == "model.norm.weight") {
      std::vector<uint8_t> wide(bytes.size() * 2, 0);
      for (size_t i = 0; i < bytes.size() / 2; ++i) std::memcpy(&wide[4 * i + 2], &bytes[2 * i], 2);
      bytes = wide;
      t.dtype = DType::F32;
    }
    return true;
  });
  EXPECT_EQ(ok, "");
  fs::remove_all(broken());
  const std::string bad = problems_of([](TensorPlan& t, std::vector<uint8_t>& bytes) {
    if (t.name == "model.norm.weight") {
      bytes.resize(bytes.size() * 2);
      t.dtype = DType::I32;
    }
    return true;
  });
  EXPECT_NE(bad.find("model.norm.weight"), std::string::npos) << bad;
}

TEST_F(CheckpointValidation, NanBlockScaleIsRefusedByName) {
  rewrite(good(), broken(), [](TensorPlan& t, std::vector<uint8_t>& bytes) {
    if (t.name == kExpertUp + ".weight_scale") bytes[5] = 0x7f;  // E4M3 NaN
    return true;
  });
  const Checkpoint ck = Checkpoint::open(broken());
  EXPECT_TRUE(ck.problems().empty()) << "headers are fine; the values are not";
  try {
    ck.check_scales_finite(ck.linear(kExpertUp));
    FAIL() << "a NaN block scale was accepted";
  } catch (const tetra::Error& e) {
    EXPECT_NE(std::string(e.what()).find(kExpertUp + ".weight_scale"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("byte 5"), std::string::npos) << e.what();
  }
  // inspect reports header problems and exits 1; here there are none
  EXPECT_EQ(run_tetra("inspect " + broken().string()).code, 0);
}

TEST_F(CheckpointValidation, InspectExitsOneAndListsProblems) {
  problems_of([](TensorPlan& t, std::vector<uint8_t>&) { return t.name != "lm_head.weight"; });
  const auto r = run_tetra("inspect " + broken().string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("missing tensor lm_head.weight"), std::string::npos) << r.output;
}
