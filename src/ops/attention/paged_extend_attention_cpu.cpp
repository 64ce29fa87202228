// CPU twin of the extend attention: one (token, head) at a time, two passes (max, then the
// weighted sum), the same float order as prefill/decode attention in attention_cpu.cpp, so a
// chunked prefill reproduces a one-shot prefill bit for bit on the CPU backend.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/parallel.h"
#include "ops/attention/paged_extend_attention_cpu.h"

namespace tetra::ops {

void paged_extend_attention_cpu(const uint16_t* q, const int32_t* cu_seqlens, int num_seqs,
                                const PagedKv& kv, const AttentionShape& s, uint16_t* out) {
  check_attention_shape(s);
  TETRA_CHECK(kv.block_size > 0 && kv.num_blocks > 0 && kv.max_blocks_per_seq > 0,
              "extend attention: block_size ", kv.block_size, " num_blocks ", kv.num_blocks);
  TETRA_CHECK(num_seqs >= 0 && cu_seqlens[0] == 0, "extend attention: cu_seqlens must start at 0");
  for (int b = 0; b < num_seqs; ++b) {
    const int n_new = cu_seqlens[b + 1] - cu_seqlens[b];
    const int len = kv.seq_lens[b];
    TETRA_CHECK(n_new >= 0, "extend attention: cu_seqlens decreases at ", b);
    TETRA_CHECK(len >= n_new && len <= int64_t(kv.max_blocks_per_seq) * kv.block_size,
                "extend attention: sequence ", b, " holds ", len, " tokens for ", n_new, " new ones");
    for (int j = 0; j < (len + kv.block_size - 1) / kv.block_size; ++j) {
      const int32_t blk = kv.block_tables[int64_t(b) * kv.max_blocks_per_seq + j];
      TETRA_CHECK(blk >= 0 && blk < kv.num_blocks, "extend attention: block ", blk, " of sequence ", b);
    }
  }
  const int T = cu_seqlens[num_seqs];
  const int D = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const int64_t token_elems = int64_t(s.n_kv_heads) * D;
  std::vector<int> seq_of(static_cast<size_t>(T));  // [T] sequence of each new token
  for (int b = 0; b < num_seqs; ++b)
    for (int t = cu_seqlens[b]; t < cu_seqlens[b + 1]; ++t) seq_of[size_t(t)] = b;
  parallel_for(int64_t(T) * s.n_heads, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc;  // [keys], [D]
    for (int64_t i = begin; i < end; ++i) {
      const int t = int(i / s.n_heads), h = int(i % s.n_heads), kh = h / group;
      const int b = seq_of[size_t(t)];
      const int n_new = cu_seqlens[b + 1] - cu_seqlens[b];
      const int pos = kv.seq_lens[b] - n_new + (t - cu_seqlens[b]);
      const int n = pos + 1;  // keys 0 .. pos
      const int32_t* table = kv.block_tables + int64_t(b) * kv.max_blocks_per_seq;
      auto row = [&](const uint16_t* cache, int j) {
        const int64_t slot = int64_t(table[j / kv.block_size]) * kv.block_size + j % kv.block_size;
        return cache + slot * token_elems + int64_t(kh) * D;
      };
      const uint16_t* qr = q + t * s.q_step() + int64_t(h) * D;
      scores.resize(size_t(n));
      float mx = -INFINITY;
      for (int j = 0; j < n; ++j) {
        const uint16_t* kr = row(kv.k_cache, j);
        float dot = 0.0f;
        for (int d = 0; d < D; ++d) dot += bf16_to_float(qr[d]) * bf16_to_float(kr[d]);
        scores[size_t(j)] = dot * s.scale;
        mx = std::max(mx, scores[size_t(j)]);
      }
      acc.assign(size_t(D), 0.0f);
      float denom = 0.0f;
      for (int j = 0; j < n; ++j) {
        const float p = std::exp(scores[size_t(j)] - mx);
        denom += p;
        const uint16_t* vr = row(kv.v_cache, j);
        for (int d = 0; d < D; ++d) acc[size_t(d)] += p * bf16_to_float(vr[d]);
      }
      uint16_t* o = out + i * D;
      for (int d = 0; d < D; ++d) o[d] = float_to_bf16(acc[size_t(d)] / denom);
    }
  });
}

}  // namespace tetra::ops
