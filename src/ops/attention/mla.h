// Multi-head latent attention (MLA: DeepSeek-V3, GLM-5) with the key/value up-projection
// absorbed, CPU reference. The cache holds one row per token, shared by all heads:
//   cache row [Dl + Dr] = [ rmsnorm(c) * w_kv | rope(k_pe) ],  c, k_pe = kv_a_proj_with_mqa(x)
// and kv_b_proj [H * (nope + v), Dl] holds per head h the rows W_uk[h] [nope, Dl] then
// W_uv[h] [v, Dl]. Since k_nope[h] = W_uk[h] c and v[h] = W_uv[h] c,
//   q_nope . k_nope = (q_nope W_uk[h]) . c          (q absorbed into the latent space)
//   sum_j p_j v_j[h] = W_uv[h] (sum_j p_j c_j)       (values read as latents, lifted after)
// so attention is multi-query over the cached rows: an absorbed query [Dl + Dr] per head, keys
// the whole rows, values their first Dl. The ops, in the order a layer runs them:
//   mla_cache_write: kv_a rows -> cache rows (latent RMSNorm, RoPE of k_pe) at the token slots;
//   mla_absorb_q:    q [T, H, nope + Dr] -> q_abs [T, H, Dl + Dr] (W_uk, RoPE of q_pe);
//   mla_attention:   q_abs -> out_lat [T, H, Dl], causal over the sequence's cached rows;
//   mla_up_v:        out_lat -> out [T, H, v] (W_uv): o_proj's input.
// Every op computes in float32 from bf16 inputs and rounds its output to bf16 once. The CUDA
// twins are ops/attention/mla_cuda.h. The sums equal the unabsorbed form's up to rounding
// (transformers rounds k_nope and v to bf16 instead of q_abs and out_lat).
#pragma once
#include <cstdint>
#include <vector>

#include "ops/rope/rope.h"

namespace tetra::ops {

struct MlaShape {
  int n_heads = 0;   // H
  int kv_lora = 0;   // Dl: the latent width (the values)
  int rope_dim = 0;  // Dr: the shared rotary key's width (all of it rotates)
  int nope_dim = 0;  // the non-rotary part of a q/k head
  int v_dim = 0;     // value head dim
  float scale = 0;   // softmax scale: (nope + Dr)^-0.5, times the YaRN mscale^2 where it applies
  RopeStyle style = RopeStyle::GptJ;  // pairing of the rotary dims (config rope_interleave)

  int row() const { return kv_lora + rope_dim; }    // cache row = absorbed q head
  int q_head() const { return nope_dim + rope_dim; }  // q head before absorption
  int kv_b_rows_per_head() const { return nope_dim + v_dim; }
};

// Refuses inconsistent shapes with a tetra::Error naming the field.
void check_mla_shape(const MlaShape& s);

// Where key j (position j) of sequence s lives in the cache, for the keys attention reads:
//   step_slots set:   slot step_slots[cu_seqlens[s] + j] (a prefill without a cached prefix:
//                     the sequence's keys are this step's own tokens, just written);
//   otherwise paged:  slot block_tables[s * max_blocks_per_seq + j / block_size] * block_size
//                     + j % block_size (decode, prefill continuing a cached prefix).
// DSA (ops/attention/dsa.h): with `selected` set, token t reads only the keys at positions
// selected[t * selected_stride + i], i < min(selected_stride, positions[t] + 1), wherever those
// live (step slots or block tables); without it, every key 0 .. positions[t].
struct MlaKeys {
  const int64_t* step_slots = nullptr;      // [T]
  const int32_t* block_tables = nullptr;    // [S, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  int block_size = 0;
  const int32_t* selected = nullptr;        // [T, selected_stride] key positions (DSA) or null
  int selected_stride = 0;                  // index_topk
};

// Host side (the CPU twins): checks that every token's keys 0 .. positions[t] lie in its
// sequence's step tokens or block table, and in [0, num_slots); returns each token's sequence
// [T]. Errors name `op`.
std::vector<int> check_mla_keys(const MlaKeys& keys, int64_t num_slots, const int32_t* cu_seqlens,
                                int S, const int32_t* positions, const char* op);

// Host side: the cache slot of sequence s's key j (no checks; the ops check the keys).
inline int64_t mla_key_slot(const MlaKeys& k, const int32_t* cu_seqlens, int s, int j) {
  if (k.step_slots) return k.step_slots[cu_seqlens[s] + j];
  const int32_t blk = k.block_tables[int64_t(s) * k.max_blocks_per_seq + j / k.block_size];
  return int64_t(blk) * k.block_size + j % k.block_size;
}

// For every token t with slots[t] >= 0 (a negative slot writes nothing):
//   cache[slots[t]] = [ bf16(rmsnorm(kv_a[t, :Dl]) * norm_w) | bf16(rope(kv_a[t, Dl:], positions[t])) ]
// kv_a [T, Dl + Dr] bf16, norm_w [Dl] bf16, inv_freq [Dr / 2], cache [num_slots, Dl + Dr] bf16.
void mla_cache_write_cpu(const uint16_t* kv_a, const uint16_t* norm_w, float eps,
                         const int32_t* positions, const int64_t* slots, int T,
                         const float* inv_freq, const MlaShape& s, int64_t num_slots,
                         uint16_t* cache);

// q_abs[t, h, :Dl] = bf16(sum_n q[t, h, n] * kv_b[h * (nope + v) + n, :]) for n < nope;
// q_abs[t, h, Dl:] = bf16(rope(q[t, h, nope:], positions[t])).
// q [T, H, nope + Dr] bf16 (q is not modified), kv_b [H * (nope + v), Dl] bf16,
// q_abs [T, H, Dl + Dr] bf16.
void mla_absorb_q_cpu(const uint16_t* q, const uint16_t* kv_b, const int32_t* positions, int T,
                      const float* inv_freq, const MlaShape& s, uint16_t* q_abs);

// Token t of sequence s (cu_seqlens [S + 1]) attends to its sequence's keys 0 .. positions[t]:
//   p_j = softmax_j(scale * q_abs[t, h] . cache[key_j]),  out_lat[t, h] = bf16(sum_j p_j cache[key_j][:Dl])
// q_abs [T, H, Dl + Dr], cache [num_slots, Dl + Dr], out_lat [T, H, Dl], all bf16.
void mla_attention_cpu(const uint16_t* q_abs, const uint16_t* cache, int64_t num_slots,
                       const int32_t* cu_seqlens, int S, const int32_t* positions,
                       const MlaKeys& keys, const MlaShape& s, uint16_t* out_lat);

// out[t, h, j] = bf16(sum_c out_lat[t, h, c] * kv_b[h * (nope + v) + nope + j, c]) for j < v.
// out_lat [T, H, Dl] bf16, kv_b [H * (nope + v), Dl] bf16, out [T, H, v] bf16.
void mla_up_v_cpu(const uint16_t* out_lat, const uint16_t* kv_b, int T, const MlaShape& s,
                  uint16_t* out);

}  // namespace tetra::ops
