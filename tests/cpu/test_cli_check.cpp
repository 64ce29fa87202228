// `tetra check` as a user runs it: the real binary, its exit codes, its table and its JSON.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/cuda_check.h"
#include "format/model_config.h"
#include "format/quant_config.h"
#include "moe/backend_caps.h"

using namespace tetra;
namespace fs = std::filesystem;

namespace {

struct RunResult {
  int code = -1;
  std::string out;  // stdout and stderr together
};

RunResult run_tetra(const std::string& args) {
  const std::string cmd = std::string(TETRA_BINARY) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << cmd;
  RunResult r;
  if (!pipe) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A checkpoint directory with only the files check reads: config.json and hf_quant_config.json.
fs::path write_checkpoint(const std::string& preset, QuantAlgo algo) {
  const fs::path dir = fs::temp_directory_path() /
                       ("tetra_check_" + preset + "_" + std::to_string(int(algo)) + "_" +
                        std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << model_config_to_json(preset_config(preset)).dump(2);
  if (algo != QuantAlgo::None) {
    QuantConfig q;
    q.algo = algo;
    q.producer = "modelopt";
    q.exclude = {"lm_head"};
    std::ofstream(dir / "hf_quant_config.json") << quant_config_to_hf_json(q).dump(2);
  }
  return dir;
}

}  // namespace

TEST(CliCheck, AutoPicksW4A16OnH200) {
  const RunResult r = run_tetra("check --preset glm4.5-air --gpu h200");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "auto: cuda-w4a16")) << r.out;
  EXPECT_TRUE(contains(r.out, "-> fits")) << r.out;
  // One row per declared backend.
  for (const std::string& name : backend_names()) EXPECT_TRUE(contains(r.out, "\n" + name + " ")) << name;
}

TEST(CliCheck, TooBigForOneGpuExitsNonZero) {
  const RunResult one = run_tetra("check --preset glm5 --gpu h200");
  EXPECT_EQ(one.code, 3) << one.out;
  EXPECT_TRUE(contains(one.out, "does NOT fit")) << one.out;
  EXPECT_TRUE(contains(one.out, "auto: none")) << one.out;
  const RunResult eight = run_tetra("check --preset glm5 --gpu h200 --tp 8 --ep 8");
  EXPECT_EQ(eight.code, 0) << eight.out;
  EXPECT_TRUE(contains(eight.out, "auto: cuda-w4a16")) << eight.out;
}

// The runtime line: whether generate/serve/bench decode run the whole model, apart from the MoE
// verdicts (which keep the exit code).
TEST(CliCheck, SaysWhetherTheModelRuntimeRunsTheModel) {
  const RunResult air = run_tetra("check --preset glm4.5-air --gpu h200 --json");
  ASSERT_EQ(air.code, 0) << air.out;
  const nlohmann::json ja = nlohmann::json::parse(air.out);
  EXPECT_EQ(ja["runtime"]["runs_model"], true);
  EXPECT_TRUE(ja["runtime"]["reasons"].empty());

  // MLA runs, on one GPU or split: DeepSeek-V3, and GLM-5 with its DSA indexer.
  for (const char* preset : {"deepseek-v3", "glm5"}) {
    const RunResult mla =
        run_tetra(std::string("check --preset ") + preset + " --gpu h200 --tp 8 --ep 8 --json");
    EXPECT_EQ(mla.code, 0) << mla.out;  // its MoE layers run
    EXPECT_EQ(nlohmann::json::parse(mla.out)["runtime"]["runs_model"], true) << mla.out;
  }

  // A GQA model whose head_dim the CUDA attention kernels lack: refused for the cuda backend
  // only when a GPU is the target.
  ModelConfig c = preset_config("tiny-glm4.5-air");
  c.head_dim = 32;
  const fs::path dir = fs::temp_directory_path() / ("tetra_check_hd32_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << model_config_to_json(c).dump(2);
  const RunResult gpu = run_tetra("check --model " + dir.string() + " --gpu h100 --json");
  const nlohmann::json jg = nlohmann::json::parse(gpu.out);
  EXPECT_EQ(jg["runtime"]["runs_model"], false) << gpu.out;
  ASSERT_EQ(jg["runtime"]["reasons"].size(), 1u) << gpu.out;
  EXPECT_TRUE(contains(jg["runtime"]["reasons"][0].get<std::string>(), "cuda backend: head_dim 32"))
      << gpu.out;
  fs::remove_all(dir);
}

TEST(CliCheck, JsonParsesAndAgreesWithTheExitCode) {
  const RunResult r = run_tetra("check --preset glm4.5-air --gpu h200 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["auto"], "cuda-w4a16");
  EXPECT_EQ(j["can_run"], true);
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_EQ(j["gpu"]["name"], "h200");
  EXPECT_TRUE(j["gpu"]["sources"]["bandwidth"].get<std::string>().find("DEVICE.md") != std::string::npos);
  EXPECT_EQ(j["backends"].size(), backend_names().size());
  EXPECT_EQ(j["parallel"]["gpus"], 1);
  EXPECT_EQ(j["memory"]["fits_gpu"], true);
  for (const auto& b : j["backends"]) {
    EXPECT_EQ(b["ok"].get<bool>(), b["reasons"].empty()) << b.dump();
    EXPECT_TRUE(b.contains("declaration"));
  }

  const RunResult bad = run_tetra("check --preset glm5 --gpu h200 --json");
  EXPECT_EQ(bad.code, 3);
  const nlohmann::json jb = nlohmann::json::parse(bad.out);
  EXPECT_TRUE(jb["auto"].is_null());
  EXPECT_EQ(jb["exit_code"], 3);
  EXPECT_EQ(jb["memory"]["fits_gpu"], false);
}

TEST(CliCheck, NamedBackendRefusedWithItsReasons) {
  const RunResult w4a4 =
      run_tetra("check --preset glm4.5-air --quant w4a16_nvfp4 --gpu h200 --backend cuda-w4a4");
  EXPECT_EQ(w4a4.code, 3) << w4a4.out;
  EXPECT_TRUE(contains(w4a4.out, "checkpoint is W4A16_NVFP4: no input_scale for W4A4")) << w4a4.out;
  EXPECT_TRUE(contains(w4a4.out, "cuda-w4a4: cannot run")) << w4a4.out;

  const RunResult sm120 =
      run_tetra("check --preset qwen3-30b-a3b --gpu rtx-pro-6000 --backend trtllm-gen-fp4-sm100");
  EXPECT_EQ(sm120.code, 3) << sm120.out;
  EXPECT_TRUE(contains(sm120.out, "needs SM100 or SM103 (tcgen05); this GPU is SM120")) << sm120.out;
  EXPECT_TRUE(contains(sm120.out, "not built in this version")) << sm120.out;

  const RunResult ok = run_tetra("check --preset glm4.5-air --gpu h200 --backend cuda-w4a16");
  EXPECT_EQ(ok.code, 0) << ok.out;
}

TEST(CliCheck, ParallelProblemsArePrintedOnce) {
  const RunResult r = run_tetra("check --preset qwen3-30b-a3b --gpu h200 --tp 3");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_TRUE(contains(r.out, "shared problems (every GPU backend):")) << r.out;
  const std::string reason = "tp=3 does not divide 32 attention heads";
  const size_t first = r.out.find(reason);
  ASSERT_NE(first, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(reason, first + 1), std::string::npos) << r.out;
  EXPECT_TRUE(contains(r.out, "shared problems listed above")) << r.out;
}

TEST(CliCheck, ModelDirectoryReadsTheQuantConfig) {
  const fs::path w4a16 = write_checkpoint("tiny-qwen3-30b-a3b", QuantAlgo::W4A16_NVFP4);
  const RunResult refused =
      run_tetra("check --model " + w4a16.string() + " --gpu h200 --backend cuda-w4a4");
  EXPECT_EQ(refused.code, 3) << refused.out;
  EXPECT_TRUE(contains(refused.out, "checkpoint is W4A16_NVFP4: no input_scale for W4A4")) << refused.out;
  const fs::path nvfp4 = write_checkpoint("tiny-qwen3-30b-a3b", QuantAlgo::NVFP4);
  const RunResult runs = run_tetra("check --model " + nvfp4.string() + " --gpu h200 --backend cuda-w4a16");
  EXPECT_EQ(runs.code, 0) << runs.out;
  // cuda-w4a4 runs an NVFP4 (input_scale) checkpoint when asked; auto stays on cuda-w4a16.
  const RunResult w4a4 = run_tetra("check --model " + nvfp4.string() + " --gpu h200 --backend cuda-w4a4");
  EXPECT_EQ(w4a4.code, 0) << w4a4.out;
  EXPECT_FALSE(contains(w4a4.out, "not built in this version")) << w4a4.out;
  EXPECT_FALSE(contains(w4a4.out, "no input_scale")) << w4a4.out;
  EXPECT_TRUE(contains(w4a4.out, "auto: cuda-w4a16")) << w4a4.out;
  // The declarations (--backend all) say why auto does not take it.
  const RunResult all = run_tetra("check --model " + nvfp4.string() + " --gpu h200 --backend all");
  EXPECT_TRUE(contains(all.out, "changes numerics vs W4A16, so auto picks it only when asked")) << all.out;
  const fs::path bf16 = write_checkpoint("tiny-qwen3-30b-a3b", QuantAlgo::None);
  const RunResult plain = run_tetra("check --model " + bf16.string() + " --gpu h200");
  EXPECT_EQ(plain.code, 0) << plain.out;
  EXPECT_TRUE(contains(plain.out, "auto: cuda-bf16")) << plain.out;  // the BF16 layer runner
  // Off Hopper the tiny model still runs on the cpu backend.
  const RunResult a100 = run_tetra("check --model " + nvfp4.string() + " --gpu a100");
  EXPECT_EQ(a100.code, 0) << a100.out;
  EXPECT_TRUE(contains(a100.out, "auto: cpu (no GPU backend can run this model on this GPU"))
      << a100.out;
  EXPECT_TRUE(contains(a100.out, "binary built for sm_90a only; this GPU is SM80")) << a100.out;
  EXPECT_FALSE(contains(plain.out, "no GPU backend can run")) << plain.out;
  for (const fs::path& d : {w4a16, nvfp4, bf16}) fs::remove_all(d);
}

TEST(CliCheck, BadInputIsAClearErrorWithExitOne) {
  const RunResult backend = run_tetra("check --preset glm5 --backend cuda-fp4");
  EXPECT_EQ(backend.code, 1) << backend.out;
  EXPECT_TRUE(contains(backend.out, "unknown backend 'cuda-fp4'")) << backend.out;
  for (const std::string& name : backend_names()) EXPECT_TRUE(contains(backend.out, name)) << name;

  const RunResult gpu = run_tetra("check --preset glm5 --gpu h300");
  EXPECT_EQ(gpu.code, 1) << gpu.out;
  EXPECT_TRUE(contains(gpu.out, "unknown GPU 'h300'")) << gpu.out;
  EXPECT_TRUE(contains(gpu.out, "rtx-pro-6000")) << gpu.out;

  const RunResult preset = run_tetra("check --preset glm9 --gpu h200");
  EXPECT_EQ(preset.code, 1) << preset.out;
  EXPECT_TRUE(contains(preset.out, "glm9")) << preset.out;
  EXPECT_TRUE(contains(preset.out, "glm4.5-air")) << preset.out;

  const RunResult none = run_tetra("check --gpu h200");
  EXPECT_EQ(none.code, 1) << none.out;
  EXPECT_TRUE(contains(none.out, "--model DIR or --preset NAME")) << none.out;

  const RunResult missing = run_tetra("check --model /nonexistent/tetra/model --gpu h200");
  EXPECT_EQ(missing.code, 1) << missing.out;
  EXPECT_TRUE(contains(missing.out, "/nonexistent/tetra/model")) << missing.out;

  const RunResult quant = run_tetra("check --preset glm5 --quant int4");
  EXPECT_EQ(quant.code, 1) << quant.out;
  EXPECT_TRUE(contains(quant.out, "w4a16_nvfp4")) << quant.out;

  const RunResult tp0 = run_tetra("check --preset glm5 --gpu h200 --tp 0");
  EXPECT_EQ(tp0.code, 1) << tp0.out;
}

TEST(CliCheck, AllPrintsEveryDeclarationWithSources) {
  const RunResult r = run_tetra("check --preset glm5 --gpu rtx-pro-6000 --backend all");
  EXPECT_EQ(r.code, 3) << r.out;  // nothing runs GLM-5 on one 96 GB card
  EXPECT_TRUE(contains(r.out, "declarations:")) << r.out;
  EXPECT_TRUE(contains(r.out, "source: FlashInfer issue #3807")) << r.out;
  EXPECT_TRUE(contains(r.out, "needs 118,784 B of shared memory per block; SM120 allows 101,376 B"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "needs 208,640 B of shared memory per block; SM120 allows 101,376 B"))
      << r.out;
}

// The SM100 kernels of other engines declare no shared-memory figure: each row says it was not
// checked, and the declaration why.
TEST(CliCheck, AnUndeclaredSharedMemoryNeedIsNamed) {
  const RunResult r = run_tetra("check --preset qwen3-30b-a3b --gpu b200 --backend all");
  const std::string note = "shared memory per block not checked: no published per-block figure";
  size_t rows = 0;
  for (size_t at = r.out.find(note); at != std::string::npos; at = r.out.find(note, at + 1)) ++rows;
  EXPECT_EQ(rows, 3u) << r.out;  // trtllm-gen, CuTe DSL and CUTLASS on SM100
  EXPECT_TRUE(contains(r.out, "shared memory per block: not declared (no published per-block "
                              "figure for these kernels)"))
      << r.out;
  const nlohmann::json j = nlohmann::json::parse(
      run_tetra("check --preset qwen3-30b-a3b --gpu b200 --backend all --json").out);
  for (const auto& b : j["backends"])
    EXPECT_EQ(b["unchecked"].empty(), !b["declaration"]["shared_memory"].empty() ||
                                          b["declaration"]["runs_on_cpu"].get<bool>())
        << b.dump();
}

TEST(CliCheck, AutoGpuOnThisMachine) {
  const RunResult r = run_tetra("check --preset tiny-glm5");
  if (cuda_available()) {
    EXPECT_TRUE(contains(r.out, "(detected)")) << r.out;
  } else {
    EXPECT_EQ(r.code, 0) << r.out;  // the cpu backend runs a tiny model anywhere
    EXPECT_TRUE(contains(r.out, "GPU:     none on this machine")) << r.out;
    EXPECT_TRUE(contains(r.out, "auto: cpu")) << r.out;
    EXPECT_TRUE(contains(r.out, "no CUDA GPU on this machine")) << r.out;
  }
}
