// The CUDA MoE layer's host-side settings, checked without a GPU: the TETRA_MOE_TOKEN_PATH
// override (what the model's layers and `tetra bench moe` take for A/B runs) and the argument
// checks that decide whether the persistent one-launch layer, or GEMM1 routing one token itself,
// takes a layer.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "core/error.h"
#include "ops/moe/gemm1_routing.h"
#include "ops/moe/moe_layer_cuda.h"
#include "ops/moe/persistent_layer.h"

namespace tetra::moe {
namespace {

// Sets TETRA_MOE_TOKEN_PATH for one scope, then puts back what was there.
class TokenPathEnv {
 public:
  explicit TokenPathEnv(const char* value) {
    if (const char* old = std::getenv(kName)) old_ = old;
    if (value)
      setenv(kName, value, 1);
    else
      unsetenv(kName);
  }
  ~TokenPathEnv() {
    if (old_)
      setenv(kName, old_->c_str(), 1);
    else
      unsetenv(kName);
  }

 private:
  static constexpr const char* kName = "TETRA_MOE_TOKEN_PATH";
  std::optional<std::string> old_;
};

void expect_defaults(const CudaTokenPath& p) {
  const CudaTokenPath d;
  EXPECT_EQ(p.persistent_max_tokens, d.persistent_max_tokens);
  EXPECT_EQ(p.fused_route_max_tokens, d.fused_route_max_tokens);
  EXPECT_EQ(p.shared_slot_max_tokens, d.shared_slot_max_tokens);
  EXPECT_EQ(p.shared_side_stream, d.shared_side_stream);
  EXPECT_EQ(p.combine_pdl, d.combine_pdl);
  EXPECT_EQ(p.token_path_pdl, d.token_path_pdl);
  EXPECT_EQ(p.warm_shared, d.warm_shared);
  EXPECT_EQ(p.gemm_pair, d.gemm_pair);
  EXPECT_EQ(p.gemm1_routes, d.gemm1_routes);
  EXPECT_EQ(p.gemm1_pdl, d.gemm1_pdl);
  EXPECT_EQ(p.gemm2_one_wave, d.gemm2_one_wave);
  EXPECT_EQ(p.gemm2_wide, d.gemm2_wide);
  EXPECT_EQ(p.route_pdl, d.route_pdl);
}

TEST(CudaTokenPathEnv, UnsetOrEmptyGivesTheDefaults) {
  {
    TokenPathEnv env(nullptr);
    expect_defaults(cuda_token_path_from_env());
  }
  TokenPathEnv env("");
  expect_defaults(cuda_token_path_from_env());
}

TEST(CudaTokenPathEnv, EachKeySetsItsField) {
  TokenPathEnv env(
      "persist=8,fused=4,slot=2,side=0,pdl=0,tpdl=0,warm=0,pair=2,g1route=0,g1pdl=0,g2wave=0,"
      "g2wide=0,rpdl=0");
  const CudaTokenPath p = cuda_token_path_from_env();
  EXPECT_EQ(p.persistent_max_tokens, 8);
  EXPECT_EQ(p.fused_route_max_tokens, 4);
  EXPECT_EQ(p.shared_slot_max_tokens, 2);
  EXPECT_FALSE(p.shared_side_stream);
  EXPECT_FALSE(p.combine_pdl);     // on by default
  EXPECT_FALSE(p.token_path_pdl);  // on by default
  EXPECT_FALSE(p.warm_shared);
  EXPECT_EQ(p.gemm_pair, 2);  // 1 (the rule) by default
  EXPECT_FALSE(p.gemm1_routes);  // on by default
  EXPECT_FALSE(p.gemm1_pdl);  // on by default
  EXPECT_FALSE(p.gemm2_one_wave);  // on by default
  EXPECT_FALSE(p.gemm2_wide);      // on by default
  EXPECT_FALSE(p.route_pdl);       // on by default
  EXPECT_EQ(cuda_token_path_label(p),
            "persist<=8 fused<=4 slot<=2 side=0 pdl=0 tpdl=0 warm=0 pair=2 g1route=0 g1pdl=0 "
            "g2wave=0 g2wide=0 rpdl=0");
}

TEST(CudaTokenPathEnv, KeysLeftOutKeepTheirDefaults) {
  TokenPathEnv env("persist=3");
  CudaTokenPath want;
  want.persistent_max_tokens = 3;
  const CudaTokenPath p = cuda_token_path_from_env();
  EXPECT_EQ(p.persistent_max_tokens, 3);
  EXPECT_EQ(p.fused_route_max_tokens, want.fused_route_max_tokens);
  EXPECT_EQ(p.shared_side_stream, want.shared_side_stream);
}

TEST(CudaTokenPathEnv, OldTurnsEveryFusionOff) {
  TokenPathEnv env("old");
  const CudaTokenPath p = cuda_token_path_from_env();
  EXPECT_EQ(p.persistent_max_tokens, 0);
  EXPECT_EQ(p.fused_route_max_tokens, 0);
  EXPECT_EQ(p.shared_slot_max_tokens, 0);
  EXPECT_FALSE(p.shared_side_stream);
  EXPECT_FALSE(p.combine_pdl);
  EXPECT_FALSE(p.token_path_pdl);
  EXPECT_EQ(p.gemm_pair, 0);
  EXPECT_FALSE(p.gemm1_routes);
  EXPECT_FALSE(p.route_pdl);
}

TEST(CudaTokenPathEnv, MalformedValuesAreClearErrors) {
  for (const char* bad : {"persist", "persist=", "persist=x", "persist=1x", "bogus=1",
                          "persist=1,,fused=2", "=3", "persist=99999999999999999999", "pair=3",
                          "pair=-1"}) {
    SCOPED_TRACE(bad);
    TokenPathEnv env(bad);
    try {
      cuda_token_path_from_env();
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("TETRA_MOE_TOKEN_PATH"), std::string::npos) << e.what();
    }
  }
}

// A layer the persistent launch takes: GLM-4.5-Air's shape, one token. The pointers are never
// dereferenced by the checks, only tested for null and alignment.
cuda::PersistentLayer air_layer() {
  alignas(16) static uint8_t arena[256];
  auto* p16 = reinterpret_cast<uint16_t*>(arena);
  auto* pf = reinterpret_cast<float*>(arena);
  auto* pi = reinterpret_cast<int32_t*>(arena);
  cuda::PersistentLayer a;
  a.x = p16;
  a.out = p16;
  a.T = 1;
  a.H = 4096;
  a.I = 1408;
  a.gate = p16;
  a.router.num_experts = 128;
  a.router.top_k = 8;
  a.E = 128;
  a.has_shared = true;
  a.w.w13 = arena;
  a.logits = pf;
  a.ids = pi;
  a.weights = pf;
  a.pair_slot = pi;
  a.slot_expert = pi;
  a.slot_pair = pi;
  a.num_routed = pi;
  a.dropped = pi;
  a.act = p16;
  a.part = pf;
  a.sync = reinterpret_cast<uint32_t*>(arena);
  return a;
}

TEST(PersistentLayerArgs, TakesAStandardLayerAndSaysWhyNotOtherwise) {
  EXPECT_EQ(cuda::persistent_layer_unsupported_reason(air_layer()), "");
  auto reason = [](auto change) {
    cuda::PersistentLayer a = air_layer();
    change(a);
    return cuda::persistent_layer_unsupported_reason(a);
  };
  EXPECT_NE(reason([](auto& a) { a.T = 0; }).find("1..8 tokens"), std::string::npos);
  EXPECT_NE(reason([](auto& a) { a.T = 9; }).find("1..8 tokens"), std::string::npos);
  EXPECT_NE(reason([](auto& a) { a.router.num_experts = 384; }).find("256 experts"),
            std::string::npos);
  EXPECT_NE(reason([](auto& a) { a.E = 129; }).find("256 experts"), std::string::npos);
  EXPECT_NE(reason([](auto& a) {
              a.T = 8;
              a.router.top_k = 17;
            }).find("pairs"),
            std::string::npos);
  EXPECT_NE(reason([](auto& a) { a.I = 1400; }).find("multiples of 64"), std::string::npos);
  EXPECT_NE(reason([](auto& a) { a.x = a.x + 1; }).find("16-byte aligned"), std::string::npos);
  EXPECT_NE(reason([](auto& a) { a.act = nullptr; }).find("missing"), std::string::npos);
  EXPECT_NE(reason([](auto& a) { a.slot_pair = nullptr; }).find("missing"), std::string::npos);
}

TEST(PersistentLayerArgs, CounterSpaceGrowsWithTheLayer) {
  const size_t one = cuda::persistent_sync_words(1, 8, 128, 4096);
  EXPECT_GT(cuda::persistent_sync_words(8, 8, 128, 4096), one);  // more routed slots
  EXPECT_GT(cuda::persistent_sync_words(1, 8, 128, 6144), one);  // more output tiles
  // Routed slots are capped by the local experts: 4 or 8 tokens of top-8 over 16 experts alike.
  EXPECT_EQ(cuda::persistent_sync_words(4, 8, 16, 4096), cuda::persistent_sync_words(8, 8, 16, 4096));
  EXPECT_EQ(one % 32, 0u);  // whole 128-byte lines
}

// GEMM1 routing one token (gemm1_routing.h): GLM-4.5-Air's shape with the shared expert as slot
// K is taken; each condition it does not meet is named.
struct RoutedCase {
  MoeGemmProblem p;
  Gemm1Routing r;
  float logits[1];
  int32_t ints[8];
  float weights[1];
};
RoutedCase air_one_token() {
  RoutedCase c;
  c.r.router.scoring = Scoring::Sigmoid;
  c.r.router.num_experts = 128;
  c.r.router.top_k = 8;
  c.r.shared_slot = true;
  c.p.num_experts = 129;  // the routed experts and the shared one
  c.p.hidden = 4096;
  c.p.inter = 1408;
  c.p.num_slots = 9;
  c.p.total_rows = 9;
  c.p.max_rows_hint = 1;
  // Host addresses stand in for the device buffers: only their presence is checked here.
  c.r.logits = c.logits;
  c.r.ids = c.r.slot_of = c.r.slots = c.r.offsets = c.r.row_count = c.r.row_token = c.ints;
  c.r.weights = c.weights;
  return c;
}

TEST(Gemm1Routing, TakesOneTokenOfGlm45AirWithTheSharedSlot) {
  RoutedCase c = air_one_token();
  EXPECT_STREQ(moe_gemm1_routed_unsupported(c.p, c.r), "");
  c.r.shared_slot = false;  // no shared expert: K slots over E experts
  c.p.num_experts = 128;
  c.p.num_slots = c.p.total_rows = 8;
  EXPECT_STREQ(moe_gemm1_routed_unsupported(c.p, c.r), "");
}

TEST(Gemm1Routing, NamesWhatItDoesNotTake) {
  const auto reason = [](const RoutedCase& c) {
    return std::string(moe_gemm1_routed_unsupported(c.p, c.r));
  };
  RoutedCase many = air_one_token();  // 300 experts: more than 8 routing scores per lane
  many.r.router.num_experts = 300;
  many.p.num_experts = 301;
  EXPECT_NE(reason(many).find("experts"), std::string::npos) << reason(many);
  RoutedCase ep = air_one_token();  // a block of the experts (expert parallelism)
  ep.p.num_experts = 65;
  EXPECT_NE(reason(ep).find("local"), std::string::npos) << reason(ep);
  RoutedCase wide = air_one_token();  // top-32: no lane left for the shared slot's row
  wide.r.router.top_k = 32;
  wide.p.num_slots = wide.p.total_rows = 33;
  EXPECT_NE(reason(wide).find("top_k"), std::string::npos) << reason(wide);
  RoutedCase two = air_one_token();  // two tokens' slots
  two.p.num_slots = 17;
  two.p.total_rows = 18;
  EXPECT_NE(reason(two).find("one token"), std::string::npos) << reason(two);
  RoutedCase rows = air_one_token();  // 16 rows per expert: not the late decode kernel's shape
  rows.p.total_rows = 9 * 16;
  rows.p.max_rows_hint = 16;
  EXPECT_NE(reason(rows).find("late decode"), std::string::npos) << reason(rows);
  RoutedCase bare = air_one_token();
  bare.r.slot_of = nullptr;
  EXPECT_NE(reason(bare).find("pointers"), std::string::npos) << reason(bare);
}

}  // namespace
}  // namespace tetra::moe
