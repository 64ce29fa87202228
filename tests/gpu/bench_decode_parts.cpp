// Timing of the non-MoE parts of a GLM-4.5-Air decode step at batch 1 (and 8): the q/k/v and o
// NVFP4 linears (the decode GEMV in both kernel variants next to the one-expert W4A16 kernel +
// add_bias it replaced), RMSNorm of 4096, fused RoPE + KV write, split decode attention over 1025
// cached tokens; the GEMV also as the streaming kernel in several shapes. Each is timed as a CUDA graph of 32 back-to-back launches (launch gaps as in the
// model's step graph), rotating over enough weight / KV copies that every launch reads HBM, not
// L2 (60 MB). Prints us per launch and GB/s of the bytes a launch must read. The checks: the two
// GEMV variants agree bit for bit, the GEMV agrees with the W4A16 path, and every time is finite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_check.h"
#include "graph_timing.h"
#include "core/half.h"
#include "model/cuda/split_decode_attention.h"
#include "ops/elementwise/elementwise_cuda.h"
#include "ops/linear/linear_cuda.h"
#include "ops/moe/w4a16_launch.h"
#include "ops/moe/moe_ops_cuda.h"
#include "ops/moe/w4a16_moe.h"
#include "ops/norm/rms_norm_cuda.h"
#include "ops/rope/rope.h"
#include "ops/rope/rope_kv_cuda.h"

namespace tetra {
namespace {

namespace oc = ops::cuda;
constexpr int kLaunches = 32;

using DevBuf = test::DeviceScratch;

oc::Nvfp4LinearBuffer random_linear(int n, int k, uint64_t seed) {
  auto b = oc::Nvfp4LinearBuffer::allocate(n, k, false);
  TETRA_CUDA_CHECK(oc::fill_random_bytes(b.weight_mut(), int64_t(n) * k / 2, seed, nullptr));
  TETRA_CUDA_CHECK(oc::fill_random_byte_range(b.scale_mut(), int64_t(n) * k / 16, 7 << 3,
                                              (8 << 3) | 7, seed + 1, nullptr));
  TETRA_CUDA_CHECK(oc::fill_f32(b.alpha_mut(), 1, 1024.0f * 2.0f / std::sqrt(float(k)), nullptr));
  return b;
}

// GroupedGemmArgs of one matrix with M rows of x (as linear_nvfp4 builds them).
moe_detail::GroupedGemmArgs one_matrix_args(const oc::Nvfp4LinearDevice& w, const uint16_t* x,
                                            const oc::RowCountTable& rows, int M, void* out) {
  moe_detail::GroupedGemmArgs a;
  a.w = w.w;
  a.s = w.s;
  a.alpha0 = w.alpha;
  a.x = x;
  a.out = out;
  a.rows.row_start = rows.zero();
  a.rows.row_count = rows.count(M);
  a.n = w.n;
  a.k = w.k;
  a.num_slots = 1;
  a.total_rows = M;
  return a;
}

double time_graph(const std::function<void(int, cudaStream_t)>& launch) {
  return test::graph_us_per_launch(kLaunches, launch);
}

void report(const std::string& what, double us, double bytes) {
  EXPECT_TRUE(std::isfinite(us) && us > 0.0) << what;
  std::printf("| %-44s | %8.2f | %7.0f |\n", what.c_str(), us, bytes / us / 1e3);
}

TEST(BenchDecodeParts, Glm45AirBatch1) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  constexpr int H = 4096, NQ = 12288, NKV = 1024;
  const int copies = test::weight_copies();  // TETRA_PARTS_COPIES=1: L2-resident weights
  std::vector<oc::Nvfp4LinearBuffer> q, k, v, o, qkv_fused;  // `copies` each: 4 x 94 MB > L2
  for (int c = 0; c < copies; ++c) {
    q.push_back(random_linear(NQ, H, 100 + 10 * c));
    k.push_back(random_linear(NKV, H, 102 + 10 * c));
    v.push_back(random_linear(NKV, H, 104 + 10 * c));
    o.push_back(random_linear(H, NQ, 106 + 10 * c));
    qkv_fused.push_back(random_linear(NQ + 2 * NKV, H, 108 + 10 * c));
  }
  DevBuf x(size_t(8) * NQ * 2), bias(size_t(NQ) * 2), yq(size_t(8) * (NQ + 2 * NKV) * 2), yk(size_t(8) * NKV * 2),
      yv(size_t(8) * NKV * 2), yo(size_t(8) * H * 2), ref(size_t(8) * NQ * 2);
  TETRA_CUDA_CHECK(oc::fill_random_bf16(x.as<uint16_t>(), int64_t(8) * NQ, 1.0f, 7, nullptr));
  TETRA_CUDA_CHECK(oc::fill_random_bf16(bias.as<uint16_t>(), NQ, 0.1f, 8, nullptr));
  oc::RowCountTable rows(8);
  const double qkv_bytes = double(q[0].bytes() + k[0].bytes() + v[0].bytes());
  const double o_bytes = double(o[0].bytes());
  std::printf("\n| part (GLM-4.5-Air, one layer) | us | GB/s |\n|---|---|---|\n");
  for (int M : {1, 8}) {
    const std::string m = " M=" + std::to_string(M);
    struct Variant {
      const char* name;
      oc::Nvfp4GemvKernel kernel;
      oc::Nvfp4GemvStreamConfig cfg;
    };
    // Stream shapes: {consumer warps, ring stages, blocks per SM, chunks per warp, mode}; modes
    // 1 (copy only) and 2 (no activation loads) are diagnostics, their outputs meaningless.
    const Variant variants[] = {{"auto", oc::Nvfp4GemvKernel::Auto, {}},
                                {"batched", oc::Nvfp4GemvKernel::Batched, {}},
                                {"stream c16 j1 st5 b2", oc::Nvfp4GemvKernel::Stream, {16, 5, 2, 1, 0}},
                                {"stream c16 j1 st4 b2", oc::Nvfp4GemvKernel::Stream, {16, 4, 2, 1, 0}},
                                {"stream c16 j1 st6 b2", oc::Nvfp4GemvKernel::Stream, {16, 6, 2, 1, 0}},
                                {"stream c8 j2 st8 b1", oc::Nvfp4GemvKernel::Stream, {8, 8, 1, 2, 0}},
                                {"diag copy-only c8 j2 st6 b2", oc::Nvfp4GemvKernel::Stream, {8, 6, 2, 2, 1}},
                                {"diag no-x c8 j2 st8 b1", oc::Nvfp4GemvKernel::Stream, {8, 8, 1, 2, 2}}};
    for (const Variant& var : variants) {
      const auto kern = var.kernel;
      const oc::Nvfp4GemvStreamConfig* cfg = &var.cfg;
      const char* name = var.name;
      report(std::string("qkv GEMV ") + name + m, time_graph([&](int i, cudaStream_t s) {
               const int c = i % copies;
               const oc::Nvfp4GemvOutput outs[3] = {{&q[c].view(), bias.as<uint16_t>(), yq.as<uint16_t>()},
                                                    {&k[c].view(), bias.as<uint16_t>(), yk.as<uint16_t>()},
                                                    {&v[c].view(), bias.as<uint16_t>(), yv.as<uint16_t>()}};
               TETRA_CUDA_CHECK(oc::linear_nvfp4_gemv(outs, 3, x.as<uint16_t>(), M, s, kern, cfg));
             }),
             qkv_bytes);
      report(std::string("o GEMV ") + name + m, time_graph([&](int i, cudaStream_t s) {
               const oc::Nvfp4GemvOutput out{&o[i % copies].view(), nullptr, yo.as<uint16_t>()};
               TETRA_CUDA_CHECK(oc::linear_nvfp4_gemv(&out, 1, x.as<uint16_t>(), M, s, kern, cfg));
             }),
             o_bytes);
    }
    report("q, k, v W4A16 + 3 add_bias" + m, time_graph([&](int i, cudaStream_t s) {
             const int c = i % copies;
             const std::pair<const oc::Nvfp4LinearBuffer*, DevBuf*> parts[3] = {
                 {&q[c], &yq}, {&k[c], &yk}, {&v[c], &yv}};
             for (const auto& [w, y] : parts) {
               TETRA_CUDA_CHECK(oc::linear_nvfp4(w->view(), x.as<uint16_t>(), M, rows, y->p,
                                                 DType::BF16, s));
               TETRA_CUDA_CHECK(oc::add_bias(y->p, false, M, w->view().n, bias.as<uint16_t>(), s));
             }
           }),
           qkv_bytes);
    // q/k/v as one [NQ + 2 NKV, H] matrix, and o, on the one-expert decode kernel in the MoE's
    // configurations (outputs not checked here: the kernel's tests do). Session 14, M = 1: the
    // best (late kw4) 13.9 us vs the GEMV's 13.4 for q/k/v, o 13.4+ vs the stream's 10.6, so the
    // model keeps the GEMVs.
    struct DecodeVariant {
      const char* name;
      moe_detail::DecodeConfig cfg;
    };
    const DecodeVariant decode_variants[] = {
        {"classic kw4", {1, 4, 2, false}},
        {"classic kw8", {1, 8, 2, false}},
        {"late kw4 u2 b8", {1, 4, 2, true, 2, 8}},
        {"late kw4 u4 b4", {1, 4, 2, true, 4, 4}},
        {"late kw2 u8 b8", {1, 2, 2, true, 8, 8}}};
    for (const DecodeVariant& dv : decode_variants) {
      report(std::string("qkv fused decode ") + dv.name + m, time_graph([&](int i, cudaStream_t s) {
               moe_detail::GroupedGemmArgs a = one_matrix_args(qkv_fused[size_t(i % copies)].view(),
                                                                x.as<uint16_t>(), rows, M, yq.p);
               TETRA_CUDA_CHECK(moe_detail::launch_decode(a, dv.cfg, s));
             }),
             qkv_bytes);
      report(std::string("o decode ") + dv.name + m, time_graph([&](int i, cudaStream_t s) {
               moe_detail::GroupedGemmArgs a = one_matrix_args(o[size_t(i % copies)].view(),
                                                                x.as<uint16_t>(), rows, M, yo.p);
               TETRA_CUDA_CHECK(moe_detail::launch_decode(a, dv.cfg, s));
             }),
             o_bytes);
    }
    report("o W4A16" + m, time_graph([&](int i, cudaStream_t s) {
             TETRA_CUDA_CHECK(oc::linear_nvfp4(o[i % copies].view(), x.as<uint16_t>(), M, rows,
                                               yo.p, DType::BF16, s));
           }),
           o_bytes);
  }
  // Check: GEMV vs W4A16 close (o, M = 3).
  auto download = [](const DevBuf& b, size_t n) {
    std::vector<uint16_t> h(n);
    TETRA_CUDA_CHECK(cudaMemcpy(h.data(), b.p, n * 2, cudaMemcpyDeviceToHost));
    return h;
  };
  const oc::Nvfp4GemvOutput out{&o[0].view(), nullptr, yo.as<uint16_t>()};
  TETRA_CUDA_CHECK(oc::linear_nvfp4_gemv(&out, 1, x.as<uint16_t>(), 3, nullptr, oc::Nvfp4GemvKernel::Batched));
  const auto batched = download(yo, size_t(3) * H);
  TETRA_CUDA_CHECK(oc::linear_nvfp4(o[0].view(), x.as<uint16_t>(), 3, rows, ref.p, DType::BF16, nullptr));
  const auto w4a16 = download(ref, size_t(3) * H);
  double err = 0, nrm = 0;
  for (size_t i = 0; i < batched.size(); ++i) {
    const double a = bf16_to_float(batched[i]), b = bf16_to_float(w4a16[i]);
    err += (a - b) * (a - b);
    nrm += b * b;
  }
  EXPECT_LE(err / nrm, 1e-5);
  // The streaming kernel: close to the W4A16 path, and bit-identical run to run.
  TETRA_CUDA_CHECK(oc::linear_nvfp4_gemv(&out, 1, x.as<uint16_t>(), 3, nullptr, oc::Nvfp4GemvKernel::Stream));
  const auto streamed = download(yo, size_t(3) * H);
  TETRA_CUDA_CHECK(oc::linear_nvfp4_gemv(&out, 1, x.as<uint16_t>(), 3, nullptr, oc::Nvfp4GemvKernel::Stream));
  EXPECT_EQ(download(yo, size_t(3) * H), streamed) << "stream kernel not deterministic";
  err = nrm = 0;
  for (size_t i = 0; i < streamed.size(); ++i) {
    const double a = bf16_to_float(streamed[i]), b = bf16_to_float(w4a16[i]);
    err += (a - b) * (a - b);
    nrm += b * b;
  }
  EXPECT_LE(err / nrm, 1e-5) << "stream vs W4A16";

  // RMSNorm of one 4096 row (fused add), fused RoPE + KV write of one token.
  DevBuf res(size_t(H) * 2), nw(size_t(H) * 2), normed(size_t(H) * 2);
  TETRA_CUDA_CHECK(oc::fill_random_bf16(res.as<uint16_t>(), H, 1.0f, 9, nullptr));
  TETRA_CUDA_CHECK(oc::fill_random_bf16(nw.as<uint16_t>(), H, 1.0f, 10, nullptr));
  report("fused add + RMSNorm, 4096", time_graph([&](int, cudaStream_t s) {
           TETRA_CUDA_CHECK(oc::fused_add_rms_norm(x.as<uint16_t>(), res.as<uint16_t>(),
                                                   nw.as<uint16_t>(), 1, H, 1e-5f,
                                                   normed.as<uint16_t>(), s));
         }),
         3.0 * H * 2);
  ops::RopeShape rs{128, 64, 96, 8, NQ, NKV, ops::RopeStyle::NeoX};
  const auto inv = ops::rope_inv_freq(1e6, 64);
  DevBuf dinv(inv.size() * 4), pos(4), slot(8), kc(size_t(2048) * NKV * 2), vc(size_t(2048) * NKV * 2);
  TETRA_CUDA_CHECK(cudaMemcpy(dinv.p, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  const int32_t p1024 = 1024;
  const int64_t s1024 = 1024;
  TETRA_CUDA_CHECK(cudaMemcpy(pos.p, &p1024, 4, cudaMemcpyHostToDevice));
  TETRA_CUDA_CHECK(cudaMemcpy(slot.p, &s1024, 8, cudaMemcpyHostToDevice));
  report("RoPE + KV write, 1 token", time_graph([&](int, cudaStream_t s) {
           TETRA_CUDA_CHECK(oc::rope_and_write_kv(yq.as<uint16_t>(), yk.as<uint16_t>(),
                                                  yv.as<uint16_t>(), NKV, pos.as<int32_t>(),
                                                  slot.as<int64_t>(), 1, dinv.as<float>(), rs,
                                                  2048, kc.as<uint16_t>(), vc.as<uint16_t>(), s));
         }),
         (2.0 * NQ + 6.0 * NKV) * 2);

  // Split decode attention, 1025 cached tokens, limits of the decode bench (4096-token table).
  constexpr int kCaches = 16, kLen = 1025, kBlock = 16, kMaxBlocks = 256;
  ops::AttentionShape as;
  as.n_heads = 96;
  as.n_kv_heads = 8;
  as.head_dim = 128;
  as.scale = 1.0f / std::sqrt(128.0f);
  std::vector<std::unique_ptr<DevBuf>> kcache, vcache;
  const size_t cache_elems = size_t(kMaxBlocks) * kBlock * NKV;
  for (int c = 0; c < kCaches; ++c) {
    kcache.push_back(std::make_unique<DevBuf>(cache_elems * 2));
    vcache.push_back(std::make_unique<DevBuf>(cache_elems * 2));
    TETRA_CUDA_CHECK(oc::fill_random_bf16(kcache.back()->as<uint16_t>(), int64_t(cache_elems), 1.0f, 20 + c, nullptr));
    TETRA_CUDA_CHECK(oc::fill_random_bf16(vcache.back()->as<uint16_t>(), int64_t(cache_elems), 1.0f, 40 + c, nullptr));
  }
  std::vector<int32_t> table(kMaxBlocks);
  for (int b = 0; b < kMaxBlocks; ++b) table[size_t(b)] = b;
  DevBuf dtable(table.size() * 4), dlen(4), attn_out(size_t(NQ) * 2);
  TETRA_CUDA_CHECK(cudaMemcpy(dtable.p, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  TETRA_CUDA_CHECK(cudaMemcpy(dlen.p, &kLen, 4, cudaMemcpyHostToDevice));
  ops::PagedKv kv;
  kv.block_tables = dtable.as<int32_t>();
  kv.seq_lens = dlen.as<int32_t>();
  kv.num_blocks = kMaxBlocks;
  kv.block_size = kBlock;
  kv.max_blocks_per_seq = kMaxBlocks;
  report("split decode attention, 1025 tokens", time_graph([&](int i, cudaStream_t s) {
           ops::PagedKv c = kv;
           c.k_cache = kcache[size_t(i % kCaches)]->as<uint16_t>();
           c.v_cache = vcache[size_t(i % kCaches)]->as<uint16_t>();
           TETRA_CUDA_CHECK(model::cuda::split_decode_attention(yq.as<uint16_t>(), c, 1, as,
                                                                attn_out.as<uint16_t>(), s));
         }),
         2.0 * kLen * NKV * 2);
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
}


// Dense q/k/v and o linears at batch 16..64 (decode with many sequences): the one-expert decode
// kernel linear_nvfp4 runs today next to the tiled kernel, the late decode kernel (8-row passes,
// later passes read the weights from L2) and the M <= 8 GEMV run once per 8 rows.
TEST(BenchDecodeParts, Glm45AirDenseLinearsBatch16To64) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  constexpr int H = 4096, NQ = 12288, NKV = 1024, kCopies = 4, kMaxM = 64;
  std::vector<oc::Nvfp4LinearBuffer> q, k, v, o;
  for (int c = 0; c < kCopies; ++c) {
    q.push_back(random_linear(NQ, H, 300 + 10 * c));
    k.push_back(random_linear(NKV, H, 302 + 10 * c));
    v.push_back(random_linear(NKV, H, 304 + 10 * c));
    o.push_back(random_linear(H, NQ, 306 + 10 * c));
  }
  DevBuf x(size_t(kMaxM) * NQ * 2), yq(size_t(kMaxM) * NQ * 2), yk(size_t(kMaxM) * NKV * 2),
      yv(size_t(kMaxM) * NKV * 2), yo(size_t(kMaxM) * H * 2), xw_scratch(size_t(kMaxM) * NQ * 2);
  TETRA_CUDA_CHECK(oc::fill_random_bf16(x.as<uint16_t>(), int64_t(kMaxM) * NQ, 1.0f, 17, nullptr));
  oc::RowCountTable rows(kMaxM);
  const double qkv_bytes = double(q[0].bytes() + k[0].bytes() + v[0].bytes());
  const double o_bytes = double(o[0].bytes());
  auto args = [&](const oc::Nvfp4LinearDevice& w, int M, void* out) {
    return one_matrix_args(w, x.as<uint16_t>(), rows, M, out);
  };
  using Launch = std::function<cudaError_t(const moe_detail::GroupedGemmArgs&, int, cudaStream_t)>;
  auto decode_cfg = [](int tiles, int kw, bool late) {
    moe_detail::DecodeConfig c;
    c.token_tiles = tiles;
    c.k_warps = kw;
    c.late_x = late;
    c.chunks_per_batch = 2;
    c.min_blocks_per_sm = 8;
    return c;
  };
  const std::pair<const char*, Launch> kernels[] = {
      {"decode n32 kw4", [&](const auto& a, int, cudaStream_t s) { return moe_detail::launch_decode(a, decode_cfg(4, 4, false), s); }},
      {"decode n32 kw8", [&](const auto& a, int, cudaStream_t s) { return moe_detail::launch_decode(a, decode_cfg(4, 8, false), s); }},
      {"late n8 passes", [&](const auto& a, int, cudaStream_t s) { return moe_detail::launch_decode(a, decode_cfg(1, 4, true), s); }},
      {"tiled 1/SM", [&](const auto& a, int, cudaStream_t s) { return moe_detail::launch_tiled(a, 1, s); }},
      {"tiled 2/SM", [&](const auto& a, int, cudaStream_t s) { return moe_detail::launch_tiled(a, 2, s); }},
  };
  std::printf("\n| dense linears, batch 16..64 | us | GB/s |\n|---|---|---|\n");
  for (int M : {16, 32, 64}) {
    const std::string m = " M=" + std::to_string(M);
    const auto one_expert = [&](int i, cudaStream_t s) {
      const int c = i % kCopies;
      const uint16_t* xp = x.as<uint16_t>();
      TETRA_CUDA_CHECK(oc::linear_nvfp4(q[c].view(), xp, M, rows, yq.p, DType::BF16, s));
      TETRA_CUDA_CHECK(oc::linear_nvfp4(k[c].view(), xp, M, rows, yk.p, DType::BF16, s));
      TETRA_CUDA_CHECK(oc::linear_nvfp4(v[c].view(), xp, M, rows, yv.p, DType::BF16, s));
    };
    report("qkv linear_nvfp4 (one-expert decode kernel)" + m, time_graph(one_expert), qkv_bytes);
    for (const auto& [name, launch] : kernels) {
      report(std::string("qkv ") + name + m, time_graph([&](int i, cudaStream_t s) {
               const int c = i % kCopies;
               TETRA_CUDA_CHECK(launch(args(q[c].view(), M, yq.p), M, s));
               TETRA_CUDA_CHECK(launch(args(k[c].view(), M, yk.p), M, s));
               TETRA_CUDA_CHECK(launch(args(v[c].view(), M, yv.p), M, s));
             }),
             qkv_bytes);
      report(std::string("o ") + name + m, time_graph([&](int i, cudaStream_t s) {
               TETRA_CUDA_CHECK(launch(args(o[i % kCopies].view(), M, yo.p), M, s));
             }),
             o_bytes);
    }
    // The wgmma kernel (the MoE GEMMs' kernel above 8 rows per expert, the dense linears' from
    // 256 rows), x reordered into wgmma order once per input as the model does.
    if (moe_wgmma_available()) {
      uint16_t* xw = xw_scratch.as<uint16_t>();
      report("qkv wgmma + x reorder" + m, time_graph([&](int i, cudaStream_t s) {
               const int c = i % kCopies;
               TETRA_CUDA_CHECK(moe_w4a16_to_wgmma_order(x.as<uint16_t>(), M, H, xw, s));
               const std::pair<const oc::Nvfp4LinearBuffer*, DevBuf*> parts[3] = {
                   {&q[c], &yq}, {&k[c], &yk}, {&v[c], &yv}};
               for (const auto& [w, y] : parts) {
                 moe_detail::GroupedGemmArgs a = args(w->view(), M, y->p);
                 a.x = xw;
                 TETRA_CUDA_CHECK(moe_detail::launch_wgmma(a, s));
               }
             }),
             qkv_bytes);
      report("o wgmma + x reorder" + m, time_graph([&](int i, cudaStream_t s) {
               TETRA_CUDA_CHECK(moe_w4a16_to_wgmma_order(x.as<uint16_t>(), M, NQ, xw, s));
               moe_detail::GroupedGemmArgs a = args(o[i % kCopies].view(), M, yo.p);
               a.x = xw;
               TETRA_CUDA_CHECK(moe_detail::launch_wgmma(a, s));
             }),
             o_bytes);
    }
    // The small-M kernel through linear_nvfp4_gemv (what the model runs at batch 9..64: one launch
    // for q/k/v), then its shapes: tiles per warp x cluster split.
    auto qkv_small = [&](const oc::Nvfp4SmallMConfig* cfg) {
      return time_graph([&](int i, cudaStream_t s) {
        const int c = i % kCopies;
        const oc::Nvfp4GemvOutput outs[3] = {{&q[c].view(), nullptr, yq.as<uint16_t>()},
                                             {&k[c].view(), nullptr, yk.as<uint16_t>()},
                                             {&v[c].view(), nullptr, yv.as<uint16_t>()}};
        TETRA_CUDA_CHECK(cfg ? oc::linear_nvfp4_small_m(outs, 3, x.as<uint16_t>(), M, s, cfg)
                             : oc::linear_nvfp4_gemv(outs, 3, x.as<uint16_t>(), M, s));
      });
    };
    auto o_small = [&](const oc::Nvfp4SmallMConfig* cfg) {
      return time_graph([&](int i, cudaStream_t s) {
        const oc::Nvfp4GemvOutput outs[1] = {{&o[i % kCopies].view(), nullptr, yo.as<uint16_t>()}};
        // Direct: linear_nvfp4_gemv refuses o_proj's k = 12288 above 8 rows (kNvfp4SmallMGemvMaxK).
        TETRA_CUDA_CHECK(oc::linear_nvfp4_small_m(outs, 1, x.as<uint16_t>(), M, s, cfg));
      });
    };
    report("qkv small-M via linear_nvfp4_gemv (auto)" + m, qkv_small(nullptr), qkv_bytes);
    report("o small-M auto (not routed)" + m, o_small(nullptr), o_bytes);
    for (int tw : {1, 2})
      for (int split : {2, 4, 8}) {
        const oc::Nvfp4SmallMConfig cfg{tw, split};
        const std::string name = " tw" + std::to_string(tw) + " s" + std::to_string(split) + m;
        // The x slice [8 ceil(M/8)][k / split + 8] bf16 must fit 227 KB of shared memory (the
        // launcher refuses it otherwise; skipped here rather than thrown inside graph capture).
        auto fits = [&](int kk) {
          return (M + 7) / 8 * 8 * ((kk / 64 + split - 1) / split * 128 + 16) <= 227 * 1024;
        };
        if (fits(H)) report("qkv small-M" + name, qkv_small(&cfg), qkv_bytes);
        if (fits(NQ)) report("o small-M" + name, o_small(&cfg), o_bytes);
      }
    report("qkv GEMV per 8 rows" + m, time_graph([&](int i, cudaStream_t s) {
             const int c = i % kCopies;
             for (int r = 0; r < M; r += 8) {
               const oc::Nvfp4GemvOutput outs[3] = {
                   {&q[c].view(), nullptr, yq.as<uint16_t>() + size_t(r) * NQ},
                   {&k[c].view(), nullptr, yk.as<uint16_t>() + size_t(r) * NKV},
                   {&v[c].view(), nullptr, yv.as<uint16_t>() + size_t(r) * NKV}};
               TETRA_CUDA_CHECK(oc::linear_nvfp4_gemv(outs, 3, x.as<uint16_t>() + size_t(r) * H, 8, s,
                                                      oc::Nvfp4GemvKernel::Auto, nullptr));
             }
           }),
           qkv_bytes);
  }
}

// The wgmma kernel with its k split over a cluster (WgmmaConfig::k_split), for the dense linears
// at 16..256 rows, where one [N, K] matrix gives it only N / 256 column blocks: GLM-4.5-Air's
// q/k/v as one [14336, 4096] matrix and o_proj [4096, 12288], timed with x's reorder into wgmma
// order (as the model would run them) next to what the model runs today at each M (q/k/v: the
// small-M kernel up to 64 rows, then linear_nvfp4; o: linear_nvfp4) and, above 64 rows, the
// tiled kernel linear_nvfp4 ran there before. Each split is checked against linear_nvfp4 without
// x scratch (the decode or tiled kernel; NMSE <= 1e-5).
TEST(BenchDecodeParts, Glm45AirDenseLinearsWgmmaSplitK) {
  if (!cuda_available() || !moe_wgmma_available()) GTEST_SKIP() << "needs the wgmma kernel";
  constexpr int H = 4096, NQ = 12288, NKV = 1024, NQKV = NQ + 2 * NKV, kCopies = 4, kMaxM = 256;
  struct Mat {
    const char* name;
    int n, k;
  };
  const Mat mats[] = {{"qkv", NQKV, H}, {"o", H, NQ}, {"q", NQ, H}, {"k", NKV, H}};
  DevBuf x(size_t(kMaxM) * NQ * 2), xw(size_t(kMaxM) * NQ * 2), y(size_t(kMaxM) * NQKV * 2),
      ref(size_t(kMaxM) * NQKV * 2), yk(size_t(kMaxM) * NKV * 2), yv(size_t(kMaxM) * NKV * 2),
      bias(size_t(NQ) * 2);
  TETRA_CUDA_CHECK(oc::fill_random_bf16(bias.as<uint16_t>(), NQ, 0.1f, 29, nullptr));
  TETRA_CUDA_CHECK(oc::fill_random_bf16(x.as<uint16_t>(), int64_t(kMaxM) * NQ, 1.0f, 23, nullptr));
  oc::RowCountTable rows(kMaxM);
  std::printf("\n| wgmma split-k (dense, GLM-4.5-Air) | us | GB/s |\n|---|---|---|\n");
  for (const Mat& mt : mats) {
    std::vector<oc::Nvfp4LinearBuffer> w, q, k, v;
    for (int c = 0; c < kCopies; ++c) {
      w.push_back(random_linear(mt.n, mt.k, 500 + 10 * c));
      if (mt.n == NQKV) {  // the model's three q/k/v matrices
        q.push_back(random_linear(NQ, H, 700 + 10 * c));
        k.push_back(random_linear(NKV, H, 702 + 10 * c));
        v.push_back(random_linear(NKV, H, 704 + 10 * c));
      }
    }
    const double bytes = double(w[0].bytes());
    for (int M : {16, 32, 64, 96, 128, 192, 256}) {
      const std::string m = " M=" + std::to_string(M);
      uint16_t* xw_p = xw.as<uint16_t>();
      // The model's three q/k/v matrices with biases, as the GEMVs and linear_nvfp4_wgmma take them.
      auto qkv_outs = [&](int c, const uint16_t* b) {
        return std::vector<oc::Nvfp4GemvOutput>{{&q[c].view(), b, y.as<uint16_t>()},
                                                {&k[c].view(), b, yk.as<uint16_t>()},
                                                {&v[c].view(), b, yv.as<uint16_t>()}};
      };
      // What runs today: q/k/v on the small-M kernel up to 64 rows, else linear_nvfp4.
      const bool small_m = mt.n == NQKV && M <= oc::kNvfp4GemvMaxRows;
      auto today = [&](int i, cudaStream_t s) {
        const int c = i % kCopies;
        if (small_m) {
          TETRA_CUDA_CHECK(oc::linear_nvfp4_gemv(qkv_outs(c, nullptr).data(), 3, x.as<uint16_t>(), M, s));
        } else {
          TETRA_CUDA_CHECK(oc::linear_nvfp4(w[c].view(), x.as<uint16_t>(), M, rows, y.p,
                                            DType::BF16, s, xw_p));
        }
      };
      report(std::string(mt.name) + (small_m ? " small-M gemv" : " linear_nvfp4") + m,
             time_graph(today), bytes);
      if (M > oc::kNvfp4GemvMaxRows) {  // linear_nvfp4's kernel above 64 rows before session 25
        auto tiled = [&](int i, cudaStream_t s) {
          const auto a = one_matrix_args(w[size_t(i % kCopies)].view(), x.as<uint16_t>(), rows, M, y.p);
          TETRA_CUDA_CHECK(moe_detail::launch_tiled(a, 2, s));
        };
        report(std::string(mt.name) + " tiled 2/SM" + m, time_graph(tiled), bytes);
      }
      if (mt.n == NQKV && M >= 32) {  // q/k/v in one wgmma launch (the model's from 64 rows)
        auto three = [&](int i, cudaStream_t s) {
          const auto outs = qkv_outs(i % kCopies, bias.as<uint16_t>());
          if (M >= oc::kNvfp4WgmmaOutputsMinRows) {
            TETRA_CUDA_CHECK(oc::linear_nvfp4_wgmma(outs.data(), 3, x.as<uint16_t>(), M, rows, xw_p, s));
            return;
          }
          // Under the threshold: the same launch, called directly.
          TETRA_CUDA_CHECK(moe_w4a16_to_wgmma_order(x.as<uint16_t>(), M, H, xw_p, s));
          moe_detail::OutSegments seg;
          seg.count = 3;
          const int ends[3] = {NQ, NQ + NKV, NQKV};
          for (int o = 0; o < 3; ++o) {
            const oc::Nvfp4LinearDevice& d = *outs[size_t(o)].w;
            seg.seg[o] = {ends[o], d.w, d.s, d.alpha, outs[size_t(o)].bias, outs[size_t(o)].y};
          }
          moe_detail::GroupedGemmArgs a = one_matrix_args(*outs[0].w, xw_p, rows, M, y.p);
          a.n = NQKV;
          TETRA_CUDA_CHECK(moe_detail::launch_wgmma(a, s, {}, seg));
        };
        report("qkv linear_nvfp4_wgmma (3 outputs + biases)" + m, time_graph(three), bytes);
      }
      TETRA_CUDA_CHECK(oc::linear_nvfp4(w[0].view(), x.as<uint16_t>(), M, rows, ref.p, DType::BF16,
                                        nullptr));
      std::vector<uint16_t> want(size_t(M) * mt.n);
      TETRA_CUDA_CHECK(cudaMemcpy(want.data(), ref.p, want.size() * 2, cudaMemcpyDeviceToHost));
      for (int tile : {32, 64, 128})
        for (int S : {0, 1, 2, 4, 8}) {
          const moe_detail::WgmmaConfig cfg{S, tile};
          auto run = [&](int c, cudaStream_t s) {
            TETRA_CUDA_CHECK(moe_w4a16_to_wgmma_order(x.as<uint16_t>(), M, mt.k, xw.as<uint16_t>(), s));
            moe_detail::GroupedGemmArgs a = one_matrix_args(w[size_t(c)].view(), xw.as<uint16_t>(),
                                                            rows, M, y.p);
            TETRA_CUDA_CHECK(moe_detail::launch_wgmma(a, s, cfg));
          };
          const std::string name = std::string(mt.name) + " wgmma n" + std::to_string(tile) +
                                   (S == 0 ? std::string(" auto") : " S=" + std::to_string(S)) + m;
          report(name, time_graph([&](int i, cudaStream_t s) { run(i % kCopies, s); }), bytes);
          run(0, nullptr);
          std::vector<uint16_t> got(want.size());
          TETRA_CUDA_CHECK(cudaMemcpy(got.data(), y.p, got.size() * 2, cudaMemcpyDeviceToHost));
          double err = 0, nrm = 0;
          for (size_t i = 0; i < got.size(); ++i) {
            const double g = bf16_to_float(got[i]), r = bf16_to_float(want[i]);
            err += (g - r) * (g - r);
            nrm += r * r;
          }
          EXPECT_LE(err / nrm, 1e-5) << name;
        }
    }
  }
}

}  // namespace
}  // namespace tetra
