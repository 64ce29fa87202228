// One-shot all-reduce of small bf16 messages over peer memory, for the GPUs of one process.
// Each rank owns a registered buffer on its GPU that every peer can read (cudaDeviceEnablePeer-
// Access). A call: each rank copies its input into its buffer, raises a flag in every peer's
// flag array, waits for all peers' flags, then reads every peer's buffer and sums in float32 (rank
// order, so every rank gets the same bits) to bf16. One kernel launch, no host synchronization:
// epochs live on the device, so the call can be captured in a CUDA graph and replayed.
//
// Synchronization is per block: block b of every rank copies and sums the same element slice, so
// block b only waits for block b of the peers. Two data halves alternate by epoch, so a rank may
// run ahead of a peer by one call without overwriting data that peer is still reading.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tetra::dist {

struct PeerAllReduceOptions {
  size_t max_bytes = size_t(1) << 20;  // largest message; each rank allocates 2x this
  int blocks = 32;                     // fixed grid (<= kMaxOneShotBlocks); every call uses it
  int threads = 512;                   // per block
  // Each rank writes its input into every peer's buffer (one-way NVLink stores) instead of peers
  // reading it (round trips); buffers grow to 2 x ranks x max_bytes.
  bool push = false;
};

class PeerAllReduce {
 public:
  // Enables peer access between every pair of `devices` and allocates the buffers. Throws
  // tetra::Error when a pair has no peer access, naming the two GPUs.
  PeerAllReduce(std::vector<int> devices, PeerAllReduceOptions options = {});
  ~PeerAllReduce();
  PeerAllReduce(const PeerAllReduce&) = delete;
  PeerAllReduce& operator=(const PeerAllReduce&) = delete;

  int size() const { return int(devices_.size()); }
  int device(int rank) const { return devices_[size_t(rank)]; }
  size_t max_bytes() const { return options_.max_bytes; }
  const PeerAllReduceOptions& options() const { return options_; }

  // Rank's part of the all-reduce: out = sum over ranks of their `in` (count bf16 values).
  // Every rank must call it with the same count, in the same order of calls; stream belongs to
  // device(rank). in and out may be the same pointer, any alignment (16-byte aligned pointers
  // take the vector path). count * 2 must not exceed max_bytes.
  void run(int rank, const uint16_t* in, uint16_t* out, size_t count, cudaStream_t stream);

  // Sets every rank's epoch counters and flags to `epoch` (all GPUs idle): tests use it to cross
  // the 32-bit wrap within a few calls.
  void reset_epochs_for_test(uint32_t epoch);

 private:
  struct Rank {
    uint16_t* data = nullptr;     // [2][slots][max_bytes / 2] bf16: halves by epoch parity;
                                  // slots = 1 (pull) or size() (push, slot q written by rank q)
    uint32_t* flags = nullptr;    // [kMaxOneShotBlocks][kMaxPeerRanks] last epoch peer q's block b raised
    uint32_t* counters = nullptr; // [kMaxOneShotBlocks] this rank's epoch per block
  };
  std::vector<int> devices_;
  PeerAllReduceOptions options_;
  std::vector<Rank> ranks_;  // [size()]
};

// CPU twin of the reduction: out[i] = bf16(sum_r float(inputs[r][i])), summed in rank order.
void one_shot_reduce_cpu(const std::vector<const uint16_t*>& inputs, uint16_t* out, size_t count);

}  // namespace tetra::dist
