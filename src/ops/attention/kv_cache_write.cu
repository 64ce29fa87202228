// KV cache writes (one block per token copies its k and v rows, n_kv_heads * head_dim bf16, to
// its slot) and copy-on-write block copies; 16 bytes at a time when alignment allows, else 2.
#include "core/error.h"
#include "ops/attention/attention_cuda.h"

namespace tetra::ops::cuda {

namespace {

template <typename Word>
__global__ void write_kv_kernel(const Word* __restrict__ k, const Word* __restrict__ v,
                                const int64_t* __restrict__ slots, int64_t words_per_token,
                                int64_t stride_words, int64_t num_slots, Word* __restrict__ k_cache,
                                Word* __restrict__ v_cache) {
  const int t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= num_slots) return;
  for (int64_t i = threadIdx.x; i < words_per_token; i += blockDim.x) {
    k_cache[slot * words_per_token + i] = k[t * stride_words + i];
    v_cache[slot * words_per_token + i] = v[t * stride_words + i];
  }
}

// Grid (pair, cache): blockIdx.y 0 copies k, 1 copies v.
template <typename Word>
__global__ void copy_blocks_kernel(Word* k_cache, Word* v_cache, const int32_t* __restrict__ pairs,
                                   int num_blocks, int64_t words_per_block) {
  const int32_t src = pairs[2 * blockIdx.x], dst = pairs[2 * blockIdx.x + 1];
  if (src < 0 || src >= num_blocks || dst < 0 || dst >= num_blocks) return;
  Word* cache = blockIdx.y == 0 ? k_cache : v_cache;
  for (int64_t i = threadIdx.x; i < words_per_block; i += blockDim.x)
    cache[dst * words_per_block + i] = cache[src * words_per_block + i];
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t write_kv_cache(const uint16_t* k, const uint16_t* v, const int64_t* slots, int T,
                           const AttentionShape& s, int num_blocks, int block_size,
                           uint16_t* k_cache, uint16_t* v_cache, cudaStream_t stream) {
  TETRA_CHECK(s.n_kv_heads > 0 && s.head_dim > 0 && block_size > 0 && num_blocks > 0 && T >= 0,
              "kv cache write: shape");
  TETRA_CHECK(s.kv_step() >= int64_t(s.n_kv_heads) * s.head_dim, "kv cache write: kv_stride");
  if (T == 0) return cudaSuccess;
  const int64_t elems = int64_t(s.n_kv_heads) * s.head_dim, stride = s.kv_step();
  const int64_t num_slots = int64_t(num_blocks) * block_size;
  if (elems % 8 == 0 && stride % 8 == 0 && aligned16(k) && aligned16(v) && aligned16(k_cache) &&
      aligned16(v_cache)) {
    write_kv_kernel<uint4><<<T, 128, 0, stream>>>(
        reinterpret_cast<const uint4*>(k), reinterpret_cast<const uint4*>(v), slots, elems / 8,
        stride / 8, num_slots, reinterpret_cast<uint4*>(k_cache), reinterpret_cast<uint4*>(v_cache));
  } else {
    write_kv_kernel<uint16_t><<<T, 128, 0, stream>>>(k, v, slots, elems, stride, num_slots, k_cache,
                                                     v_cache);
  }
  return cudaGetLastError();
}

cudaError_t copy_kv_blocks(uint16_t* k_cache, uint16_t* v_cache, const int32_t* pairs, int n,
                           int num_blocks, int64_t block_elems, cudaStream_t stream) {
  TETRA_CHECK(n >= 0 && block_elems > 0 && num_blocks > 0, "kv block copy: n=", n,
              " block_elems=", block_elems);
  if (n == 0) return cudaSuccess;
  const unsigned caches = v_cache != nullptr ? 2 : 1;  // MLA: one latent cache, no v
  if (block_elems % 8 == 0 && aligned16(k_cache) && aligned16(v_cache)) {
    copy_blocks_kernel<uint4><<<dim3(n, caches), 256, 0, stream>>>(reinterpret_cast<uint4*>(k_cache),
                                                              reinterpret_cast<uint4*>(v_cache),
                                                              pairs, num_blocks, block_elems / 8);
  } else {
    copy_blocks_kernel<uint16_t><<<dim3(n, caches), 256, 0, stream>>>(k_cache, v_cache, pairs,
                                                                 num_blocks, block_elems);
  }
  return cudaGetLastError();
}

}  // namespace tetra::ops::cuda
