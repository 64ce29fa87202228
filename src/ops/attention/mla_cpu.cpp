// CPU reference of the absorbed MLA ops (ops/attention/mla.h): plain loops in float32, one
// rounding to bf16 per output, attention in two passes (max, then the weighted sum).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/parallel.h"
#include "ops/attention/mla.h"

namespace tetra::ops {

void check_mla_shape(const MlaShape& s) {
  TETRA_CHECK(s.n_heads > 0, "mla: n_heads ", s.n_heads);
  TETRA_CHECK(s.kv_lora > 0, "mla: kv_lora_rank ", s.kv_lora);
  TETRA_CHECK(s.rope_dim > 0 && s.rope_dim % 2 == 0, "mla: qk_rope_head_dim ", s.rope_dim,
              " must be even and > 0");
  TETRA_CHECK(s.nope_dim > 0, "mla: qk_nope_head_dim ", s.nope_dim);
  TETRA_CHECK(s.v_dim > 0, "mla: v_head_dim ", s.v_dim);
  TETRA_CHECK(std::isfinite(s.scale) && s.scale > 0, "mla: softmax scale ", s.scale);
}

void mla_cache_write_cpu(const uint16_t* kv_a, const uint16_t* norm_w, float eps,
                         const int32_t* positions, const int64_t* slots, int T,
                         const float* inv_freq, const MlaShape& s, int64_t num_slots,
                         uint16_t* cache) {
  check_mla_shape(s);
  TETRA_CHECK(T >= 0 && eps > 0, "mla cache write: T ", T, " eps ", eps);
  const int Dl = s.kv_lora, Dr = s.rope_dim, row = s.row();
  std::vector<float> pe(static_cast<size_t>(Dr));  // [Dr]
  for (int t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    TETRA_CHECK(slots[t] < num_slots, "mla cache write: slot ", slots[t], " of token ", t,
                " outside the cache's ", num_slots);
    TETRA_CHECK(positions[t] >= 0, "mla cache write: position ", positions[t], " of token ", t);
    const uint16_t* x = kv_a + int64_t(t) * row;
    uint16_t* dst = cache + slots[t] * row;
    double ss = 0;
    for (int c = 0; c < Dl; ++c) ss += double(bf16_to_float(x[c])) * bf16_to_float(x[c]);
    const float inv_rms = float(1.0 / std::sqrt(ss / Dl + double(eps)));
    for (int c = 0; c < Dl; ++c)
      dst[c] = float_to_bf16(bf16_to_float(x[c]) * inv_rms * bf16_to_float(norm_w[c]));
    for (int i = 0; i < Dr; ++i) pe[size_t(i)] = bf16_to_float(x[Dl + i]);
    rope_rotate_f32(pe.data(), Dr, float(positions[t]), inv_freq, s.style);
    for (int i = 0; i < Dr; ++i) dst[Dl + i] = float_to_bf16(pe[size_t(i)]);
  }
}

void mla_absorb_q_cpu(const uint16_t* q, const uint16_t* kv_b, const int32_t* positions, int T,
                      const float* inv_freq, const MlaShape& s, uint16_t* q_abs) {
  check_mla_shape(s);
  TETRA_CHECK(T >= 0, "mla absorb q: T ", T);
  const int H = s.n_heads, Dl = s.kv_lora, Dr = s.rope_dim, nope = s.nope_dim;
  parallel_for(int64_t(T) * H, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(static_cast<size_t>(Dl)), pe(static_cast<size_t>(Dr));
    for (int64_t th = begin; th < end; ++th) {
      const int t = int(th / H), h = int(th % H);
      const uint16_t* qh = q + th * s.q_head();
      uint16_t* out = q_abs + th * s.row();
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int n = 0; n < nope; ++n) {
        const float qn = bf16_to_float(qh[n]);
        const uint16_t* w = kv_b + (int64_t(h) * s.kv_b_rows_per_head() + n) * Dl;
        for (int c = 0; c < Dl; ++c) acc[size_t(c)] += qn * bf16_to_float(w[c]);
      }
      for (int c = 0; c < Dl; ++c) out[c] = float_to_bf16(acc[size_t(c)]);
      TETRA_CHECK(positions[t] >= 0, "mla absorb q: position ", positions[t], " of token ", t);
      for (int i = 0; i < Dr; ++i) pe[size_t(i)] = bf16_to_float(qh[nope + i]);
      rope_rotate_f32(pe.data(), Dr, float(positions[t]), inv_freq, s.style);
      for (int i = 0; i < Dr; ++i) out[Dl + i] = float_to_bf16(pe[size_t(i)]);
    }
  });
}

std::vector<int> check_mla_keys(const MlaKeys& keys, int64_t num_slots, const int32_t* cu_seqlens,
                                int S, const int32_t* positions, const char* op) {
  TETRA_CHECK(S >= 0 && cu_seqlens[0] == 0, op, ": cu_seqlens must start at 0");
  TETRA_CHECK(keys.step_slots != nullptr ||
                  (keys.block_tables != nullptr && keys.block_size > 0 &&
                   keys.max_blocks_per_seq > 0),
              op, ": keys need step slots or block tables");
  std::vector<int> seq_of(static_cast<size_t>(cu_seqlens[S]));  // [T] sequence of each token
  for (int b = 0; b < S; ++b) {
    TETRA_CHECK(cu_seqlens[b + 1] >= cu_seqlens[b], op, ": cu_seqlens decreases at ", b);
    for (int t = cu_seqlens[b]; t < cu_seqlens[b + 1]; ++t) {
      seq_of[size_t(t)] = b;
      const int n = positions[t] + 1;  // keys of token t
      TETRA_CHECK(n >= 1, op, ": position ", positions[t], " of token ", t);
      if (keys.step_slots)
        TETRA_CHECK(n <= cu_seqlens[b + 1] - cu_seqlens[b], op, ": token ", t, " at position ",
                    positions[t], " past its sequence's ", cu_seqlens[b + 1] - cu_seqlens[b],
                    " step tokens");
      else
        TETRA_CHECK(n <= int64_t(keys.max_blocks_per_seq) * keys.block_size, op, ": token ", t,
                    " at position ", positions[t], " past the block table");
      for (int j = 0; j < n; ++j) {
        const int64_t slot = mla_key_slot(keys, cu_seqlens, b, j);
        TETRA_CHECK(slot >= 0 && slot < num_slots, op, ": key ", j, " of sequence ", b,
                    " at slot ", slot, " outside the cache's ", num_slots);
      }
    }
  }
  return seq_of;
}

void mla_attention_cpu(const uint16_t* q_abs, const uint16_t* cache, int64_t num_slots,
                       const int32_t* cu_seqlens, int S, const int32_t* positions,
                       const MlaKeys& keys, const MlaShape& s, uint16_t* out_lat) {
  check_mla_shape(s);
  const int H = s.n_heads, Dl = s.kv_lora, row = s.row();
  const std::vector<int> seq_of =
      check_mla_keys(keys, num_slots, cu_seqlens, S, positions, "mla attention");  // [T]
  const int T = int(seq_of.size());
  // Token t's i-th key: position i, or with a DSA selection the i-th selected position.
  const bool sparse = keys.selected != nullptr;
  TETRA_CHECK(!sparse || keys.selected_stride > 0, "mla attention: a selection needs its stride");
  auto key_count = [&](int t) {
    return sparse ? std::min(keys.selected_stride, positions[t] + 1) : positions[t] + 1;
  };
  auto key_pos = [&](int t, int i) {
    return sparse ? keys.selected[int64_t(t) * keys.selected_stride + i] : i;
  };
  for (int t = 0; sparse && t < T; ++t)
    for (int i = 0; i < key_count(t); ++i)
      TETRA_CHECK(key_pos(t, i) >= 0 && key_pos(t, i) <= positions[t], "mla attention: token ", t,
                  " at position ", positions[t], " selects key position ", key_pos(t, i));
  parallel_for(int64_t(T) * H, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> q(static_cast<size_t>(row)), scores, acc(static_cast<size_t>(Dl));
    for (int64_t th = begin; th < end; ++th) {
      const int t = int(th / H), b = seq_of[size_t(t)];
      const int n = key_count(t);
      for (int d = 0; d < row; ++d) q[size_t(d)] = bf16_to_float(q_abs[th * row + d]);
      scores.assign(size_t(n), 0.0f);
      float mx = -INFINITY;
      for (int j = 0; j < n; ++j) {
        const uint16_t* k = cache + mla_key_slot(keys, cu_seqlens, b, key_pos(t, j)) * row;
        float dot = 0.0f;
        for (int d = 0; d < row; ++d) dot += q[size_t(d)] * bf16_to_float(k[d]);
        scores[size_t(j)] = dot * s.scale;
        mx = std::max(mx, scores[size_t(j)]);
      }
      float sum = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int j = 0; j < n; ++j) {
        const float p = std::exp(scores[size_t(j)] - mx);
        sum += p;
        const uint16_t* k = cache + mla_key_slot(keys, cu_seqlens, b, key_pos(t, j)) * row;
        for (int c = 0; c < Dl; ++c) acc[size_t(c)] += p * bf16_to_float(k[c]);
      }
      for (int c = 0; c < Dl; ++c) out_lat[th * Dl + c] = float_to_bf16(acc[size_t(c)] / sum);
    }
  });
}

void mla_up_v_cpu(const uint16_t* out_lat, const uint16_t* kv_b, int T, const MlaShape& s,
                  uint16_t* out) {
  check_mla_shape(s);
  TETRA_CHECK(T >= 0, "mla up v: T ", T);
  const int H = s.n_heads, Dl = s.kv_lora, V = s.v_dim;
  parallel_for(int64_t(T) * H, 8, [&](int64_t begin, int64_t end) {
    for (int64_t th = begin; th < end; ++th) {
      const int h = int(th % H);
      const uint16_t* x = out_lat + th * Dl;
      for (int j = 0; j < V; ++j) {
        const uint16_t* w = kv_b + (int64_t(h) * s.kv_b_rows_per_head() + s.nope_dim + j) * Dl;
        float acc = 0.0f;
        for (int c = 0; c < Dl; ++c) acc += bf16_to_float(x[c]) * bf16_to_float(w[c]);
        out[th * V + j] = float_to_bf16(acc);
      }
    }
  });
}

}  // namespace tetra::ops
