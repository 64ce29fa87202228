// The shared memory a block of each MoE kernel needs on sm_90a: its static __shared__ bytes (ptxas)
// plus the dynamic bytes its launches ask for (ops/moe/moe_kernel_smem.h and bf16_moe.h, the
// figures the launch code uses), for every number of routed experts up to cuda::kMaxExperts (the
// only shape those figures depend on). Each cuda backend's declaration (moe/backend_caps.cpp) must
// cover the largest block of the kernels its layer may launch and claim no more than some kernel
// needs, so a kernel that grows, shrinks or is added fails here rather than surprising check.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "cpu/ptxas_report.h"
#include "moe/backend_caps.h"
#include "ops/moe/bf16_moe.h"
#include "ops/moe/moe_kernel_smem.h"
#include "ops/moe/moe_ops_cuda.h"

namespace {

using tetra::test::KernelBudget;
namespace smem = tetra::moe_smem;
constexpr int kMaxE = tetra::moe::cuda::kMaxExperts;

// Dynamic shared memory of a kernel's launches for a layer of E routed experts (0: not launched).
using Dynamic = std::function<int64_t(int E)>;

// A kernel family of one source file; the pattern's groups (its template arguments) give the
// dynamic shared memory of its launches.
struct KernelRule {
  std::string pattern;  // regex on the mangled name
  std::function<Dynamic(const std::smatch&)> dynamic;
};

Dynamic fixed(int64_t bytes) {
  return [bytes](int) { return bytes; };
}
KernelRule none(const std::string& pattern) {
  return {pattern, [](const std::smatch&) { return fixed(0); }};
}
int arg(const std::smatch& m, int i) { return std::stoi(m[i].str()); }

const std::map<std::string, std::vector<KernelRule>>& rules() {
  static const std::map<std::string, std::vector<KernelRule>> all = {
      {"src/ops/moe/router_logits.cu", {none("router_logits_kernel")}},
      // x in bf16 (t: unsigned short) as the layer runs it; f32 x (f) the layer never launches.
      {"src/ops/moe/router_logits_tiled.cu",
       {{R"(router_logits_tiled_kernelItLi(\d+)ELi(\d+)ELi(\d+)E)",
         [](const std::smatch& m) { return fixed(smem::router_tiled(2, arg(m, 1), arg(m, 2), arg(m, 3))); }},
        none("router_logits_tiled_kernelIf")}},
      // route_kernel<softmax, experts per lane>: the variant of up to 32 lanes x that many.
      {"src/ops/moe/routing.cu",
       {{R"(route_kernelILb[01]ELi(\d+)E)",
         [](const std::smatch& m) -> Dynamic {
           const int most = 32 * arg(m, 1);
           return [most](int E) { return E <= most ? int64_t(smem::route(E)) : 0; };
         }}}},
      {"src/ops/moe/layout.cu",
       {{"layout_(fused|scan|place)_kernel",
         [](const std::smatch&) -> Dynamic { return [](int E) { return int64_t(smem::layout(E)); }; }},
        {"layout_count_kernel", [](const std::smatch&) -> Dynamic {
           return [](int E) { return int64_t(smem::layout_count(E)); };
         }}}},
      // E local experts <= E global: the most is at E local = E global.
      {"src/ops/moe/token_path.cu",
       {{"small_token_path_kernel",
         [](const std::smatch&) -> Dynamic { return [](int E) { return int64_t(smem::token_path(E, E)); }; }},
        none("prepare_rows_kernel")}},
      // The tiny kernel asks for whatever the GPU allows beyond its static bytes and, where its
      // smallest staging does not fit, the general kernel above runs instead: it raises no need.
      {"src/ops/moe/token_path_tiny.cu", {none("tiny_token_path_kernel")}},
      {"src/ops/moe/combine.cu", {none("combine_kernel|combine_add_norm_kernel")}},
      {"src/ops/moe/moe_layer_cuda.cu", {none("fill_random_bytes|fill_random_bf16|fill_f32")}},
      {"src/ops/moe/w4a16_decode.cu",
       {none("moe_decode_kernel|moe_decode_routed_kernel|moe_decode_routed_fold_kernel|moe_decode_pair_kernel")}},
      {"src/ops/moe/w4a16_tiled.cu",
       {{"moe_tiled_kernel", [](const std::smatch&) { return fixed(smem::kTiled); }}}},
      {"src/ops/moe/w4a16_wgmma.cu",
       {{R"(moe_wgmma_kernelILi(\d+)E)",
         [](const std::smatch& m) { return fixed(smem::wgmma(arg(m, 1))); }},
        none("to_wgmma_order_kernel")}},
      {"src/ops/moe/persistent_layer.cu", {none("persistent_layer_kernel")}},
      {"src/ops/moe/w4a4_moe.cu", {none("quantize_rows_kernel")}},
      {"src/ops/moe/bf16_moe.cu",
       {{"bf16_moe_kernel", [](const std::smatch&) { return fixed(tetra::kMoeBf16SmemBytes); }}}},
  };
  return all;
}

// The kernel files each backend's layer (ops/moe/moe_layer_cuda.cu) may launch from. The shared
// expert runs the GEMMs of its own format: BF16 under the NVFP4 backends, NVFP4 (decode and tiled
// W4A16 kernels on x as it is: never wgmma, whose x order only routed W4A16 experts make) under
// cuda-bf16.
std::vector<std::string> sources_of(const std::string& backend) {
  std::vector<std::string> s = {"src/ops/moe/router_logits.cu", "src/ops/moe/router_logits_tiled.cu",
                                "src/ops/moe/routing.cu",       "src/ops/moe/layout.cu",
                                "src/ops/moe/token_path.cu",    "src/ops/moe/token_path_tiny.cu",
                                "src/ops/moe/combine.cu",       "src/ops/moe/moe_layer_cuda.cu",
                                "src/ops/moe/w4a16_decode.cu",  "src/ops/moe/w4a16_tiled.cu",
                                "src/ops/moe/bf16_moe.cu"};
  // W4A16 / W4A4 experts: the wgmma GEMMs from 9 rows per expert; cuda-w4a16 also the persistent
  // layer, cuda-w4a4 its activation quantizer.
  if (backend == "cuda-w4a16")
    for (const char* f : {"src/ops/moe/w4a16_wgmma.cu", "src/ops/moe/persistent_layer.cu"}) s.push_back(f);
  if (backend == "cuda-w4a4")
    for (const char* f : {"src/ops/moe/w4a16_wgmma.cu", "src/ops/moe/w4a4_moe.cu"}) s.push_back(f);
  return s;
}

struct KernelNeed {
  std::string name;
  int64_t static_bytes = 0;
  Dynamic dynamic;
  int64_t total(int E) const { return static_bytes + dynamic(E); }
};

// Every kernel of the MoE kernel files with its need; a kernel no rule (or two rules) covers
// fails the test: give it its rule above.
std::map<std::string, std::vector<KernelNeed>> kernel_needs() {
  std::vector<std::string> files;
  for (const auto& [file, r] : rules()) files.push_back(file);
  std::map<std::string, std::vector<KernelNeed>> out;
  for (const auto& [file, kernels] : tetra::test::compile_and_read(files)) {
    for (const KernelBudget& k : kernels) {
      std::vector<KernelNeed> hits;
      for (const KernelRule& rule : rules().at(file)) {
        std::smatch m;
        if (std::regex_search(k.name, m, std::regex(rule.pattern)))
          hits.push_back({k.name, k.static_smem, rule.dynamic(m)});
      }
      EXPECT_EQ(hits.size(), 1u) << file << ": " << k.name << " matches " << hits.size()
                                 << " shared-memory rules";
      if (hits.size() == 1) out[file].push_back(hits[0]);
    }
  }
  return out;
}

tetra::MoeWorkload with_experts(int E) {
  tetra::MoeWorkload w;
  w.experts = E;
  w.moe_intermediate_per_gpu = 1 << 20;  // every intermediate threshold met
  return w;
}

// For every expert count the backends take, the declaration covers the largest block; each entry
// is some kernel's real need (not more); each threshold is the first count the smaller entries
// no longer cover.
TEST(MoeKernelSmem, EachCudaBackendDeclaresItsLargestKernel) {
  const auto needs = kernel_needs();
  for (const char* backend : {"cuda-w4a16", "cuda-w4a4", "cuda-bf16"}) {
    SCOPED_TRACE(backend);
    const tetra::BackendCaps* caps = tetra::find_backend(backend);
    ASSERT_NE(caps, nullptr);
    std::vector<int64_t> need(kMaxE + 1, 0);
    std::vector<std::string> largest(kMaxE + 1);
    for (const std::string& file : sources_of(backend)) {
      ASSERT_TRUE(needs.count(file)) << file << " gave no kernels";
      for (const KernelNeed& k : needs.at(file))
        for (int E = 1; E <= kMaxE; ++E)
          if (k.total(E) > need[size_t(E)]) need[size_t(E)] = k.total(E), largest[size_t(E)] = k.name;
    }
    const auto declared = [&](int E) { return tetra::smem_needed(*caps, with_experts(E)); };
    for (int E = 1; E <= kMaxE; ++E) {
      ASSERT_GE(declared(E), need[size_t(E)])
          << E << " experts: " << largest[size_t(E)] << " needs " << need[size_t(E)] << " B";
    }
    for (const tetra::SmemNeed& d : caps->smem) {
      EXPECT_EQ(d.from_moe_intermediate, 0);
      const int from = int(std::max<int64_t>(d.from_experts, 1));
      EXPECT_TRUE(std::find(need.begin() + from, need.end(), d.bytes) != need.end())
          << d.bytes << " B is no kernel's need from " << from << " experts; the largest is "
          << *std::max_element(need.begin() + from, need.end()) << " B";
      if (d.from_experts > 0)
        EXPECT_GT(need[size_t(d.from_experts)], declared(int(d.from_experts) - 1))
            << "the smaller entries still cover " << d.from_experts << " experts";
    }
  }
}

}  // namespace
