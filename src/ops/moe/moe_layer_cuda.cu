// cuda-w4a16 MoE layer runner (see moe_layer_cuda.h).
#include "ops/moe/moe_layer_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "core/cuda_check.h"
#include "moe/expert_weights.h"
#include "moe/w4a4_scales.h"
#include "ops/moe/gemm1_routing.h"
#include "ops/moe/moe_ops_cuda.h"
#include "ops/moe/persistent_layer.h"
#include "ops/moe/router_logits_tiled.h"
#include "ops/moe/token_path.h"
#include "ops/moe/w4a16_moe.h"

namespace tetra::moe {
namespace {

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Expert e of a packed NVFP4 layer as a one-expert weight set.
MoeWeightsDevice expert_view(const MoeWeightsDevice& w, int e, int H, int I) {
  MoeWeightsDevice v;
  v.w13 = w.w13 + size_t(e) * packed_weight_bytes(2 * I, H);
  v.s13 = w.s13 + size_t(e) * packed_scale_bytes(2 * I, H);
  v.w2 = w.w2 + size_t(e) * packed_weight_bytes(H, I);
  v.s2 = w.s2 + size_t(e) * packed_scale_bytes(H, I);
  v.alpha_gate = w.alpha_gate + e;
  v.alpha_up = w.alpha_up + e;
  v.alpha_down = w.alpha_down + e;
  return v;
}
MoeBf16WeightsDevice expert_view(const MoeBf16WeightsDevice& w, int e, int H, int I) {
  MoeBf16WeightsDevice v;
  v.w13 = w.w13 + size_t(e) * 2 * I * H;
  v.w2 = w.w2 + size_t(e) * H * I;
  return v;
}

// Random bytes for the benchmark's weights: lo + hash % span (span 0 = any byte).
__global__ void fill_random_bytes(uint8_t* p, size_t n, uint32_t seed, uint8_t lo, uint8_t span) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ seed * 0x85EBCA77u ^ uint32_t(i >> 32) * 0xC2B2AE3Du;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    p[i] = span ? uint8_t(lo + h % span) : uint8_t(h);
  }
}

// Random bf16 in (-scale, scale): router weights of the benchmark.
__global__ void fill_random_bf16(uint16_t* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ seed * 0x85EBCA77u;
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    const float v = (float(h >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale;
    const uint32_t bits = __float_as_uint(v);
    p[i] = uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
}

__global__ void fill_f32(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = v;
}

// Carves 256-byte aligned regions out of one allocation (two passes: size, then place).
class Carver {
 public:
  explicit Carver(uint8_t* base) : base_(base) {}
  template <typename T>
  T* take(size_t count) {
    T* p = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += align256(std::max<size_t>(count, 1) * sizeof(T));
    return p;
  }
  size_t used() const { return used_; }

 private:
  uint8_t* base_;
  size_t used_ = 0;
};

void check_launch(cudaError_t e, const char* what, const std::string& layer) {
  if (e != cudaSuccess) TETRA_FAIL(layer, ": MoE ", what, " failed: ", cudaGetErrorString(e));
}

MoeGemmProblem gemm_problem(int E, int H, int I, int total_rows, int num_slots, int rows_hint) {
  MoeGemmProblem p;
  p.num_experts = E;
  p.hidden = H;
  p.inter = I;
  p.total_rows = total_rows;
  p.num_slots = num_slots;
  p.max_rows_hint = rows_hint;
  return p;
}

}  // namespace

void CudaMoeLayer::allocate(int E, int H, int I, int Is, bool has_bias) {
  E_ = E, H_ = H, I_ = I, Is_ = Is;
  backend_ = routed_bf16_ ? "cuda-bf16" : routed_w4a4_ ? "cuda-w4a4" : "cuda-w4a16";
  auto shape_reason = [&](int inter, bool bf16) {
    return bf16 ? moe_bf16_unsupported_reason(gemm_problem(1, H, inter, 1, 0, 1))
                : moe_shape_unsupported_reason(H, inter);
  };
  const std::string why = shape_reason(I, routed_bf16_);
  if (!why.empty()) TETRA_FAIL(name_, ": ", why);
  if (Is > 0) {
    const std::string why_sh = shape_reason(Is, shared_bf16_);
    if (!why_sh.empty()) TETRA_FAIL(name_, ".shared_experts: ", why_sh);
  }
  const int Eg = E_global_;
  if (Eg > cuda::kMaxExperts) TETRA_FAIL(name_, ": ", Eg, " experts; the CUDA router takes at most ", cuda::kMaxExperts);
  // The shared expert is stored as routed expert E when it has the routed experts' format and
  // width (GLM, DeepSeek: one shared expert of moe_intermediate_size).
  shared_in_slot_ = Is > 0 && Is == I && shared_bf16_ == routed_bf16_ &&
                    shared_w4a4_ == routed_w4a4_;
  const int slot = shared_in_slot_ ? 1 : 0;
  const int Ew = E + slot;  // experts in the weight tensors and row bookkeeping
  const int K = router_.top_k, T = max_tokens_;
  const size_t pairs = size_t(T) * K;
  const size_t rows_cap =
      layout_ == TokenLayout::Masked ? size_t(Ew) * T : pairs + size_t(slot) * T;
  if (rows_cap > size_t(INT32_MAX) / 2) TETRA_FAIL(name_, ": max_tokens ", T, " too large for the ", token_layout_name(layout_), " layout");
  workspace_bytes_ = cuda::layout_workspace_bytes(T, K, E);
  // The persistent layer: NVFP4 W4A16 experts, the shared expert absent or a slot.
  const bool persist = !routed_bf16_ && !routed_w4a4_ && (Is == 0 || shared_in_slot_);
  persist_T_ = persist ? std::min({T, path_.persistent_max_tokens, cuda::kPersistentMaxTokens}) : 0;
  const size_t persist_sync = persist_T_ > 0 ? cuda::persistent_sync_words(persist_T_, K, E, H) : 0;
  const size_t w13b = packed_weight_bytes(2 * I, H), s13b = packed_scale_bytes(2 * I, H);
  const size_t w2b = packed_weight_bytes(H, I), s2b = packed_scale_bytes(H, I);
  auto carve = [&](Carver& c) {
    if (routed_bf16_) {
      wb_.w13 = c.take<uint16_t>(size_t(Ew) * 2 * I * H);
      wb_.w2 = c.take<uint16_t>(size_t(Ew) * H * I);
    } else {
      MoeWeightsDevice w;
      w.w13 = c.take<uint8_t>(Ew * w13b);
      w.s13 = c.take<uint8_t>(Ew * s13b);
      w.w2 = c.take<uint8_t>(Ew * w2b);
      w.s2 = c.take<uint8_t>(Ew * s2b);
      w.alpha_gate = c.take<float>(Ew);
      w.alpha_up = c.take<float>(Ew);
      w.alpha_down = c.take<float>(Ew);
      w_ = w;
      if (routed_w4a4_) {
        in13_ = c.take<float>(Ew);
        in2_ = c.take<float>(Ew);
        xq_ = c.take<uint16_t>(rows_cap * H);
      }
    }
    if (shared_in_slot_) {
      if (routed_bf16_) {
        wsb_ = expert_view(wb_, E, H, I);
      } else {
        ws_ = expert_view(w_, E, H, I);
      }
    } else if (Is > 0 && shared_bf16_) {
      wsb_.w13 = c.take<uint16_t>(size_t(2) * Is * H);
      wsb_.w2 = c.take<uint16_t>(size_t(H) * Is);
    } else if (Is > 0) {
      MoeWeightsDevice s;
      s.w13 = c.take<uint8_t>(packed_weight_bytes(2 * Is, H));
      s.s13 = c.take<uint8_t>(packed_scale_bytes(2 * Is, H));
      s.w2 = c.take<uint8_t>(packed_weight_bytes(H, Is));
      s.s2 = c.take<uint8_t>(packed_scale_bytes(H, Is));
      s.alpha_gate = c.take<float>(1);
      s.alpha_up = c.take<float>(1);
      s.alpha_down = c.take<float>(1);
      ws_ = s;
    }
    if (Is > 0 && shared_w4a4_) {
      // In the slot the scales are routed entry E; own launches read them from in_sh_ then.
      in_sh_ = shared_in_slot_ ? nullptr : c.take<float>(2);
      xq_sh_ = c.take<uint16_t>(size_t(T) * H);
    }
    if (Is > 0) {
      act_sh_ = c.take<uint16_t>(size_t(T) * Is);
      y_sh_ = c.take<uint16_t>(size_t(T) * H);
      sh_rows_ = c.take<int32_t>(2);
    }
    gate_ = c.take<uint16_t>(size_t(Eg) * H);
    bias_ = has_bias ? c.take<float>(Eg) : nullptr;
    logits_ = c.take<float>(size_t(T) * Eg);
    ids_ = c.take<int32_t>(pairs);
    weights_ = c.take<float>(pairs);
    offsets_ = c.take<int32_t>(size_t(E) + 1);
    row_token_ = c.take<int32_t>(rows_cap);
    slot_of_ = c.take<int32_t>(pairs);
    masked_m_ = c.take<int32_t>(Ew);
    row_start_ = c.take<int32_t>(Ew);
    row_count_ = c.take<int32_t>(Ew);
    slots_ = c.take<int32_t>(Ew);
    dropped_ = c.take<int32_t>(1);
    counter_ = c.take<uint32_t>(1);
    pair_done_ = c.take<uint32_t>(2 * size_t(Ew));
    if (persist_T_ > 0) {
      slot_pair_ = c.take<int32_t>(size_t(std::min(E, persist_T_ * K)) * persist_T_);
      num_routed_ = c.take<int32_t>(1);
      persist_sync_ = c.take<uint32_t>(persist_sync);
    }
    act_ = c.take<uint16_t>(rows_cap * I);
    if (!routed_bf16_ && !routed_w4a4_) xw_ = c.take<uint16_t>(size_t(T) * H);
    y_ = c.take<float>(rows_cap * H);
    workspace_ = c.take<uint8_t>(workspace_bytes_);
  };
  Carver sizing(nullptr);
  carve(sizing);
  bytes_ = sizing.used();
  TETRA_CUDA_MALLOC(&mem_, bytes_);
  Carver placing(static_cast<uint8_t*>(mem_));
  carve(placing);
  if (workspace_bytes_ == 0) workspace_ = nullptr;
  TETRA_CUDA_CHECK(cudaMemset(dropped_, 0, sizeof(int32_t)));
  TETRA_CUDA_CHECK(cudaMemset(counter_, 0, sizeof(uint32_t)));
  TETRA_CUDA_CHECK(cudaMemset(pair_done_, 0, 2 * size_t(Ew) * sizeof(uint32_t)));
  if (persist_sync_) TETRA_CUDA_CHECK(cudaMemset(persist_sync_, 0, persist_sync * sizeof(uint32_t)));
  TETRA_CUDA_CHECK(cudaMemset(row_token_, 0, rows_cap * sizeof(int32_t)));  // any valid token
  if (layout_ == TokenLayout::Masked) {
    std::vector<int32_t> start(static_cast<size_t>(Ew));  // [Ew] expert e owns rows e*max_T ..
    for (int e = 0; e < Ew; ++e) start[size_t(e)] = e * T;
    TETRA_CUDA_CHECK(cudaMemcpy(row_start_, start.data(), start.size() * 4, cudaMemcpyHostToDevice));
  }
  cuda::small_token_path_setup(E_global_, E);
  create_streams();
}

CudaMoeLayer::CudaMoeLayer(const MoeLayerWeights& w, int max_tokens, TokenLayout layout,
                           const CudaTokenPath& path, bool w4a4)
    : name_(w.name), max_tokens_(max_tokens), layout_(layout), path_(path), router_(w.router) {
  const int E = int(w.experts.size()), H = w.hidden, I = w.inter;  // E local experts
  E_global_ = w.router.num_experts;
  begin_ = w.expert_begin;
  routed_bf16_ = w.experts[0].format == ExpertFormat::BF16;
  shared_bf16_ = w.shared && w.shared->format == ExpertFormat::BF16;
  if (w4a4 && (routed_bf16_ || !layer_has_input_scales(w)))
    TETRA_FAIL(name_, ": cuda-w4a4 needs NVFP4 experts with input_scale on every linear");
  routed_w4a4_ = w4a4;
  shared_w4a4_ = w4a4 && w.shared && mlp_has_input_scales(*w.shared);
  const int Is = !w.shared ? 0 : shared_bf16_ ? w.shared->gate_bf16.n : w.shared->gate.n;
  allocate(E, H, I, Is, w.bias != nullptr);
  try {
    // Pack one expert at a time: host memory stays at one expert, not the whole layer.
    // W4A4: its input scales are folded into the alphas (w4a4_scales.h) and uploaded to
    // scales[0][e] / scales[1][e] for the activation quantizer.
    auto upload = [&](const MoeWeightsDevice& dst, int e, int inter, const ExpertMlpView& v,
                      bool quantize_act, float* scale13, float* scale2, const std::string& mlp) {
      PackedMoeLayer one = make_packed_moe_layer(1, H, inter);
      pack_moe_expert(one, 0, v.gate, v.up, v.down);
      if (quantize_act) {
        const W4a4MlpScales sc = w4a4_mlp_scales(v, mlp);
        fold_w4a4_input_scales(one, {sc.gate_up}, {sc.down});
        TETRA_CUDA_CHECK(cudaMemcpy(scale13 + e, &sc.gate_up, 4, cudaMemcpyHostToDevice));
        TETRA_CUDA_CHECK(cudaMemcpy(scale2 + e, &sc.down, 4, cudaMemcpyHostToDevice));
      }
      auto put = [](const void* d, size_t stride, int i, const std::vector<uint8_t>& src) {
        TETRA_CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(const_cast<void*>(d)) + stride * i,
                                    src.data(), src.size(), cudaMemcpyHostToDevice));
      };
      put(dst.w13, one.w13.size(), e, one.w13);
      put(dst.s13, one.s13.size(), e, one.s13);
      put(dst.w2, one.w2.size(), e, one.w2);
      put(dst.s2, one.s2.size(), e, one.s2);
      const float* alphas[3] = {dst.alpha_gate, dst.alpha_up, dst.alpha_down};
      const float vals[3] = {one.alpha_gate[0], one.alpha_up[0], one.alpha_down[0]};
      for (int i = 0; i < 3; ++i)
        TETRA_CUDA_CHECK(cudaMemcpy(const_cast<float*>(alphas[i]) + e, &vals[i], 4,
                                    cudaMemcpyHostToDevice));
    };
    for (int e = 0; e < E; ++e) {
      if (routed_bf16_)
        upload_bf16(w.experts[size_t(e)], e, I, wb_);
      else
        upload(w_, e, I, w.experts[size_t(e)], routed_w4a4_, in13_, in2_,
               str(name_, ".experts.", begin_ + e));
    }
    if (w.shared && shared_bf16_) upload_bf16(*w.shared, 0, Is, wsb_);
    if (w.shared && !shared_bf16_) {
      // In the slot (expert E) its scales are routed entry E; else in_sh_ {GEMM1, GEMM2}.
      float* s13 = !shared_w4a4_ ? nullptr : shared_in_slot_ ? in13_ + E : in_sh_;
      float* s2 = !shared_w4a4_ ? nullptr : shared_in_slot_ ? in2_ + E : in_sh_ + 1;
      upload(ws_, 0, Is, *w.shared, shared_w4a4_, s13, s2, name_ + ".shared_experts");
    }
    const std::vector<uint16_t> gate = router_weight_bf16(w);
    TETRA_CUDA_CHECK(cudaMemcpy(gate_, gate.data(), gate.size() * 2, cudaMemcpyHostToDevice));
    if (w.bias)
      TETRA_CUDA_CHECK(cudaMemcpy(bias_, w.bias, size_t(E_global_) * 4, cudaMemcpyHostToDevice));
  } catch (...) {
    cudaFree(mem_);
    throw;
  }
}

CudaMoeLayer::CudaMoeLayer(const RandomMoeLayer& s, int max_tokens, TokenLayout layout,
                           const CudaTokenPath& path)
    : name_("random layer"), max_tokens_(max_tokens), layout_(layout), path_(path),
      router_(s.router) {
  validate_router_params(s.router);
  E_global_ = s.global_experts == 0 ? s.experts : s.global_experts;
  begin_ = s.expert_begin;
  if (s.experts < 1 || begin_ < 0 || int64_t(begin_) + s.experts > E_global_)
    TETRA_FAIL("random layer: experts ", begin_, "..", int64_t(begin_) + s.experts - 1,
               " outside the ", E_global_, " of the layer");
  if (s.router.num_experts != E_global_) TETRA_FAIL("random layer: router has ", s.router.num_experts, " experts, layer ", E_global_);
  if (!s.bias.empty() && int(s.bias.size()) != E_global_) TETRA_FAIL("random layer: bias has ", s.bias.size(), " entries for ", E_global_, " experts");
  if (s.w4a4 && s.bf16) TETRA_FAIL("random layer: W4A4 activations need NVFP4 experts, not BF16");
  routed_w4a4_ = s.w4a4;
  shared_w4a4_ = s.w4a4 && s.shared_inter > 0;
  routed_bf16_ = shared_bf16_ = s.bf16;
  allocate(s.experts, s.hidden, s.inter, s.shared_inter, !s.bias.empty());
  // W4A4 input scales as calibration would set them for unit-variance x (amax ~ 4.5) and an
  // intermediate of amax ~ 3: amax / (6 * 448); the alphas below carry them too.
  const float in13 = s.w4a4 ? 4.5f / (6.0f * 448.0f) : 1.0f;
  const float in2 = s.w4a4 ? 3.0f / (6.0f * 448.0f) : 1.0f;
  auto fill = [&](const MoeWeightsDevice& d, int E, int inter, uint32_t seed) {
    const size_t w13b = packed_weight_bytes(2 * inter, H_) * E, s13b = packed_scale_bytes(2 * inter, H_) * E;
    const size_t w2b = packed_weight_bytes(H_, inter) * E, s2b = packed_scale_bytes(H_, inter) * E;
    // Scale codes 72..87: block scales 0.5 .. ~1.9 (ue5m3, expert_weights.h). alpha keeps the
    // outputs O(1): |w| ~ 2 per element, so alpha ~ 1 / (2 sqrt(k)) (times 2^10 for ue5m3).
    fill_random_bytes<<<1024, 256>>>(const_cast<uint8_t*>(d.w13), w13b, seed, 0, 0);
    fill_random_bytes<<<1024, 256>>>(const_cast<uint8_t*>(d.s13), s13b, seed + 1, 72, 16);
    fill_random_bytes<<<1024, 256>>>(const_cast<uint8_t*>(d.w2), w2b, seed + 2, 0, 0);
    fill_random_bytes<<<1024, 256>>>(const_cast<uint8_t*>(d.s2), s2b, seed + 3, 72, 16);
    fill_f32<<<8, 256>>>(const_cast<float*>(d.alpha_gate), E, in13 * packed_alpha(0.5f / std::sqrt(float(H_))));
    fill_f32<<<8, 256>>>(const_cast<float*>(d.alpha_up), E, in13 * packed_alpha(0.5f / std::sqrt(float(H_))));
    fill_f32<<<8, 256>>>(const_cast<float*>(d.alpha_down), E, in2 * packed_alpha(0.5f / std::sqrt(float(inter))));
  };
  // BF16 weights ~ U(-a, a), a = sqrt(3 / k): unit-variance rows give unit-variance sums.
  auto fill_bf16 = [&](const MoeBf16WeightsDevice& d, int E, int inter, uint32_t seed) {
    fill_random_bf16<<<1024, 256>>>(const_cast<uint16_t*>(d.w13), size_t(E) * 2 * inter * H_, seed,
                                    std::sqrt(3.0f / float(H_)));
    fill_random_bf16<<<1024, 256>>>(const_cast<uint16_t*>(d.w2), size_t(E) * H_ * inter, seed + 1,
                                    std::sqrt(3.0f / float(inter)));
  };
  // In the slot, ws_ / wsb_ view routed expert E.
  if (s.bf16) {
    fill_bf16(wb_, E_, I_, s.seed * 16);
    if (Is_ > 0) fill_bf16(wsb_, 1, Is_, s.seed * 16 + 8);
  } else {
    fill(w_, E_, I_, s.seed * 16);
    if (Is_ > 0) fill(ws_, 1, Is_, s.seed * 16 + 8);
  }
  if (s.w4a4) {
    const int Ew = E_ + (shared_in_slot_ ? 1 : 0);
    fill_f32<<<8, 256>>>(in13_, size_t(Ew), in13);
    fill_f32<<<8, 256>>>(in2_, size_t(Ew), in2);
    if (in_sh_) {
      fill_f32<<<1, 1>>>(in_sh_, 1, in13);
      fill_f32<<<1, 1>>>(in_sh_ + 1, 1, in2);
    }
  }
  // Router weights ~ U(-a, a) with a = sqrt(3/H): logits of unit-variance x are O(1).
  fill_random_bf16<<<1024, 256>>>(gate_, size_t(E_global_) * H_, s.seed * 16 + 12, std::sqrt(3.0f / H_));
  TETRA_CUDA_CHECK(cudaGetLastError());
  if (!s.bias.empty())
    TETRA_CUDA_CHECK(cudaMemcpy(bias_, s.bias.data(), s.bias.size() * 4, cudaMemcpyHostToDevice));
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
}

CudaMoeLayer::~CudaMoeLayer() {
  if (fork_) cudaEventDestroy(fork_);
  if (join_) cudaEventDestroy(join_);
  if (side_) cudaStreamDestroy(side_);
  if (mem_) cudaFree(mem_);
  if (fold_mem_) cudaFree(fold_mem_);
}

void CudaMoeLayer::create_streams() {
  if (Is_ == 0) return;
  TETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  TETRA_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  TETRA_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
}

void CudaMoeLayer::upload_bf16(const ExpertMlpView& v, int e, int inter,
                               const MoeBf16WeightsDevice& dst) {
  const size_t mat = size_t(inter) * H_;  // elements of one [I, H] or [H, I] matrix
  uint16_t* w13 = const_cast<uint16_t*>(dst.w13) + size_t(e) * 2 * mat;
  uint16_t* w2 = const_cast<uint16_t*>(dst.w2) + size_t(e) * mat;
  TETRA_CUDA_CHECK(cudaMemcpy(w13, v.gate_bf16.weight, mat * 2, cudaMemcpyHostToDevice));
  TETRA_CUDA_CHECK(cudaMemcpy(w13 + mat, v.up_bf16.weight, mat * 2, cudaMemcpyHostToDevice));
  TETRA_CUDA_CHECK(cudaMemcpy(w2, v.down_bf16.weight, mat * 2, cudaMemcpyHostToDevice));
}

size_t CudaMoeLayer::expert_bytes() const { return expert_mlp_bytes(routed_bf16_, H_, I_); }

size_t CudaMoeLayer::shared_bytes() const {
  return Is_ == 0 ? 0 : expert_mlp_bytes(shared_bf16_, H_, Is_);
}

int CudaMoeLayer::shared_weight_ranges(const void* ptrs[4], size_t bytes[4]) const {
  if (Is_ == 0) return 0;
  if (shared_bf16_) {
    ptrs[0] = wsb_.w13, bytes[0] = size_t(2) * Is_ * H_ * 2;
    ptrs[1] = wsb_.w2, bytes[1] = size_t(Is_) * H_ * 2;
    return 2;
  }
  // Expert E_ of the routed set (same format and width) or expert 0 of its own set.
  const tetra::MoeWeightsDevice& w = shared_in_slot_ ? w_ : ws_;
  const size_t e = shared_in_slot_ ? size_t(E_) : 0;
  bytes[0] = packed_weight_bytes(2 * Is_, H_), bytes[1] = packed_scale_bytes(2 * Is_, H_);
  bytes[2] = packed_weight_bytes(H_, Is_), bytes[3] = packed_scale_bytes(H_, Is_);
  ptrs[0] = w.w13 + e * bytes[0], ptrs[1] = w.s13 + e * bytes[1];
  ptrs[2] = w.w2 + e * bytes[2], ptrs[3] = w.s2 + e * bytes[3];
  return 4;
}

int CudaMoeLayer::dropped_pairs() const {
  int32_t d = 0;
  TETRA_CUDA_CHECK(cudaMemcpy(&d, dropped_, 4, cudaMemcpyDeviceToHost));
  return d;
}

std::vector<int32_t> CudaMoeLayer::last_ids(int T) const {
  TETRA_CHECK(T >= 0 && T <= max_tokens_, "T=", T);
  std::vector<int32_t> ids(size_t(T) * router_.top_k);
  if (!ids.empty())
    TETRA_CUDA_CHECK(cudaMemcpy(ids.data(), ids_, ids.size() * 4, cudaMemcpyDeviceToHost));
  return ids;
}

void CudaMoeLayer::forward(const uint16_t* x, int T, uint16_t* out, const uint16_t* residual,
                                cudaStream_t stream) {
  run(x, T, out, residual, stream, nullptr);
}

bool CudaMoeLayer::forward_add_rms_norm(const uint16_t* x, int T, uint16_t* out,
                                        const AddRmsNormStep& norm, cudaStream_t stream,
                                        const PreRmsNormStep* pre) {
  if (T < 1 || T > max_tokens_ || T <= persist_T_ ||
      !cuda::combine_add_rms_norm_fits(H_, DType::F32))
    return false;
  if (pre != nullptr && !takes_pre_norm(T)) return false;
  if (norm.fold != nullptr && norm.fold->parts != norm_fold_parts()) return false;
  run(x, T, out, nullptr, stream, nullptr, &norm, pre);
  return true;
}

bool CudaMoeLayer::takes_pre_norm(int T) const {
  if (T > max_tokens_ || T <= persist_T_ || !cuda::combine_add_rms_norm_fits(H_, DType::F32) ||
      path_.fused_route_max_tokens < T || !cuda::small_token_path_fits(T, router_.top_k))
    return false;
  // The tiny kernel's limits read shapes and the layout pointers; run() checks the real arguments
  // again at the launch (x's alignment among them).
  cuda::RowsPrep prep;
  prep.E = E_;
  prep.offsets = offsets_;
  prep.masked_m = masked_m_;
  prep.row_token = row_token_;
  return cuda::small_token_path_takes_pre_norm(token_path_args(gate_, prep), T);
}

MoeGemmProblem CudaMoeLayer::routed_problem(int T) const {
  const int K = router_.top_k, pairs = T * K, num_slots = std::min(E_, pairs);
  const bool slot = shared_slot_at(T);
  const int experts = E_ + (shared_in_slot_ ? 1 : 0);
  const int total_rows =
      layout_ == TokenLayout::Masked ? experts * max_tokens_ : pairs + (slot ? T : 0);
  const int hint = (pairs + num_slots - 1) / num_slots;
  return gemm_problem(experts, H_, I_, total_rows, num_slots + (slot ? 1 : 0), hint);
}

Gemm1Routing CudaMoeLayer::gemm1_routing(bool shared_slot) const {
  return Gemm1Routing{.logits = logits_, .bias = bias_, .router = router_,
                      .shared_slot = shared_slot, .ids = ids_, .weights = weights_,
                      .slot_of = slot_of_, .slots = slots_, .offsets = offsets_,
                      .row_count = row_count_, .row_token = row_token_, .dropped = dropped_};
}

bool CudaMoeLayer::routes_in_gemm1(int T, bool marks) const {
  if (T != 1 || marks || T > max_tokens_ || T <= persist_T_ || !path_.gemm1_routes ||
      path_.fused_route_max_tokens < T || !cuda::small_token_path_fits(T, router_.top_k) ||
      layout_ == TokenLayout::Masked || begin_ != 0 || E_ != E_global_ || routed_bf16_ ||
      routed_w4a4_)
    return false;
  const bool slot = shared_slot_at(T);
  if (Is_ > 0 && !slot) return false;  // the shared expert in its own launches
  if (pair_wanted(T)) return false;
  return *moe_gemm1_routed_unsupported(routed_problem(T), gemm1_routing(slot)) == '\0';
}

bool CudaMoeLayer::shared_slot_at(int T) const {
  return shared_in_slot_ && T <= path_.shared_slot_max_tokens;
}

bool CudaMoeLayer::pair_wanted(int T) const {
  const int active_slots = std::min(E_, T * router_.top_k) + (shared_slot_at(T) ? 1 : 0);
  return path_.gemm_pair == 2 ||
         (path_.gemm_pair == 1 && moe_gemm_pair_preferred(routed_problem(T), active_slots));
}


int CudaMoeLayer::norm_fold_parts() const {
  return cuda::combine_norm_fold_parts(H_);
}

const RouterFold* CudaMoeLayer::router_fold(int T) const {
  static const bool off = [] {
    const char* e = std::getenv("TETRA_ROUTER_FOLD");
    return e != nullptr && e[0] == '0';
  }();
  if (off || fold_mem_ == nullptr || !takes_pre_norm(T) || !routes_in_gemm1(T, false))
    return nullptr;
  const Gemm1Routing r = gemm1_routing(shared_slot_at(T));
  const Gemm1Fold fold{fold_.sums, fold_.copies};
  return *moe_gemm1_routed_unsupported(routed_problem(T), r, &fold) == '\0' ? &fold_ : nullptr;
}

void CudaMoeLayer::prepare_router_fold(const uint16_t* norm_weight) {
  const int E = E_global_, H = H_;
  if (fold_mem_ != nullptr || norm_weight == nullptr || router_.scoring == Scoring::Softmax ||
      E > kRouterFoldMaxExperts || H % kRouterFoldTile != 0 || begin_ != 0 || E_ != E_global_)
    return;
  // tiles [H/16][g (32 B), then W[e][16t .. 16t + 15] for each e (32 B)], sums [copies, E + 1]
  // after. Copies: o_proj's 256 blocks (GLM-4.5-Air) adding into one vector put 256 atomics on
  // each address at the end of the kernel. H200, GLM-4.5-Air batch 1 against no fold: 1 copy
  // +0.2%, 4 copies -1.2..-1.9% (three calls), 8 -0.5..-1.3%, 16 -0.4%
  // (bench/results/2026-12-04-session50-h200.md); 2 or 8 with the sums read through the L1 no
  // better than 4 (session 51).
  constexpr int copies = 4;
  static_assert(copies <= kRouterFoldMaxCopies);
  const size_t tb = router_fold_tile_bytes(E);
  const size_t tiles_bytes = (tb * size_t(H / kRouterFoldTile) + 255) / 256 * 256;
  const size_t sums = size_t(copies) * (E + 1);
  TETRA_CUDA_MALLOC(&fold_mem_, tiles_bytes + sums * sizeof(double));
  uint8_t* tiles = static_cast<uint8_t*>(fold_mem_);
  const int rows = H / kRouterFoldTile;
  constexpr size_t kPiece = kRouterFoldTile * 2;  // 16 bf16 of one row
  TETRA_CUDA_CHECK(cudaMemcpy2D(tiles, tb, norm_weight, kPiece, kPiece, rows,
                                cudaMemcpyDeviceToDevice));
  for (int e = 0; e < E; ++e)
    TETRA_CUDA_CHECK(cudaMemcpy2D(tiles + kPiece + size_t(e) * kPiece, tb, gate_ + size_t(e) * H,
                                  kPiece, kPiece, rows, cudaMemcpyDeviceToDevice));
  fold_.tiles = tiles;
  fold_.sums = reinterpret_cast<double*>(tiles + tiles_bytes);
  fold_.E = E;
  fold_.copies = copies;
  TETRA_CUDA_CHECK(cudaMemset(fold_.sums, 0, sums * sizeof(double)));
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
}

cuda::SmallTokenPath CudaMoeLayer::token_path_args(const uint16_t* x,
                                                   const cuda::RowsPrep& prep) const {
  cuda::SmallTokenPath a;
  a.x = x;
  a.gate = gate_;
  a.bias = bias_;
  a.H = H_;
  a.router = router_;
  a.logits = logits_;
  a.ids = ids_;
  a.weights = weights_;
  a.expert_begin = begin_;
  a.offsets = offsets_;
  a.masked_m = masked_m_;
  a.row_token = row_token_;
  a.slot_of = slot_of_;
  a.dropped = dropped_;
  a.rows = prep;
  a.counter = counter_;
  return a;
}

void CudaMoeLayer::forward_marked(const uint16_t* x, int T, uint16_t* out,
                                       const uint16_t* residual, cudaStream_t stream,
                                       cudaEvent_t const* marks) {
  run(x, T, out, residual, stream, marks);
}

void CudaMoeLayer::run(const uint16_t* x, int T, uint16_t* out, const uint16_t* residual,
                       cudaStream_t stream, cudaEvent_t const* marks,
                       const AddRmsNormStep* add_norm, const PreRmsNormStep* pre) {
  if (T < 0 || T > max_tokens_)
    TETRA_FAIL(name_, ": forward with ", T, " tokens; the layer was built for 0..", max_tokens_);
  if (T == 0) return;
  auto mark = [&](int i) {
    if (marks) TETRA_CUDA_CHECK(cudaEventRecord(marks[i], stream));
  };
  mark(0);
  last_persistent_ = T <= persist_T_ && run_persistent(x, T, out, residual, stream);
  if (last_persistent_) {
    for (int i = 1; i < 5; ++i) mark(i);  // one launch: its time is the first part's
    return;
  }
  const int E = E_, H = H_, K = router_.top_k;  // E local experts
  const int pairs = T * K;
  const bool masked = layout_ == TokenLayout::Masked;
  // The shared expert: absent, a slot of the routed launches, or its own launches (on the side
  // stream or after the routed ones).
  const bool slot = shared_slot_at(T);
  const bool own = Is_ > 0 && !slot;
  const bool side = own && path_.shared_side_stream;
  const int num_slots = std::min(E, pairs);  // routed slots; the shared slot comes after them

  cuda::RowsPrep prep;
  prep.E = E;
  prep.num_slots = num_slots;
  prep.max_m = masked ? max_tokens_ : 0;
  prep.offsets = offsets_;
  prep.masked_m = masked_m_;
  prep.row_count = row_count_;
  prep.slots = slots_;
  prep.row_token = row_token_;
  prep.sh_rows = own ? sh_rows_ : nullptr;
  prep.shared_slot = slot;
  const bool fused_route = path_.fused_route_max_tokens >= T && cuda::small_token_path_fits(T, K);
  MoeGemmProblem p = routed_problem(T);
  // One token: the token path computes the logits only and GEMM1 routes (gemm1_routing.h); with
  // the router folded into o_proj (moe/router_fold.h) no token path runs.
  const bool route_in_gemm1 = routes_in_gemm1(T, marks != nullptr);
  const bool folded = pre != nullptr && pre->router_folded;
  if (folded)
    TETRA_CHECK(route_in_gemm1 && router_fold(T) != nullptr, name_,
                ": the router fold at ", T, " tokens, which this layer does not take");
  const Gemm1Routing g1r = gemm1_routing(slot);
  const Gemm1Fold g1f{fold_.sums, fold_.copies, folded ? pre->eps : 0.0f, logits_};
  if (folded) {
    x = pre->normed;  // gx = bf16(g * h), from o_proj's epilogue
  } else if (fused_route) {
    cuda::SmallTokenPath a = token_path_args(x, prep);
    a.pdl = path_.token_path_pdl;
    a.logits_only = route_in_gemm1;
    static_assert(cuda::SmallTokenPath::kMaxWarm >= 4);
    // Where GEMM1 routes and starts the shared expert's blocks before routing, those blocks
    // request its weights while the routed ones route: a warm-up would only lengthen the token
    // path (GLM-4.5-Air batch 1 -0.3% without it, bench/results/2026-12-04-session46-h200.md).
    const bool shared_starts_in_gemm1 = route_in_gemm1 && gemm1_routed_starts_shared(g1r);
    if (path_.warm_shared && !shared_starts_in_gemm1) shared_weight_ranges(a.warm, a.warm_bytes);
    if (pre != nullptr) {  // x is h: the token path normalises it into pre->normed
      a.pre_norm_weight = pre->weight;
      a.pre_norm_eps = pre->eps;
      a.pre_norm_out = pre->normed;
    }
    check_launch(cuda::small_token_path(a, T, stream), "small token path", name_);
    if (pre != nullptr) x = pre->normed;  // every later launch reads the normalised row
  } else {
    TETRA_CHECK(pre == nullptr, name_, ": the norm before the layer folds into the one-launch ",
                "token path only (takes_pre_norm)");
    const bool tiled = long(T) * E_global_ >= cuda::kRouterTiledMinLogits &&
                       cuda::router_logits_tiled_unsupported_reason(x, gate_, H).empty();
    // The chain of programmatic dependents only behind the one-warp router: measured on the H200
    // (GLM-4.5-Air, session 26, five rounds) it took batch 32 -1.0%, but behind the tiled router
    // batch 64 +0.1% and batch 128 +1.0% (why is not established).
    const bool pdl = path_.route_pdl && !tiled;
    check_launch(tiled ? cuda::router_logits_tiled(x, DType::BF16, gate_, T, H, E_global_,
                                                   logits_, stream)
                       : cuda::router_logits(x, DType::BF16, gate_, T, H, E_global_, logits_,
                                             stream, pdl),
                 "router_logits", name_);
    check_launch(cuda::route(logits_, bias_, T, router_, ids_, weights_, stream, pdl), "route",
                 name_);
    if (masked) {
      cuda::MaskedLayoutView v;
      v.block = {begin_, E_global_};
      v.max_m = max_tokens_;
      v.masked_m = masked_m_;
      v.row_token = row_token_;
      v.slot_of = slot_of_;
      v.dropped = dropped_;
      check_launch(
          cuda::build_masked(ids_, T, K, E, workspace_, workspace_bytes_, v, stream, pdl),
          "build_masked", name_);
    } else {
      cuda::ContiguousLayoutView v;
      v.block = {begin_, E_global_};
      v.expert_offsets = offsets_;
      v.slot_token = row_token_;
      v.slot_of = slot_of_;
      v.dropped = dropped_;
      check_launch(
          cuda::build_contiguous(ids_, T, K, E, workspace_, workspace_bytes_, v, stream, pdl),
          "build_contiguous", name_);
    }
    check_launch(cuda::prepare_rows(prep, T, stream, pdl), "prepare_rows", name_);
  }
  mark(1);

  MoeRows rows;
  rows.row_start = masked ? row_start_ : offsets_;  // offsets_[E]: the shared slot's first row
  rows.row_count = masked ? masked_m_ : row_count_;
  rows.expert_ids = slots_;
  rows.gather = row_token_;  // GEMM1 reads x[token of row]: no permute pass
  // Large batches run the wgmma kernel, which reads x in its order: reorder x once, and hand both
  // routed GEMMs that kernel (its GEMM1 writes act in the order its GEMM2 reads).
  const uint16_t* x1 = x;
  MoeKernel routed_kernel = MoeKernel::kAuto;
  if (xw_ != nullptr) {
    MoeGemmProblem pw = p;
    pw.x_wgmma_order = true;
    if (moe_pick_kernel(pw) == MoeKernel::kWgmma) {
      check_launch(moe_w4a16_to_wgmma_order(x, T, H, xw_, stream), "wgmma order", name_);
      p = pw;
      x1 = xw_;
      routed_kernel = MoeKernel::kWgmma;
    }
  } else if (routed_w4a4_) {  // W4A4 quantizes x into its xq in wgmma order itself
    MoeGemmProblem pw = p;
    pw.x_wgmma_order = true;
    if (moe_pick_kernel(pw) == MoeKernel::kWgmma) routed_kernel = MoeKernel::kWgmma;
  }
  // The routed GEMM2 prefetches its weights while the kernel before it (GEMM1, routed or shared)
  // finishes: it reads act_ only after griddepcontrol.wait, and nothing else it reads changes.
  MoeGemmProblem p2 = p;
  p2.gemm2_pdl = true;
  p2.gemm2_one_wave = path_.gemm2_one_wave;
  p2.gemm2_wide = path_.gemm2_wide;
  MoeRows sh;
  MoeGemmProblem ps;
  if (own) {
    sh.row_start = sh_rows_;
    sh.row_count = sh_rows_ + 1;
    ps = gemm_problem(1, H, Is_, T, 0, T);
  }
  // The shared expert (T rows) takes the wgmma kernel too when the routed GEMMs do: W4A4 reorders
  // while quantizing, W4A16 reads the reordered x (which exists when the routed experts are
  // W4A16 too: not under W4A4 routed experts with a shared expert without input scales).
  MoeKernel shared_kernel = MoeKernel::kAuto;
  if (own && routed_kernel == MoeKernel::kWgmma && !shared_bf16_ && (shared_w4a4_ || x1 != x)) {
    shared_kernel = MoeKernel::kWgmma;
    ps.x_wgmma_order = !shared_w4a4_;
  }
  // W4A4 weight sets: the packed weights plus the per-expert activation scales.
  MoeW4a4WeightsDevice w4{w_, in13_, in2_};
  MoeW4a4WeightsDevice ws4{ws_, nullptr, nullptr};
  if (shared_w4a4_) {
    ws4.input_scale13 = shared_in_slot_ ? in13_ + E : in_sh_;
    ws4.input_scale2 = shared_in_slot_ ? in2_ + E : in_sh_ + 1;
  }
  auto shared_gemm1 = [&](cudaStream_t s) {
    check_launch(shared_bf16_   ? moe_bf16_gemm1(ps, wsb_, sh, x, act_sh_, s)
                 : shared_w4a4_ ? moe_w4a4_gemm1(ps, ws4, sh, x, xq_sh_, act_sh_, s, shared_kernel)
                                : moe_w4a16_gemm1(ps, ws_, sh, x1, act_sh_, s, shared_kernel),
                 "shared GEMM1", name_);
  };
  auto shared_gemm2 = [&](cudaStream_t s) {
    check_launch(shared_bf16_   ? moe_bf16_gemm2(ps, wsb_, sh, act_sh_, y_sh_, false, s)
                 : shared_w4a4_ ? moe_w4a4_gemm2(ps, ws4, sh, act_sh_, y_sh_, false, s, shared_kernel)
                                : moe_w4a16_gemm2(ps, ws_, sh, act_sh_, y_sh_, false, s, shared_kernel),
                 "shared GEMM2", name_);
  };
  if (side) {  // fork after the row bookkeeping (sh_rows_) is written
    TETRA_CUDA_CHECK(cudaEventRecord(fork_, stream));
    TETRA_CUDA_CHECK(cudaStreamWaitEvent(side_, fork_, 0));
    shared_gemm1(side_);
    shared_gemm2(side_);
    TETRA_CUDA_CHECK(cudaEventRecord(join_, side_));
  }
  // Routed GEMMs as one launch where GEMM1 spills into a second wave (moe_gemm_pair_preferred);
  // not with marks (the benchmark times the GEMMs apart).
  // The W4A16 GEMM1 straight after the one-launch token path: a programmatic dependent of it.
  // Taken from p here, after the wgmma choice above may have changed p.
  MoeGemmProblem p1 = p;
  p1.gemm1_pdl = fused_route && path_.gemm1_pdl;
  const bool pair = !routed_bf16_ && !routed_w4a4_ && !own && !marks &&
                    routed_kernel == MoeKernel::kAuto && moe_gemm_pair_fits(p, p2) && pair_wanted(T);
  if (pair) {
    check_launch(moe_w4a16_gemm_pair(p1, p2, w_, rows, x1, act_, y_, pair_done_, stream),
                 "GEMM1 + GEMM2", name_);
  } else {
    check_launch(route_in_gemm1 ? moe_w4a16_gemm1_routed(p1, w_, g1r, x1, act_, stream,
                                                         folded ? &g1f : nullptr)
                 : routed_bf16_ ? moe_bf16_gemm1(p, wb_, rows, x, act_, stream)
                 : routed_w4a4_ ? moe_w4a4_gemm1(p, w4, rows, x, xq_, act_, stream, routed_kernel)
                                : moe_w4a16_gemm1(p1, w_, rows, x1, act_, stream, routed_kernel),
                 "GEMM1", name_);
    if (own && !side) shared_gemm1(stream);
    mark(2);
    // (W4A4: GEMM2's PDL follows the in-place act quantizer; it still waits before reading act.)
    check_launch(routed_bf16_   ? moe_bf16_gemm2(p, wb_, rows, act_, y_, true, stream)
                 : routed_w4a4_ ? moe_w4a4_gemm2(p2, w4, rows, act_, y_, true, stream, routed_kernel)
                                : moe_w4a16_gemm2(p2, w_, rows, act_, y_, true, stream, routed_kernel),
                 "GEMM2", name_);
    if (own && !side) shared_gemm2(stream);
  }
  if (side) TETRA_CUDA_CHECK(cudaStreamWaitEvent(stream, join_, 0));
  mark(3);
  cuda::CombineOptions co;
  co.shared_first_row = slot ? (masked ? row_start_ + E : offsets_ + E) : nullptr;
  // PDL only straight after the routed GEMM2 (a join or another GEMM2 in between: plain launch).
  co.pdl = path_.combine_pdl && !own && !marks;
  // The token path wrote the pairs and was complete before GEMM1 (or the GEMM pair) started: a
  // plain launch, or with gemm1_pdl one whose blocks trigger their dependents only after waiting
  // for it.
  co.routing_ready = true;
  co.add_norm = add_norm;
  if (folded) {  // GEMM1 has read the sums: zero for the next step's o_proj
    co.clear = fold_.sums;
    co.clear_count = fold_.copies * (E_global_ + 1);
  }
  check_launch(cuda::combine_bf16(y_, DType::F32, T, H, K, slot_of_, weights_,
                                  own ? y_sh_ : nullptr, residual, out, stream, co),
               "combine", name_);
  mark(4);
}

bool CudaMoeLayer::run_persistent(const uint16_t* x, int T, uint16_t* out,
                                  const uint16_t* residual, cudaStream_t stream) {
  cuda::PersistentLayer a;
  a.x = x;
  a.residual = residual;
  a.out = out;
  a.T = T;
  a.H = H_;
  a.I = I_;
  a.gate = gate_;
  a.bias = bias_;
  a.router = router_;
  a.expert_begin = begin_;
  a.E = E_;
  a.has_shared = Is_ > 0;
  a.w = w_;
  a.logits = logits_;
  a.ids = ids_;
  a.weights = weights_;
  a.pair_slot = slot_of_;
  a.slot_expert = slots_;
  a.slot_pair = slot_pair_;
  a.num_routed = num_routed_;
  a.dropped = dropped_;
  a.act = act_;  // rows: T * top_k pairs, then the shared expert's T (rows_cap covers both)
  a.part = y_;
  a.sync = persist_sync_;
  a.stamps = persist_stamps_;
  a.block_sm = persist_block_sm_;
  if (!cuda::persistent_layer_unsupported_reason(a).empty()) return false;
  check_launch(cuda::persistent_layer(a, stream), "persistent layer", name_);
  return true;
}

CudaTokenPath cuda_token_path_from_env() {
  CudaTokenPath p;
  const char* env = std::getenv("TETRA_MOE_TOKEN_PATH");
  if (!env || !*env) return p;
  std::string spec(env);
  if (spec == "old") spec = "persist=0,fused=0,slot=0,side=0,pdl=0,tpdl=0,pair=0,g1route=0,rpdl=0";
  std::istringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t eq = item.find('=');
    int v = 0;
    try {
      if (eq == std::string::npos) throw std::invalid_argument(item);
      const std::string value = item.substr(eq + 1);
      size_t used = 0;
      v = std::stoi(value, &used);
      if (used != value.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      TETRA_FAIL("TETRA_MOE_TOKEN_PATH: '", item, "' is not key=number");
    }
    const std::string key = item.substr(0, eq);
    if (key == "persist") {
      p.persistent_max_tokens = v;
    } else if (key == "fused") {
      p.fused_route_max_tokens = v;
    } else if (key == "slot") {
      p.shared_slot_max_tokens = v;
    } else if (key == "side") {
      p.shared_side_stream = v != 0;
    } else if (key == "pdl") {
      p.combine_pdl = v != 0;
    } else if (key == "tpdl") {
      p.token_path_pdl = v != 0;
    } else if (key == "warm") {
      p.warm_shared = v != 0;
    } else if (key == "g1route") {
      p.gemm1_routes = v != 0;
    } else if (key == "g1pdl") {
      p.gemm1_pdl = v != 0;
    } else if (key == "g2wave") {
      p.gemm2_one_wave = v != 0;
    } else if (key == "g2wide") {
      p.gemm2_wide = v != 0;
    } else if (key == "rpdl") {
      p.route_pdl = v != 0;
    } else if (key == "pair") {
      if (v < 0 || v > 2) TETRA_FAIL("TETRA_MOE_TOKEN_PATH: pair=", v, " (0 never, 1 auto, 2 always)");
      p.gemm_pair = v;
    } else {
      TETRA_FAIL("TETRA_MOE_TOKEN_PATH: unknown key '", key,
                 "' (persist, fused, slot, side, pdl, tpdl, warm, pair, g1route, g1pdl, g2wave, g2wide, rpdl)");
    }
  }
  return p;
}

std::string cuda_token_path_label(const CudaTokenPath& p) {
  std::ostringstream os;
  os << "persist<=" << p.persistent_max_tokens << " fused<=" << p.fused_route_max_tokens << " slot<=" << p.shared_slot_max_tokens
     << " side=" << int(p.shared_side_stream) << " pdl=" << int(p.combine_pdl)
     << " tpdl=" << int(p.token_path_pdl) << " warm=" << int(p.warm_shared)
     << " pair=" << p.gemm_pair << " g1route=" << int(p.gemm1_routes)
     << " g1pdl=" << int(p.gemm1_pdl)
     << " g2wave=" << int(p.gemm2_one_wave) << " g2wide=" << int(p.gemm2_wide)
     << " rpdl=" << int(p.route_pdl);
  return os.str();
}

std::unique_ptr<MoeLayerRunner> make_cuda_moe_layer(const MoeLayerWeights& w, int max_tokens,
                                                    TokenLayout layout, bool w4a4) {
  return std::make_unique<CudaMoeLayer>(w, max_tokens, layout, cuda_token_path_from_env(), w4a4);
}

}  // namespace tetra::moe
