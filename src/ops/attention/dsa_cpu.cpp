// CPU reference of the DSA indexer ops (ops/attention/dsa.h): float32 math on bf16 inputs,
// the rounding points of the transformers bf16 model (normed and turned keys and queries in
// bf16, scores in float), a stable selection (ties to the lower position).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/parallel.h"
#include "ops/attention/dsa.h"

namespace tetra::ops {

void check_dsa_shape(const DsaShape& s) {
  TETRA_CHECK(s.n_heads > 0, "dsa: index_n_heads ", s.n_heads);
  TETRA_CHECK(s.head_dim > 0, "dsa: index_head_dim ", s.head_dim);
  TETRA_CHECK(s.rope_dim > 0 && s.rope_dim % 2 == 0 && s.rope_dim <= s.head_dim,
              "dsa: rotary dims ", s.rope_dim, " must be even and <= index_head_dim ", s.head_dim);
  TETRA_CHECK(s.topk > 0, "dsa: index_topk ", s.topk);
}

void dsa_index_keys_cpu(const uint16_t* wk_out, const uint16_t* ln_w, const uint16_t* ln_b,
                        float eps, const int32_t* positions, const int64_t* slots, int T,
                        const float* inv_freq, const DsaShape& s, int64_t num_slots,
                        uint16_t* key_cache) {
  check_dsa_shape(s);
  TETRA_CHECK(T >= 0 && eps > 0, "dsa index keys: T ", T, " eps ", eps);
  const int D = s.head_dim;
  std::vector<float> k(static_cast<size_t>(D));  // [D]
  for (int t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    TETRA_CHECK(slots[t] < num_slots, "dsa index keys: slot ", slots[t], " of token ", t,
                " outside the cache's ", num_slots);
    TETRA_CHECK(positions[t] >= 0, "dsa index keys: position ", positions[t], " of token ", t);
    const uint16_t* x = wk_out + int64_t(t) * D;
    double mean = 0, var = 0;
    for (int i = 0; i < D; ++i) mean += bf16_to_float(x[i]);
    mean /= D;
    for (int i = 0; i < D; ++i) {
      const double d = bf16_to_float(x[i]) - mean;
      var += d * d;
    }
    const float inv_std = float(1.0 / std::sqrt(var / D + double(eps)));
    for (int i = 0; i < D; ++i) {
      const float n = (bf16_to_float(x[i]) - float(mean)) * inv_std;
      k[size_t(i)] = bf16_to_float(float_to_bf16(n * bf16_to_float(ln_w[i]) + bf16_to_float(ln_b[i])));
    }
    rope_rotate_f32(k.data(), s.rope_dim, float(positions[t]), inv_freq, s.style);
    uint16_t* dst = key_cache + slots[t] * D;
    for (int i = 0; i < D; ++i) dst[i] = float_to_bf16(k[size_t(i)]);
  }
}

void dsa_select_cpu(const uint16_t* q, const uint16_t* weights, const uint16_t* key_cache,
                    int64_t num_slots, const int32_t* cu_seqlens, int S, const int32_t* positions,
                    const MlaKeys& keys, const float* inv_freq, const DsaShape& s,
                    int32_t* selected) {
  check_dsa_shape(s);
  const int Hi = s.n_heads, D = s.head_dim;
  const std::vector<int> seq_of =
      check_mla_keys(keys, num_slots, cu_seqlens, S, positions, "dsa select");  // [T]
  const int T = cu_seqlens[S];
  const float scale = float(1.0 / std::sqrt(double(D)));
  const float head_weight = float(1.0 / std::sqrt(double(Hi)));
  parallel_for(T, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qt(size_t(Hi) * D), w(static_cast<size_t>(Hi)), score;  // [Hi, D], [Hi]
    std::vector<int32_t> order;
    for (int64_t t = begin; t < end; ++t) {
      const int b = seq_of[size_t(t)], n = positions[t] + 1;
      for (int h = 0; h < Hi; ++h) {
        float* qh = &qt[size_t(h) * D];
        for (int i = 0; i < D; ++i) qh[i] = bf16_to_float(q[(t * Hi + h) * D + i]);
        rope_rotate_f32(qh, s.rope_dim, float(positions[t]), inv_freq, s.style);
        for (int i = 0; i < D; ++i) qh[i] = bf16_to_float(float_to_bf16(qh[i]));
        w[size_t(h)] = bf16_to_float(weights[t * Hi + h]) * head_weight;
      }
      score.assign(size_t(n), 0.0f);
      for (int j = 0; j < n; ++j) {
        const uint16_t* k = key_cache + mla_key_slot(keys, cu_seqlens, b, j) * D;
        float sum = 0.0f;
        for (int h = 0; h < Hi; ++h) {
          const float* qh = &qt[size_t(h) * D];
          float dot = 0.0f;
          for (int i = 0; i < D; ++i) dot += qh[i] * bf16_to_float(k[i]);
          sum += std::max(dot * scale, 0.0f) * w[size_t(h)];
        }
        score[size_t(j)] = sum;
      }
      const int keep = std::min(s.topk, n);
      order.resize(size_t(n));
      std::iota(order.begin(), order.end(), 0);
      // The `keep` best, ties to the lower position; then in position order.
      std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int32_t a, int32_t c) {
        return score[size_t(a)] != score[size_t(c)] ? score[size_t(a)] > score[size_t(c)] : a < c;
      });
      std::sort(order.begin(), order.begin() + keep);
      std::copy(order.begin(), order.begin() + keep, selected + t * s.topk);
    }
  });
}

}  // namespace tetra::ops
