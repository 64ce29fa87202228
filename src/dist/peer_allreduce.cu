// The one-shot kernel (header says how the protocol works) and its host side.
#include <cuda_bf16.h>

#include <cstring>

#include "core/cuda_check.h"
#include "core/global_timer.cuh"
#include "dist/one_shot_math.h"
#include "dist/peer_allreduce.h"

namespace tetra::dist {
namespace {

// A peer that never arrives (a rank that skipped a call) would hang the GPU forever; after this
// long the kernel traps instead, which surfaces as a CUDA error on the stream.
constexpr uint64_t kWaitTimeoutNs = 20ull * 1000 * 1000 * 1000;

// Every rank's buffers, by rank; passed by value so the kernel needs no extra lookup.
struct PeerTable {
  const uint16_t* data[kMaxPeerRanks];  // rank q's [2][slots][slot_elems] bf16 (slots: 1 pull, N push)
  uint32_t* flags[kMaxPeerRanks];       // rank q's [kMaxOneShotBlocks][kMaxPeerRanks]
};

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint16_t round_bf16(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

// V consecutive bf16 elements: 8 as one 16-byte vector, or 1.
template <int V>
struct Pack;

template <>
struct Pack<8> {
  uint4 v;
  __device__ static Pack load(const uint16_t* p) { return {*reinterpret_cast<const uint4*>(p)}; }
  __device__ static Pack load_peer(const uint16_t* p) {  // L2 only: peers' lines change per call
    return {__ldcg(reinterpret_cast<const uint4*>(p))};
  }
  __device__ void store(uint16_t* p) const { *reinterpret_cast<uint4*>(p) = v; }
  __device__ void add_to(float (&acc)[8]) const {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // low half is the even element (little endian)
      acc[2 * k] += __uint_as_float(w[k] << 16);
      acc[2 * k + 1] += __uint_as_float(w[k] & 0xFFFF0000u);
    }
  }
  __device__ static Pack from(const float (&acc)[8]) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      w[k] = uint32_t(round_bf16(acc[2 * k])) | (uint32_t(round_bf16(acc[2 * k + 1])) << 16);
    return {make_uint4(w[0], w[1], w[2], w[3])};
  }
};

template <>
struct Pack<1> {
  uint16_t v;
  __device__ static Pack load(const uint16_t* p) { return {*p}; }
  __device__ static Pack load_peer(const uint16_t* p) {
    return {__ldcg(reinterpret_cast<const unsigned short*>(p))};
  }
  __device__ void store(uint16_t* p) const { *p = v; }
  __device__ void add_to(float (&acc)[1]) const { acc[0] += __uint_as_float(uint32_t(v) << 16); }
  __device__ static Pack from(const float (&acc)[1]) { return {round_bf16(acc[0])}; }
};

// Elements [0, items*V) go in V-wide packs, one pack per thread per grid stride; the count % V
// leftover elements go one each to the first threads of the grid. Both phases walk the same
// indices, so block b sums exactly the slice it copied (and peers' block b copied).
template <int V, typename Fn>
__device__ __forceinline__ void for_my_elements(size_t count, Fn&& fn) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t items = count / V;
  for (size_t i = first; i < items; i += stride) fn.template operator()<V>(i * V);
  const size_t tail = count - items * V;
  if (V > 1 && first < tail) fn.template operator()<1>(items * V + first);
}

// kPush false (pull): I copy my input into my own buffer, peers read it over NVLink.
// kPush true: I write my input into slot `rank` of every peer's buffer (stores cross NVLink,
// one way), then every rank reads its N slots locally: one NVLink round trip fewer.
template <int N, int V, bool kPush>
__global__ void __launch_bounds__(1024)
    one_shot_all_reduce(PeerTable peers, uint32_t* counters, int rank, const uint16_t* in,
                        uint16_t* out, size_t count, size_t slot_elems) {
  const size_t half_elems = (kPush ? N : 1) * slot_elems;
  __shared__ uint32_t s_epoch;
  const int b = blockIdx.x;
  if (threadIdx.x == 0) s_epoch = counters[b] + 1;  // only this block touches counters[b]
  __syncthreads();
  const uint32_t epoch = s_epoch;
  const size_t half = size_t(epoch_half(epoch)) * half_elems;
  uint16_t* mine = const_cast<uint16_t*>(peers.data[rank]) + half;

  // Phase 1: my slice of the input into my buffer (pull) or into my slot of every buffer (push).
  for_my_elements<V>(count, [&]<int W>(size_t e) {
    const Pack<W> v = Pack<W>::load(in + e);
    if constexpr (kPush) {
#pragma unroll
      for (int q = 0; q < N; ++q)
        v.store(const_cast<uint16_t*>(peers.data[q]) + half + size_t(rank) * slot_elems + e);
    } else {
      v.store(mine + e);
    }
  });
  __syncthreads();

  // Flags: tell every peer's block b that my slice is there, then wait for theirs.
  if (threadIdx.x == 0) {
    __threadfence_system();  // the whole block's copies are visible before any flag
#pragma unroll
    for (int q = 0; q < N; ++q)
      if (q != rank) store_release_sys(peers.flags[q] + b * kMaxPeerRanks + rank, epoch);
    const uint32_t* my_flags = peers.flags[rank] + b * kMaxPeerRanks;
    const uint64_t start = global_timer_ns();
#pragma unroll
    for (int q = 0; q < N; ++q) {
      if (q == rank) continue;
      while (!epoch_reached(load_acquire_sys(my_flags + q), epoch))
        if (global_timer_ns() - start > kWaitTimeoutNs) __trap();
    }
    counters[b] = epoch;
  }
  __syncthreads();

  // Phase 2: every rank's slice, summed in rank order.
  for_my_elements<V>(count, [&]<int W>(size_t e) {
    float acc[W];
#pragma unroll
    for (int k = 0; k < W; ++k) acc[k] = 0.0f;
#pragma unroll
    for (int q = 0; q < N; ++q) {
      const uint16_t* src = kPush ? mine + size_t(q) * slot_elems + e : peers.data[q] + half + e;
      Pack<W>::load_peer(src).add_to(acc);
    }
    Pack<W>::from(acc).store(out + e);
  });
}

template <int N>
void launch_n(bool push, bool vec, dim3 grid, dim3 block, cudaStream_t s, const PeerTable& t,
              uint32_t* c, int rank, const uint16_t* in, uint16_t* out, size_t count, size_t slot) {
  if (push && vec)
    one_shot_all_reduce<N, 8, true><<<grid, block, 0, s>>>(t, c, rank, in, out, count, slot);
  else if (push)
    one_shot_all_reduce<N, 1, true><<<grid, block, 0, s>>>(t, c, rank, in, out, count, slot);
  else if (vec)
    one_shot_all_reduce<N, 8, false><<<grid, block, 0, s>>>(t, c, rank, in, out, count, slot);
  else
    one_shot_all_reduce<N, 1, false><<<grid, block, 0, s>>>(t, c, rank, in, out, count, slot);
}

void enable_peer_access(const std::vector<int>& devices) {
  for (int a : devices) {
    TETRA_CUDA_CHECK(cudaSetDevice(a));
    for (int b : devices) {
      if (a == b) continue;
      int can = 0;
      TETRA_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can)
        TETRA_FAIL("GPU ", a, " cannot read GPU ", b,
                   "'s memory (no peer access); the one-shot all-reduce needs it. Use NCCL only "
                   "(one-shot threshold 0)");
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled)
        cudaGetLastError();  // enabled by an earlier group: fine
      else
        TETRA_CUDA_CHECK(e);
    }
  }
}

}  // namespace

PeerAllReduce::PeerAllReduce(std::vector<int> devices, PeerAllReduceOptions options)
    : devices_(std::move(devices)), options_(options) {
  TETRA_CHECK(!devices_.empty() && devices_.size() <= size_t(kMaxPeerRanks),
              "one-shot all-reduce takes 1..", kMaxPeerRanks, " GPUs, got ", devices_.size());
  TETRA_CHECK(options_.blocks >= 1 && options_.blocks <= kMaxOneShotBlocks, "blocks ",
              options_.blocks);
  TETRA_CHECK(options_.threads >= 32 && options_.threads <= 1024 && options_.threads % 32 == 0,
              "threads ", options_.threads);
  options_.max_bytes = (options_.max_bytes + 15) / 16 * 16;  // halves stay 16-byte aligned
  int current = 0;
  TETRA_CUDA_CHECK(cudaGetDevice(&current));
  if (size() > 1) enable_peer_access(devices_);
  ranks_.resize(devices_.size());
  for (size_t r = 0; r < devices_.size(); ++r) {
    TETRA_CUDA_CHECK(cudaSetDevice(devices_[r]));
    Rank& k = ranks_[r];
    const size_t slots = options_.push ? devices_.size() : 1;
    TETRA_CUDA_MALLOC(&k.data, 2 * slots * options_.max_bytes);
    TETRA_CUDA_MALLOC(&k.flags, sizeof(uint32_t) * kMaxOneShotBlocks * kMaxPeerRanks);
    TETRA_CUDA_MALLOC(&k.counters, sizeof(uint32_t) * kMaxOneShotBlocks);
    TETRA_CUDA_CHECK(cudaMemset(k.flags, 0, sizeof(uint32_t) * kMaxOneShotBlocks * kMaxPeerRanks));
    TETRA_CUDA_CHECK(cudaMemset(k.counters, 0, sizeof(uint32_t) * kMaxOneShotBlocks));
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  TETRA_CUDA_CHECK(cudaSetDevice(current));
}

PeerAllReduce::~PeerAllReduce() {
  int current = 0;
  cudaGetDevice(&current);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    cudaSetDevice(devices_[r]);
    cudaFree(ranks_[r].data);
    cudaFree(ranks_[r].flags);
    cudaFree(ranks_[r].counters);
  }
  cudaSetDevice(current);
}

void PeerAllReduce::run(int rank, const uint16_t* in, uint16_t* out, size_t count,
                        cudaStream_t stream) {
  TETRA_CHECK(rank >= 0 && rank < size(), "rank ", rank, " of ", size());
  TETRA_CHECK_LE(count * sizeof(uint16_t), options_.max_bytes, "one-shot all-reduce message");
  if (count == 0) return;
  int current = -1;
  TETRA_CUDA_CHECK(cudaGetDevice(&current));
  TETRA_CHECK_EQ(current, device(rank), "call run(rank) with the rank's GPU current");
  if (size() == 1) {
    if (in != out)
      TETRA_CUDA_CHECK(cudaMemcpyAsync(out, in, count * sizeof(uint16_t),
                                       cudaMemcpyDeviceToDevice, stream));
    return;
  }
  PeerTable t{};
  for (int q = 0; q < size(); ++q) {
    t.data[q] = ranks_[size_t(q)].data;
    t.flags[q] = ranks_[size_t(q)].flags;
  }
  const bool vec = (reinterpret_cast<uintptr_t>(in) | reinterpret_cast<uintptr_t>(out)) % 16 == 0;
  const size_t slot = options_.max_bytes / sizeof(uint16_t);  // elements per rank slot
  const dim3 grid(unsigned(options_.blocks)), block(unsigned(options_.threads));
  uint32_t* c = ranks_[size_t(rank)].counters;
  const bool push = options_.push;
  switch (size()) {
    case 2: launch_n<2>(push, vec, grid, block, stream, t, c, rank, in, out, count, slot); break;
    case 3: launch_n<3>(push, vec, grid, block, stream, t, c, rank, in, out, count, slot); break;
    case 4: launch_n<4>(push, vec, grid, block, stream, t, c, rank, in, out, count, slot); break;
    case 5: launch_n<5>(push, vec, grid, block, stream, t, c, rank, in, out, count, slot); break;
    case 6: launch_n<6>(push, vec, grid, block, stream, t, c, rank, in, out, count, slot); break;
    case 7: launch_n<7>(push, vec, grid, block, stream, t, c, rank, in, out, count, slot); break;
    case 8: launch_n<8>(push, vec, grid, block, stream, t, c, rank, in, out, count, slot); break;
    default: TETRA_FAIL("one-shot all-reduce: ", size(), " ranks not supported");
  }
  TETRA_CUDA_CHECK(cudaGetLastError());
}

void PeerAllReduce::reset_epochs_for_test(uint32_t epoch) {
  int current = 0;
  TETRA_CUDA_CHECK(cudaGetDevice(&current));
  const std::vector<uint32_t> flags(size_t(kMaxOneShotBlocks) * kMaxPeerRanks, epoch);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    TETRA_CUDA_CHECK(cudaSetDevice(devices_[r]));
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
    TETRA_CUDA_CHECK(cudaMemcpy(ranks_[r].flags, flags.data(), flags.size() * sizeof(uint32_t),
                                cudaMemcpyHostToDevice));
    TETRA_CUDA_CHECK(cudaMemcpy(ranks_[r].counters, flags.data(),
                                kMaxOneShotBlocks * sizeof(uint32_t), cudaMemcpyHostToDevice));
  }
  TETRA_CUDA_CHECK(cudaSetDevice(current));
}

}  // namespace tetra::dist
