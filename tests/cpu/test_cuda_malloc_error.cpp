// TETRA_CUDA_MALLOC's error: the size asked for, and on an out-of-memory the device's free memory.
#include <gtest/gtest.h>

#include <string>

#include "core/cuda_check.h"

namespace tetra {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(CudaMallocError, OutOfMemorySaysTheSizeAndTheFreeMemory) {
  const std::string m = detail::cuda_malloc_error("&p_", 604 * kMiB + kMiB / 2,
                                                  cudaErrorMemoryAllocation, 1230 * kMiB, 81079 * kMiB);
  EXPECT_TRUE(has(m, "cudaMalloc(&p_, 604.5 MiB)")) << m;
  EXPECT_TRUE(has(m, cudaGetErrorString(cudaErrorMemoryAllocation))) << m;
  EXPECT_TRUE(has(m, "the device has 1230.0 MiB free of 81079.0 MiB")) << m;
}

TEST(CudaMallocError, OtherErrorsAndUnreadableMemoryLeaveTheFreeMemoryOut) {
  const std::string other =
      detail::cuda_malloc_error("&x", kMiB, cudaErrorInvalidValue, 10 * kMiB, 20 * kMiB);
  EXPECT_TRUE(has(other, "cudaMalloc(&x, 1.0 MiB)")) << other;
  EXPECT_FALSE(has(other, "free of")) << other;
  const std::string unread = detail::cuda_malloc_error("&x", kMiB, cudaErrorMemoryAllocation, 0, 0);
  EXPECT_FALSE(has(unread, "free of")) << unread;
}

// The macro end to end: without a GPU cudaMalloc fails (no device); with one, a petabyte does.
TEST(CudaMallocError, TheMacroThrowsWithTheSize) {
  void* p = nullptr;
  const size_t huge = size_t(1) << 50;  // 1 PiB: more than any device has
  try {
    TETRA_CUDA_MALLOC(&p, huge);
    ADD_FAILURE() << "a 1 PiB allocation succeeded";
    cudaFree(p);
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(has(m, "cudaMalloc(&p, 1073741824.0 MiB)")) << m;
    if (cuda_available()) EXPECT_TRUE(has(m, "free of")) << m;
  }
}

}  // namespace
}  // namespace tetra
