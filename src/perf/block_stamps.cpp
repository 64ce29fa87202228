// See block_stamps.h.
#include "perf/block_stamps.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"

namespace tetra::perf {
namespace {
unsigned long long* g_buffer = nullptr;
std::atomic<int> g_launch{0};
}  // namespace

bool block_stamps_compiled() {
#ifdef TETRA_BLOCK_STAMPS
  return true;
#else
  return false;
#endif
}

void enable_block_stamps() {
  TETRA_CHECK(block_stamps_compiled(),
              "block stamps are not in this build: configure with -DTETRA_BLOCK_STAMPS=ON");
  if (g_buffer != nullptr) return;
  TETRA_CUDA_MALLOC(&g_buffer, (8 + kBlockStampCapacity * kBlockStampWords) * 8);
  TETRA_CUDA_CHECK(cudaMemset(g_buffer, 0, 64));
}

unsigned long long* block_stamp_buffer() { return g_buffer; }

int next_block_stamp_launch() { return g_launch.fetch_add(1); }

void reset_block_stamps() {
  if (g_buffer != nullptr) TETRA_CUDA_CHECK(cudaMemset(g_buffer, 0, 64));
}

void dump_block_stamps(const std::string& path) {
  TETRA_CHECK(g_buffer != nullptr, "block stamps are not enabled");
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  unsigned long long n = 0;
  TETRA_CUDA_CHECK(cudaMemcpy(&n, g_buffer, 8, cudaMemcpyDeviceToHost));
  if (n > kBlockStampCapacity) n = kBlockStampCapacity;
  std::vector<unsigned long long> records(n * kBlockStampWords);
  TETRA_CUDA_CHECK(cudaMemcpy(records.data(), g_buffer + 8, records.size() * 8,
                              cudaMemcpyDeviceToHost));
  FILE* f = std::fopen(path.c_str(), "wb");
  TETRA_CHECK(f != nullptr, "cannot write block stamps to ", path);
  const size_t wrote = std::fwrite(records.data(), 8, records.size(), f);
  std::fclose(f);
  TETRA_CHECK(wrote == records.size(), "short write of block stamps to ", path);
}

}  // namespace tetra::perf
