// The split paged decode attention of the CUDA model backend against the CPU reference
// (ops::paged_decode_attention_cpu) on fresh random caches: head_dim 64 and 128, GQA groups 1..16
// (12 = GLM-4.5-Air), sequence lengths around the 64-token chunk edges and past the split cap
// (several chunks per split), shuffled block tables, an empty sequence, a q row stride wider than
// the heads; the automatic split count and forced ones (1: no cluster merge; 3: uneven; 16: the
// largest cluster, most splits empty for short sequences). NMSE <= 2e-5 (split_decode_case.h).
// Outputs are poisoned before the launch and guarded by bytes that must survive. A second launch
// must give the same bits (the merge order is fixed).
// PredecessorWrites::QAndNewKvRow (cache reads before the PDL wait, the row of position len - 1
// after it) must give the same bits as the default on every shape, and be right when a real
// RoPE + KV write kernel writes q and that row right before it on the stream.
// The automatic split count grows with the context and stays a power of two.
// test_split_decode_attention_pdl.cu holds the race test with a deliberately slow writer.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "model/cuda/split_decode_attention.h"
#include "ops/attention/attention.h"
#include "ops/rope/rope.h"
#include "ops/rope/rope_kv_cuda.h"
#include "split_decode_case.h"

namespace tetra::model::cuda {
namespace {

using test::DevCase;
using test::expect_matches_cpu;
using test::HostCase;
using test::make_case;

// The step's new token of each sequence: position len - 1, its cache slot (-1 for sequence
// `pad`, graph padding; -1 = none), the cache rows there poisoned with NaN (the RoPE kernel or
// the attention writes them), random un-rotated k and v rows, the RoPE shape and angles.
struct NewTokens {
  std::vector<int32_t> positions;
  std::vector<int64_t> slots;
  std::vector<uint16_t> k_new, v_new;  // [S, n_kv * D]
  ops::RopeShape rs;
  std::vector<float> inv_freq;
  NewTokens(HostCase& hc, int rotary, ops::RopeStyle style, int pad, std::mt19937& rng) {
    const int S = hc.num_seqs();
    const int64_t row = hc.row_elems();
    for (int s = 0; s < S; ++s) {
      positions.push_back(hc.lens[size_t(s)] - 1);
      slots.push_back(s == pad ? -1 : hc.slot(s, positions.back()));
      for (int64_t i = 0; i < row && s != pad; ++i) {
        hc.kc[size_t(slots.back() * row + i)] = 0x7FC0;
        hc.vc[size_t(slots.back() * row + i)] = 0x7FC0;
      }
    }
    k_new = test::random_bf16(size_t(S) * row, rng, 2.0f);
    v_new = test::random_bf16(size_t(S) * row, rng, 1.0f);
    rs.head_dim = hc.sh.head_dim;
    rs.rotary_dim = rotary;
    rs.n_q_heads = hc.sh.n_heads;
    rs.n_k_heads = hc.sh.n_kv_heads;
    rs.q_stride = hc.sh.q_step();
    rs.k_stride = row;
    rs.style = style;
    inv_freq = ops::rope_inv_freq(1e6, rotary);
  }
};
// The same on the device (k_new is re-uploaded before each run: the RoPE kernel turns it in place).
struct NewTokensDev {
  explicit NewTokensDev(const NewTokens& n)
      : k_new(n.k_new), v_new(n.v_new), pos(n.positions), slots(n.slots), inv(n.inv_freq) {}
  tetra::test::GuardedDeviceArray<uint16_t> k_new, v_new;
  tetra::test::GuardedDeviceArray<int32_t> pos;
  tetra::test::GuardedDeviceArray<int64_t> slots;
  tetra::test::GuardedDeviceArray<float> inv;
};

TEST(SplitDecodeAttention, MatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(31);
  struct Case { int D, heads, kv_heads; std::vector<int> lens; int block_size; };
  const std::vector<Case> cases = {
      {128, 96, 8, {1, 63, 64, 65, 1025}, 16},
      {128, 32, 4, {0, 200, 4999}, 16},  // 4999 at one split: 79 chunks through the stages
      {64, 4, 2, {3, 129, 777}, 4},
      {64, 16, 1, {64, 1000}, 16},
      {128, 8, 8, {500, 2}, 8},
      {128, 15, 5, {31, 257}, 1},  // group 3: heads 3..15 of the MMA tile are padding
      {128, 24, 2, {100, 1500}, 12},  // a block size that is no power of two
  };
  for (const Case& c : cases) {
    const HostCase hc = make_case(c.D, c.heads, c.kv_heads, c.lens, c.block_size, rng);
    ASSERT_EQ(split_decode_unsupported_reason(hc.sh), "");
    const std::vector<uint16_t> want = hc.cpu_reference();
    DevCase dev(hc);
    for (int splits : {0, 1, 3, 16}) {
      const std::string label = hc.label() + " splits " + std::to_string(splits);
      const std::vector<uint16_t> got = dev.run(splits, PredecessorWrites::Anything);
      EXPECT_EQ(dev.run(splits, PredecessorWrites::Anything), got) << "second launch, " << label;
      EXPECT_EQ(dev.run(splits, PredecessorWrites::Anything, nullptr, true), got)
          << "with the step plan, " << label;
      expect_matches_cpu(got, want, label);
    }
  }
}

// The early cache reads on every edge of where position len - 1 can fall: the first, second and
// third chunk of a block (copied late, in the prologue) or a later one (copied by the chunk
// loop after the wait), the first or last token of a chunk or of a cache block, a 1-token
// sequence, the block that holds the end after 1, 3 or 16 splits; batch 1 and 5, groups 1, 4,
// 12, 16, head_dim 64 and 128, cache blocks of 16 and 12 tokens.
TEST(SplitDecodeAttention, NewRowAfterWaitMatchesCpuAndDefaultBits) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(77);
  const std::vector<std::vector<int>> len_sets = {
      {1}, {15}, {16}, {17}, {63}, {64}, {65}, {150}, {1025}, {4097},
      {1, 15, 16, 17, 63}, {64, 65, 150, 1025, 4097}};
  int checked = 0;
  for (int D : {64, 128})
    for (int group : {1, 4, 12, 16})
      for (int block_size : {16, 12}) {
        const int kv_heads = D == 128 && group == 12 ? 8 : 2;  // 96/8: GLM-4.5-Air
        for (const std::vector<int>& lens : len_sets) {
          const HostCase hc = make_case(D, group * kv_heads, kv_heads, lens, block_size, rng);
          ASSERT_EQ(split_decode_unsupported_reason(hc.sh), "");
          const std::vector<uint16_t> want = hc.cpu_reference();
          DevCase dev(hc);
          for (int splits : {0, 1, 3, 16}) {
            const std::string label = hc.label() + " splits " + std::to_string(splits);
            const std::vector<uint16_t> early = dev.run(splits, PredecessorWrites::QAndNewKvRow);
            EXPECT_EQ(early, dev.run(splits, PredecessorWrites::Anything))
                << "new-row mode vs default, " << label;
            EXPECT_EQ(early, dev.run(splits, PredecessorWrites::QAndNewKvRow, nullptr, true))
                << "with the step plan, " << label;
            expect_matches_cpu(early, want, label);
            ++checked;
          }
        }
      }
  EXPECT_EQ(checked, 2 * 4 * 2 * 12 * 4);
}

// A real predecessor: rope_and_write_kv (PDL) rotates q in place and writes each sequence's row
// of position len - 1, then the attention (PDL, new-row mode) runs on the same stream. Before
// each round q holds the unrotated values and those cache rows hold NaN, so reading either
// before the wait shows as a NaN output or a mismatch. The reference is the CPU attention over
// the final q and cache, and the default mode's bits on them.
TEST(SplitDecodeAttention, NewRowModeAfterRopeKvWrite) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(5);
  struct Case { int D, heads, kv_heads; std::vector<int> lens; int block_size; };
  const std::vector<Case> cases = {
      {128, 96, 8, {1025}, 16},                    // the measured GLM-4.5-Air step
      {128, 96, 8, {1, 17, 64, 1025, 300}, 16},
      {64, 16, 4, {65, 4097, 12, 150, 2}, 12},
  };
  cudaStream_t stream = nullptr;
  TETRA_CUDA_CHECK(cudaStreamCreate(&stream));  // blocking: ordered after the poison memsets
  for (const Case& c : cases) {
    HostCase hc = make_case(c.D, c.heads, c.kv_heads, c.lens, c.block_size, rng);
    const int S = hc.num_seqs();
    const int64_t row = hc.row_elems();
    // Partial NeoX rotary, as GLM-4.x; no padding sequence.
    const NewTokens nt(hc, c.D / 2, ops::RopeStyle::NeoX, -1, rng);
    const std::vector<uint16_t> q0 = hc.q, kc0 = hc.kc, vc0 = hc.vc;
    NewTokensDev d(nt);
    DevCase dev(hc);
    const int64_t num_slots = int64_t(hc.num_blocks) * hc.block_size;
    for (int splits : {0, 1, 16}) {
      const std::string label = hc.label() + " splits " + std::to_string(splits);
      std::vector<uint16_t> early;
      for (int round = 0; round < 10; ++round) {  // several tries at the timing
        dev.q.upload(q0);
        dev.k.upload(kc0);
        dev.v.upload(vc0);
        d.k_new.upload(nt.k_new);  // rope turns k in place
        dev.out.poison();
        TETRA_CUDA_CHECK(ops::cuda::rope_and_write_kv(
            dev.q.ptr(), d.k_new.ptr(), d.v_new.ptr(), row, d.pos.ptr(), d.slots.ptr(), S,
            d.inv.ptr(), nt.rs, num_slots, dev.k.ptr(), dev.v.ptr(), stream));
        dev.launch(splits, PredecessorWrites::QAndNewKvRow, stream);
        TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
        const std::vector<uint16_t> got = dev.out.download();
        if (round > 0) {
          EXPECT_EQ(got, early) << "round " << round << ", " << label;
        }
        early = got;
      }
      // The final state: q rotated, the new rows written (no NaN left), the rest untouched.
      hc.q = dev.q.download();
      hc.kc = dev.k.download();
      hc.vc = dev.v.download();
      ASSERT_NE(hc.q, q0) << label;
      for (int s = 0; s < S; ++s)
        ASSERT_NE(hc.kc[size_t(nt.slots[size_t(s)] * row)], 0x7FC0) << label << " seq " << s;
      expect_matches_cpu(early, hc.cpu_reference(), label);
      EXPECT_EQ(dev.run(splits, PredecessorWrites::Anything), early) << "default mode, " << label;
      EXPECT_TRUE(dev.k.guards_intact() && dev.v.guards_intact() && dev.q.guards_intact());
    }
  }
  TETRA_CUDA_CHECK(cudaStreamDestroy(stream));
}

// DecodeRope: the attention turns q and the new k row itself and stores the new rows, against
// rope_and_write_kv followed by the attention: the same output bits and the same caches, bit
// for bit, with q left as it was. NeoX partial (GLM-4.x) and full rotary, GPT-J, head_dim 64
// and 128, every split setting. The last sequence is graph padding (sequence 0's table and
// length, slot -1): it must write nothing (its output is not compared: the RoPE kernel path
// attends over sequence 0's new row there, the fused one over its own).
TEST(SplitDecodeAttention, RopeInsideEqualsRopeKvWriteThenAttention) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(7);
  struct Case { int D, heads, kv_heads; std::vector<int> lens; int block_size, rotary; bool neox; };
  const std::vector<Case> cases = {
      {128, 96, 8, {1025, 1}, 16, 64, true},  // GLM-4.5-Air: NeoX over half the dims
      {128, 32, 4, {1, 17, 64, 1025, 300, 1}, 16, 128, true},
      {64, 16, 4, {65, 4097, 12, 150, 2, 1}, 12, 64, false},
      {64, 16, 16, {33, 7, 1}, 16, 32, true},
      {128, 64, 8, {500, 1}, 32, 48, false},
  };
  for (const Case& c : cases) {
    HostCase hc = make_case(c.D, c.heads, c.kv_heads, c.lens, c.block_size, rng);
    const int S = hc.num_seqs();
    const int pad = S - 1;  // graph padding: sequence 0 again, no slot
    hc.lens[size_t(pad)] = hc.lens[0];
    for (int b = 0; b < hc.mb; ++b) hc.tables[size_t(pad) * hc.mb + b] = hc.tables[size_t(b)];
    ASSERT_EQ(split_decode_rope_unsupported_reason(hc.sh, c.rotary, c.neox), "");
    const int64_t row = hc.row_elems();
    const auto style = c.neox ? ops::RopeStyle::NeoX : ops::RopeStyle::GptJ;
    const NewTokens nt(hc, c.rotary, style, pad, rng);
    const std::vector<uint16_t> q0 = hc.q, kc0 = hc.kc, vc0 = hc.vc;
    NewTokensDev d(nt);
    DevCase dev(hc);
    const int64_t num_slots = int64_t(hc.num_blocks) * hc.block_size;
    const size_t out_row = size_t(hc.sh.n_heads) * c.D;
    auto body = [&](const std::vector<uint16_t>& out) {  // outputs of the real sequences
      return std::vector<uint16_t>(out.begin(), out.begin() + ptrdiff_t(size_t(pad) * out_row));
    };
    for (int splits : {0, 1, 16}) {
      const std::string label = hc.label() + " rotary " + std::to_string(c.rotary) +
                                (c.neox ? " neox" : " gptj") + " splits " + std::to_string(splits);
      dev.q.upload(q0);
      dev.k.upload(kc0);
      dev.v.upload(vc0);
      d.k_new.upload(nt.k_new);
      TETRA_CUDA_CHECK(ops::cuda::rope_and_write_kv(
          dev.q.ptr(), d.k_new.ptr(), d.v_new.ptr(), row, d.pos.ptr(), d.slots.ptr(), S,
          d.inv.ptr(), nt.rs, num_slots, dev.k.ptr(), dev.v.ptr(), nullptr));
      const std::vector<uint16_t> want = dev.run(splits, PredecessorWrites::QAndNewKvRow);
      const std::vector<uint16_t> want_k = dev.k.download(), want_v = dev.v.download();
      for (int s = 0; s < pad; ++s)
        ASSERT_NE(want_k[size_t(nt.slots[size_t(s)] * row)], 0x7FC0) << label << " seq " << s;

      dev.q.upload(q0);
      dev.k.upload(kc0);
      dev.v.upload(vc0);
      d.k_new.upload(nt.k_new);
      DecodeRope r;
      r.k_new = d.k_new.ptr();
      r.v_new = d.v_new.ptr();
      r.k_stride = r.v_stride = row;
      r.positions = d.pos.ptr();
      r.slots = d.slots.ptr();
      r.num_slots = num_slots;
      r.k_cache = dev.k.ptr();
      r.v_cache = dev.v.ptr();
      r.inv_freq = d.inv.ptr();
      r.rotary_dim = c.rotary;
      r.neox = c.neox;
      // Runs 0-1 read the lengths and tables, 2-3 the step plan; runs after the first find their
      // rows already written.
      for (int rep = 0; rep < 4; ++rep) {
        const int n = rep < 2 ? splits : dev.upload_plan(splits);
        dev.out.poison();
        TETRA_CUDA_CHECK(split_decode_attention(dev.q.ptr(), dev.kv(), S, hc.sh, dev.out.ptr(),
                                                nullptr, n, PredecessorWrites::Anything, &r,
                                                rep < 2 ? nullptr : dev.plan->ptr()));
        TETRA_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(body(dev.out.download()), body(want)) << label << " run " << rep;
        EXPECT_EQ(dev.k.download(), want_k) << label << " k cache, run " << rep;
        EXPECT_EQ(dev.v.download(), want_v) << label << " v cache, run " << rep;
        EXPECT_EQ(dev.q.download(), q0) << label << " q must stay un-rotated";
        EXPECT_TRUE(dev.k.guards_intact() && dev.v.guards_intact() && dev.out.guards_intact())
            << label;
      }
    }
  }
}

TEST(SplitDecodeAttention, RopeInsideRefusesPairsSplitAcrossThreads) {
  ops::AttentionShape sh;
  sh.n_heads = 16;
  sh.n_kv_heads = 4;
  sh.head_dim = 128;
  EXPECT_EQ(split_decode_rope_unsupported_reason(sh, 64, true), "");
  EXPECT_EQ(split_decode_rope_unsupported_reason(sh, 16, false), "");
  EXPECT_NE(split_decode_rope_unsupported_reason(sh, 48, true).find("NeoX rotary_dim 48"),
            std::string::npos);
  EXPECT_NE(split_decode_rope_unsupported_reason(sh, 24, false).find("GPT-J"), std::string::npos);
  EXPECT_NE(split_decode_rope_unsupported_reason(sh, 256, true), "");
}

// The split count the model picks from the longest context: never more than without a length,
// never fewer for a longer context, one split for a one-token context, and the count without a
// length once the context is long (at batch 1, GLM-4.5-Air's heads).
TEST(SplitDecodeAttention, AutoSplitsGrowWithTheContext) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  ops::AttentionShape sh;
  sh.n_heads = 96;
  sh.n_kv_heads = 8;
  sh.head_dim = 128;
  for (int seqs : {1, 3, 8, 64}) {
    const int unknown = split_decode_auto_splits(seqs, sh);
    int prev = 0;
    for (int len = 1; len <= 16384; len *= 2) {
      const int n = split_decode_auto_splits(seqs, sh, len);
      EXPECT_GE(n, prev) << seqs << " seqs, len " << len;
      EXPECT_LE(n, unknown) << seqs << " seqs, len " << len;
      EXPECT_EQ(n & (n - 1), 0) << "a power of two";
      prev = n;
    }
    EXPECT_EQ(split_decode_auto_splits(seqs, sh, 1), 1);
    EXPECT_EQ(prev, unknown) << seqs << " seqs at 16384 tokens";
  }
}

TEST(SplitDecodeAttention, RefusesUnsupportedShapes) {
  ops::AttentionShape sh;
  sh.n_heads = 8;
  sh.n_kv_heads = 8;
  sh.head_dim = 32;
  EXPECT_NE(split_decode_unsupported_reason(sh), "");
  sh.head_dim = 128;
  sh.n_heads = 34 * 8 / 2;  // group 17
  sh.n_kv_heads = 8;
  EXPECT_NE(split_decode_unsupported_reason(sh), "");
  sh.n_heads = 96;  // supported, but more splits than the largest cluster
  EXPECT_EQ(split_decode_unsupported_reason(sh), "");
  ops::PagedKv kv;
  EXPECT_THROW(split_decode_attention(nullptr, kv, 0, sh, nullptr, nullptr, kMaxSplits + 1),
               Error);
}

}  // namespace
}  // namespace tetra::model::cuda
