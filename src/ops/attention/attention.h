// Attention, CPU reference: causal prefill over a varlen batch, and decode over a paged KV cache.
// GQA: query head h reads kv head h / (n_heads / n_kv_heads). Softmax in float with the row max
// subtracted; out = sum_j p_j v_j / sum_j p_j, one bf16 rounding. bf16 tensors are uint16_t bits.
// The CUDA twins (ops/attention/attention_cuda.h) take the same arguments.
#pragma once
#include <cstdint>

namespace tetra::ops {

struct AttentionShape {
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // divides n_heads
  int head_dim = 0;
  float scale = 0.0f;  // softmax scale, usually head_dim^-0.5
  // Elements from one token's q (k, v) to the next; 0 means packed ([T, heads, head_dim]).
  // Lets q, k and v be read straight out of a fused qkv projection output.
  int64_t q_stride = 0;
  int64_t kv_stride = 0;

  int64_t q_step() const { return q_stride != 0 ? q_stride : int64_t(n_heads) * head_dim; }
  int64_t kv_step() const { return kv_stride != 0 ? kv_stride : int64_t(n_kv_heads) * head_dim; }
};

// Refuses inconsistent shapes with a tetra::Error.
void check_attention_shape(const AttentionShape& s);

// Causal self-attention of each sequence over itself (no cached prefix).
//   q [T, n_heads, head_dim], k/v [T, n_kv_heads, head_dim] (token strides per AttentionShape),
//   cu_seqlens [num_seqs + 1] int32 (sequence b is tokens cu[b] .. cu[b+1]), T = cu[num_seqs];
//   out [T, n_heads, head_dim] packed.
void prefill_attention_cpu(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                           const int32_t* cu_seqlens, int num_seqs, const AttentionShape& s,
                           uint16_t* out);

// Where the paged cache is and who owns which block (see runtime/kv_cache.h).
struct PagedKv {
  const uint16_t* k_cache = nullptr;     // [num_blocks, block_size, n_kv_heads, head_dim]
  const uint16_t* v_cache = nullptr;     // [num_blocks, block_size, n_kv_heads, head_dim]
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  const int32_t* seq_lens = nullptr;      // [num_seqs] tokens in the cache, the new one included
  int num_blocks = 0;
  int block_size = 0;
  int max_blocks_per_seq = 0;
};

// One new token per sequence attends to all seq_lens[s] cached tokens (its own k/v already
// written into the cache). q [num_seqs, n_heads, head_dim] (token stride per shape.q_step()),
// out [num_seqs, n_heads, head_dim]. seq_lens[s] == 0 gives zeros.
void paged_decode_attention_cpu(const uint16_t* q, const PagedKv& kv, int num_seqs,
                                const AttentionShape& s, uint16_t* out);

// Writes T tokens' k/v into the cache: token t goes to slot slots[t] = block*block_size + offset;
// a negative slot skips the token (padding). k/v [T, n_kv_heads, head_dim] with shape.kv_step().
// k_cache/v_cache [num_blocks, block_size, n_kv_heads, head_dim]. Slots past the cache throw.
void write_kv_cache_cpu(const uint16_t* k, const uint16_t* v, const int64_t* slots, int T,
                        const AttentionShape& s, int num_blocks, int block_size, uint16_t* k_cache,
                        uint16_t* v_cache);

// Copy-on-write after a fork (runtime/kv_cache.h BlockCopy): for i < n, block pairs[2i+1] of
// each cache becomes a copy of block pairs[2i]. pairs [n, 2] int32 (src, dst); block_elems =
// block_size * n_kv_heads * head_dim. Ids outside [0, num_blocks) throw. v_cache may be null
// (MLA keeps one latent cache: block_elems = block_size * (kv_lora + rope)).
void copy_kv_blocks_cpu(uint16_t* k_cache, uint16_t* v_cache, const int32_t* pairs, int n,
                        int num_blocks, int64_t block_elems);

}  // namespace tetra::ops
