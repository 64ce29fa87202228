// The model forward pass on the CPU backend, for every tiny preset (GQA and MLA) in bf16 and
// NVFP4. Checks that can fail: KV-cache correctness (prefill then decode == prefill of the
// longer prompt), batching (a varlen batch == each sequence alone, bit for bit), determinism.
// Agreement with Hugging Face transformers is checked by
// tests/reference/compare_hf.py on the GPU machine.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "format/safetensors_checkpoint.h"

#include "core/error.h"
#include "model_fixture.h"

namespace tetra {
namespace {

using test::ModelUnderTest;
using test::test_prompt;
using test::tiny_model;

struct Case {
  const char* preset;
  const char* dtype;
};

class ModelForward : public ::testing::TestWithParam<Case> {
 protected:
  std::filesystem::path dir() const { return tiny_model(GetParam().preset, GetParam().dtype); }
};

// A decode step recomputes nothing from the prefill except through the KV cache, so its
// logits can only match the longer prefill if the cache holds the right k/v in the right slots.
// On the CPU both attention paths add the same terms in the same order, so they agree bit for
// bit (measured: max difference 0 on every preset); a wrong or missing cache entry moves the
// logits by O(1) of their scale (WrongCacheWouldBeCaught).
constexpr double kWrongHistoryMinDiff = 0.1;

TEST_P(ModelForward, PrefillGivesFiniteDeterministicLogits) {
  ModelUnderTest m(dir());
  const int64_t V = m.vocab();
  const std::vector<int32_t> p = test_prompt(11, V, 1);
  const std::vector<float> a = m.prefill({1}, {p});
  ASSERT_EQ(a.size(), size_t(11 * V));
  for (float f : a) ASSERT_TRUE(std::isfinite(f));
  // Not all equal: the model actually depends on its input.
  double spread = 0;
  for (int64_t i = 1; i < V; ++i) spread = std::max(spread, double(std::fabs(a[size_t(i)] - a[0])));
  EXPECT_GT(spread, 1e-3);
  ModelUnderTest again(dir());
  EXPECT_EQ(a, again.prefill({1}, {p}));
}

TEST_P(ModelForward, DecodeAfterPrefillMatchesLongerPrefill) {
  ModelUnderTest full(dir()), inc(dir());
  const int64_t V = full.vocab();
  const std::vector<int32_t> p = test_prompt(13, V, 2);  // spans 4 blocks of 4
  const std::vector<float> want = full.prefill({1}, {p});  // [13, V]
  const std::vector<int32_t> head(p.begin(), p.begin() + 6);
  const std::vector<float> first = inc.prefill({1}, {head});
  EXPECT_EQ(std::vector<float>(first.begin(), first.end()),
            std::vector<float>(want.begin(), want.begin() + 6 * V))
      << "a prefill's rows depend only on the tokens before them";
  for (int pos = 6; pos < 13; ++pos) {
    const std::vector<float> got = inc.decode({1}, {p[size_t(pos)]});
    EXPECT_EQ(got, std::vector<float>(want.begin() + pos * V, want.begin() + (pos + 1) * V))
        << "position " << pos;
  }
}

TEST_P(ModelForward, WrongCacheWouldBeCaught) {
  // Decoding after a different history must change the logits a lot, or the cache checks
  // above would prove nothing.
  ModelUnderTest full(dir()), other(dir());
  const int64_t V = full.vocab();
  const std::vector<int32_t> p = test_prompt(9, V, 3);
  const std::vector<float> want = full.prefill({1}, {p});
  std::vector<int32_t> head = test_prompt(8, V, 4);  // another history, same length
  other.prefill({1}, {head});
  const std::vector<float> got = other.decode({1}, {p[8]});
  EXPECT_GT(test::rel_max_diff(got.data(), want.data() + 8 * V, V), kWrongHistoryMinDiff);
}

TEST_P(ModelForward, VarlenBatchEqualsEachSequenceAlone) {
  ModelUnderTest batch(dir());
  const int64_t V = batch.vocab();
  const std::vector<std::vector<int32_t>> prompts = {test_prompt(1, V, 5), test_prompt(7, V, 6),
                                                     test_prompt(19, V, 7), test_prompt(4, V, 8)};
  const std::vector<float> all = batch.prefill({10, 11, 12, 13}, prompts);
  size_t row = 0;
  for (size_t s = 0; s < prompts.size(); ++s) {
    ModelUnderTest alone(dir());
    const std::vector<float> one = alone.prefill({1}, {prompts[s]});
    const size_t n = prompts[s].size() * size_t(V);
    EXPECT_EQ(std::vector<float>(all.begin() + row, all.begin() + row + n), one) << "sequence " << s;
    row += n;
  }
  // Then a decode batch over caches of different lengths == each decoded alone.
  const std::vector<int32_t> next = {3, 5, 7, 11};
  const std::vector<float> dec = batch.decode({10, 11, 12, 13}, next);
  for (size_t s = 0; s < prompts.size(); ++s) {
    ModelUnderTest alone(dir());
    alone.prefill({1}, {prompts[s]});
    const std::vector<float> one = alone.decode({1}, {next[s]});
    EXPECT_EQ(std::vector<float>(dec.begin() + s * V, dec.begin() + (s + 1) * V), one)
        << "decode of sequence " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(
    TinyPresets, ModelForward,
    ::testing::Values(Case{"tiny-glm4.5-air", "bf16"}, Case{"tiny-glm4.5-air", "nvfp4"},
                      Case{"tiny-glm4.7", "bf16"}, Case{"tiny-glm4.7", "nvfp4"},
                      Case{"tiny-qwen3-30b-a3b", "bf16"}, Case{"tiny-qwen3-30b-a3b", "nvfp4"},
                      Case{"tiny-deepseek-v3", "bf16"}, Case{"tiny-deepseek-v3", "nvfp4"},
                      Case{"tiny-glm5", "bf16"}, Case{"tiny-glm5", "nvfp4"}),
    [](const ::testing::TestParamInfo<Case>& i) {
      std::string n = std::string(i.param.preset) + "_" + i.param.dtype;
      for (char& c : n)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      return n;
    });

// GLM-5's DSA indexer (tiny-glm5: index_topk 16): up to 16 keys a token reads every key, so
// its logits equal those of the same weights with a top-k past every context (dense); past 16
// they differ, and a decode after a 40-token prefill still equals the longer prefill (the index
// keys' cache is right).
TEST(ModelDsa, SparsePastTopkDenseBelowAndCacheConsistent) {
  const auto dir = tiny_model("tiny-glm5", "bf16");
  test::TempDir tmp("dsa-dense");
  const auto dense_dir = tmp.path() / "dense";
  std::filesystem::copy(dir, dense_dir, std::filesystem::copy_options::recursive);
  {
    nlohmann::json j;
    std::ifstream(dense_dir / "config.json") >> j;
    ASSERT_EQ(j["index_topk"], 16);
    j["index_topk"] = 4096;
    std::ofstream(dense_dir / "config.json") << j.dump(1);
  }
  ModelUnderTest sparse(dir), dense(dense_dir), inc(dir);
  const int64_t V = sparse.vocab();
  const std::vector<int32_t> p = test_prompt(48, V, 9);
  const std::vector<float> a = sparse.prefill({1}, {p}), b = dense.prefill({1}, {p});
  for (int pos = 0; pos < 48; ++pos) {
    const bool same = std::equal(a.begin() + pos * V, a.begin() + (pos + 1) * V, b.begin() + pos * V);
    if (pos < 16)
      EXPECT_TRUE(same) << "position " << pos << ": every key is selected";
    else if (pos >= 24)  // the selection drops 9+ keys: the logits move
      EXPECT_GT(test::rel_max_diff(a.data() + pos * V, b.data() + pos * V, V), 1e-3) << pos;
  }
  const std::vector<int32_t> head(p.begin(), p.begin() + 40);
  inc.prefill({1}, {head});
  for (int pos = 40; pos < 48; ++pos)
    EXPECT_EQ(inc.decode({1}, {p[size_t(pos)]}),
              std::vector<float>(a.begin() + pos * V, a.begin() + (pos + 1) * V))
        << "position " << pos;
}

// Every preset runs in the model runtime now; YaRN whose cos/sin factor is not 1 (mscale given
// without mscale_all_dim) is refused with the reason.
TEST(ModelLoad, RuntimeRunsEveryPresetButRefusesAYarnAttentionFactor) {
  for (const std::string& name : preset_names())
    EXPECT_TRUE(model::runtime_unsupported_reasons(preset_config(name)).empty()) << name;
  ModelConfig c = preset_config("deepseek-v3");
  c.rope.mscale_all_dim = 0;  // cos/sin scaled by 0.1 ln(40) + 1
  const std::vector<std::string> why = model::runtime_unsupported_reasons(c);
  ASSERT_EQ(why.size(), 1u);
  EXPECT_NE(why[0].find("YaRN"), std::string::npos) << why[0];
}

// Copies a tiny checkpoint and overwrites `bytes` at byte `offset` of tensor `victim` on disk.
std::filesystem::path poked_copy(const std::filesystem::path& src, const test::TempDir& tmp,
                                 const std::string& victim, size_t offset,
                                 const std::vector<uint8_t>& bytes) {
  const auto dst = tmp.path() / "model";
  std::filesystem::copy(src, dst, std::filesystem::copy_options::recursive);
  const auto file = dst / "model.safetensors";
  size_t at = std::string::npos;
  {
    const auto ck = SafetensorsCheckpoint::open(dst);
    const TensorView v = ck.view(victim);
    std::ifstream in(file, std::ios::binary);
    const std::string all(std::istreambuf_iterator<char>(in), {});
    at = all.find(std::string(reinterpret_cast<const char*>(v.data), std::min<size_t>(v.nbytes, 64)));
  }
  EXPECT_NE(at, std::string::npos);
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(std::streamoff(at + offset));
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  return dst;
}

std::string load_error(const std::filesystem::path& dir) {
  try {
    ModelUnderTest m(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelLoad, NanWeightIsRefusedNamingTheTensor) {
  test::TempDir tmp("nan-weight");
  const std::string victim = "model.layers.1.mlp.experts.3.down_proj.weight";
  const auto dir = poked_copy(tiny_model("tiny-qwen3-30b-a3b", "bf16"), tmp, victim, 6, {0xc0, 0x7f});
  const std::string err = load_error(dir);
  EXPECT_NE(err.find(victim), std::string::npos) << err;
  EXPECT_NE(err.find("non-finite"), std::string::npos) << err;
}

TEST(ModelLoad, NanBlockScaleIsRefusedNamingTheTensor) {
  test::TempDir tmp("nan-scale");
  const std::string victim = "model.layers.2.self_attn.k_proj.weight_scale";
  const auto dir = poked_copy(tiny_model("tiny-glm4.7", "nvfp4"), tmp, victim, 3, {0x7f});
  const std::string err = load_error(dir);
  EXPECT_NE(err.find(victim), std::string::npos) << err;
  EXPECT_NE(err.find("NaN"), std::string::npos) << err;
}

TEST(ModelLoad, StepsOutsideTheLimitsAreRefused) {
  ModelUnderTest m(tiny_model("tiny-glm4.5-air", "bf16"));
  const int64_t V = m.vocab();
  EXPECT_THROW(m.prefill({1}, {test_prompt(97, V, 9)}), Error);  // > max_tokens 96
  model::StepBatch bad;
  bad.kind = model::StepKind::Prefill;
  bad.tokens = {int32_t(V)};  // out of vocabulary
  bad.positions = {0};
  bad.slots = {0};
  bad.cu_seqlens = {0, 1};
  EXPECT_THROW(m.model->forward(bad), Error);
  bad.tokens = {1};
  bad.slots = {int64_t(128) * 4};  // past the cache
  EXPECT_THROW(m.model->forward(bad), Error);
  // Decode steps: one token per sequence, the new token last in its cache, valid blocks.
  model::StepBatch dec;
  dec.kind = model::StepKind::Decode;
  dec.tokens = {1};
  dec.positions = {4};
  dec.slots = {4};
  dec.cu_seqlens = {0, 1};
  dec.max_blocks_per_seq = 2;
  dec.block_tables = {0, 1};
  dec.seq_lens = {5};
  dec.logit_rows = {0};
  EXPECT_NO_THROW(m.model->forward(dec));
  model::StepBatch wrong = dec;
  wrong.positions = {3};  // not the last cached token
  EXPECT_THROW(m.model->forward(wrong), Error);
  wrong = dec;
  wrong.block_tables = {0, 128};  // block outside the cache
  EXPECT_THROW(m.model->forward(wrong), Error);
  wrong = dec;
  wrong.tokens = {1, 2};  // two tokens for one sequence
  wrong.positions = {4, 5};
  wrong.slots = {4, 5};
  wrong.cu_seqlens = {0, 2};
  EXPECT_THROW(m.model->forward(wrong), Error);
}

TEST(ModelLoad, UnknownBackendNamesTheAvailableOnes) {
  model::ModelOptions o;
  o.backend = "tpu";
  o.limits = test::small_limits();
  try {
    model::Model::load(tiny_model("tiny-glm4.5-air", "bf16"), o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tetra
