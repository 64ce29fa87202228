// CPU attention: one (token, head) at a time, float math, two passes (max, then weighted sum).
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/parallel.h"
#include "ops/attention/attention.h"

namespace tetra::ops {

void check_attention_shape(const AttentionShape& s) {
  TETRA_CHECK(s.n_heads > 0 && s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0,
              "attention: n_heads ", s.n_heads, " must be a multiple of n_kv_heads ", s.n_kv_heads);
  TETRA_CHECK(s.head_dim > 0, "attention: head_dim ", s.head_dim);
  TETRA_CHECK(s.scale > 0.0f && std::isfinite(s.scale), "attention: scale ", s.scale);
  TETRA_CHECK(s.q_step() >= int64_t(s.n_heads) * s.head_dim, "attention: q_stride ", s.q_stride);
  TETRA_CHECK(s.kv_step() >= int64_t(s.n_kv_heads) * s.head_dim, "attention: kv_stride ",
              s.kv_stride);
}

namespace {

// out [D] = softmax_j(scale * q.k_j) v_j over n keys; key(j)/value(j) give [D] bf16 rows.
template <typename KeyFn, typename ValueFn>
void attend(const uint16_t* q, int n, int D, float scale, KeyFn key, ValueFn value,
            uint16_t* out, std::vector<float>& scores, std::vector<float>& acc) {
  if (n == 0) {
    std::memset(out, 0, sizeof(uint16_t) * D);
    return;
  }
  scores.resize(n);
  float mx = -INFINITY;
  for (int j = 0; j < n; ++j) {
    const uint16_t* kr = key(j);
    float dot = 0.0f;
    for (int d = 0; d < D; ++d) dot += bf16_to_float(q[d]) * bf16_to_float(kr[d]);
    scores[j] = dot * scale;
    mx = std::max(mx, scores[j]);
  }
  acc.assign(D, 0.0f);
  float denom = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float p = std::exp(scores[j] - mx);
    denom += p;
    const uint16_t* vr = value(j);
    for (int d = 0; d < D; ++d) acc[d] += p * bf16_to_float(vr[d]);
  }
  for (int d = 0; d < D; ++d) out[d] = float_to_bf16(acc[d] / denom);
}

}  // namespace

void prefill_attention_cpu(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                           const int32_t* cu_seqlens, int num_seqs, const AttentionShape& s,
                           uint16_t* out) {
  check_attention_shape(s);
  TETRA_CHECK(num_seqs >= 0 && cu_seqlens[0] == 0, "prefill: cu_seqlens must start at 0");
  for (int b = 0; b < num_seqs; ++b)
    TETRA_CHECK(cu_seqlens[b + 1] >= cu_seqlens[b], "prefill: cu_seqlens decreases at ", b);
  const int T = cu_seqlens[num_seqs];
  const int D = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const int64_t qs = s.q_step(), kvs = s.kv_step();
  // seq_of[t]: the sequence token t belongs to. [T]
  std::vector<int> seq_of(T);
  for (int b = 0; b < num_seqs; ++b)
    for (int t = cu_seqlens[b]; t < cu_seqlens[b + 1]; ++t) seq_of[t] = b;
  parallel_for(int64_t(T) * s.n_heads, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc;
    for (int64_t i = begin; i < end; ++i) {
      const int t = int(i / s.n_heads), h = int(i % s.n_heads), kh = h / group;
      const int start = cu_seqlens[seq_of[t]];
      auto key = [&](int j) { return k + (start + j) * kvs + int64_t(kh) * D; };
      auto value = [&](int j) { return v + (start + j) * kvs + int64_t(kh) * D; };
      attend(q + t * qs + int64_t(h) * D, t - start + 1, D, s.scale, key, value,
             out + i * D, scores, acc);
    }
  });
}

void paged_decode_attention_cpu(const uint16_t* q, const PagedKv& kv, int num_seqs,
                                const AttentionShape& s, uint16_t* out) {
  check_attention_shape(s);
  TETRA_CHECK(kv.block_size > 0 && kv.num_blocks > 0, "decode: block_size ", kv.block_size,
              " num_blocks ", kv.num_blocks);
  const int D = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const int64_t token_elems = int64_t(s.n_kv_heads) * D;
  for (int b = 0; b < num_seqs; ++b) {
    const int len = kv.seq_lens[b];
    TETRA_CHECK(len >= 0 && len <= int64_t(kv.max_blocks_per_seq) * kv.block_size,
                "decode: seq_len ", len, " of sequence ", b);
    for (int j = 0; j < (len + kv.block_size - 1) / kv.block_size; ++j) {
      const int32_t blk = kv.block_tables[int64_t(b) * kv.max_blocks_per_seq + j];
      TETRA_CHECK(blk >= 0 && blk < kv.num_blocks, "decode: block ", blk, " of sequence ", b);
    }
  }
  parallel_for(int64_t(num_seqs) * s.n_heads, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc;
    for (int64_t i = begin; i < end; ++i) {
      const int b = int(i / s.n_heads), h = int(i % s.n_heads), kh = h / group;
      const int32_t* table = kv.block_tables + int64_t(b) * kv.max_blocks_per_seq;
      auto row = [&](const uint16_t* cache, int j) {
        const int64_t slot = int64_t(table[j / kv.block_size]) * kv.block_size + j % kv.block_size;
        return cache + slot * token_elems + int64_t(kh) * D;
      };
      auto key = [&](int j) { return row(kv.k_cache, j); };
      auto value = [&](int j) { return row(kv.v_cache, j); };
      attend(q + b * s.q_step() + int64_t(h) * D, kv.seq_lens[b], D, s.scale, key, value,
             out + i * D, scores, acc);
    }
  });
}

void write_kv_cache_cpu(const uint16_t* k, const uint16_t* v, const int64_t* slots, int T,
                        const AttentionShape& s, int num_blocks, int block_size, uint16_t* k_cache,
                        uint16_t* v_cache) {
  TETRA_CHECK(s.n_kv_heads > 0 && s.head_dim > 0 && block_size > 0, "kv cache write: shape");
  const int64_t token_elems = int64_t(s.n_kv_heads) * s.head_dim;
  const int64_t num_slots = int64_t(num_blocks) * block_size;
  for (int t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    TETRA_CHECK(slots[t] < num_slots, "kv cache write: slot ", slots[t], " of token ", t,
                " past the cache's ", num_slots);
    std::memcpy(k_cache + slots[t] * token_elems, k + t * s.kv_step(), token_elems * 2);
    std::memcpy(v_cache + slots[t] * token_elems, v + t * s.kv_step(), token_elems * 2);
  }
}

void copy_kv_blocks_cpu(uint16_t* k_cache, uint16_t* v_cache, const int32_t* pairs, int n,
                        int num_blocks, int64_t block_elems) {
  TETRA_CHECK(n >= 0 && block_elems > 0, "kv block copy: n=", n, " block_elems=", block_elems);
  for (int i = 0; i < n; ++i) {
    const int32_t src = pairs[2 * i], dst = pairs[2 * i + 1];
    TETRA_CHECK(src >= 0 && src < num_blocks && dst >= 0 && dst < num_blocks,
                "kv block copy: pair ", i, " (", src, " -> ", dst, ") outside ", num_blocks, " blocks");
    std::memcpy(k_cache + dst * block_elems, k_cache + src * block_elems, block_elems * 2);
    if (v_cache != nullptr)
      std::memcpy(v_cache + dst * block_elems, v_cache + src * block_elems, block_elems * 2);
  }
}

}  // namespace tetra::ops
