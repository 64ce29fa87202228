// Shared pieces of the gpu timing harnesses (bench_*.cpp): raw device scratch, and the time of
// one launch when many run back to back inside a CUDA graph (launch gaps as in the model's step
// graph, no host launch overhead).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstddef>
#include <functional>
#include <vector>

#include "core/cuda_check.h"

namespace tetra::test {

// Uninitialised device bytes (at least 256, so empty shapes still get a valid pointer).
struct DeviceScratch {
  explicit DeviceScratch(size_t bytes) {
    TETRA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
  }
  ~DeviceScratch() { cudaFree(p); }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(p); }
  void* p = nullptr;
};

// Median over `replays` of the milliseconds `pass` (enqueued on s) takes between two events.
inline double median_pass_ms(cudaStream_t s, int replays, const std::function<void()>& pass) {
  cudaEvent_t a, b;
  TETRA_CUDA_CHECK(cudaEventCreate(&a));
  TETRA_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int r = 0; r < replays; ++r) {
    TETRA_CUDA_CHECK(cudaEventRecord(a, s));
    pass();
    TETRA_CUDA_CHECK(cudaEventRecord(b, s));
    TETRA_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    TETRA_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(ms[ms.size() / 2]);
}

// Median us per launch of launch(i, stream), i = 0 .. launches-1, all captured in one graph:
// one eager warm-up pass, then `replays` timed graph launches after an untimed first one (it
// uploads the graph).
inline double graph_us_per_launch(int launches, const std::function<void(int, cudaStream_t)>& launch,
                                  int replays = 5) {
  cudaStream_t s;
  TETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int i = 0; i < launches; ++i) launch(i, s);
  TETRA_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  TETRA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < launches; ++i) launch(i, s);
  TETRA_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e;
  TETRA_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  TETRA_CUDA_CHECK(cudaGraphLaunch(e, s));
  const double ms = median_pass_ms(s, replays, [&] { TETRA_CUDA_CHECK(cudaGraphLaunch(e, s)); });
  cudaGraphExecDestroy(e);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  return ms * 1000.0 / launches;
}

// The same launches run eagerly (work a graph cannot hold, e.g. cuBLAS prefill GEMMs): one
// warm-up pass, then the median of `replays` timed passes.
inline double eager_us_per_launch(int launches, const std::function<void(int, cudaStream_t)>& launch,
                                  int replays = 5) {
  cudaStream_t s;
  TETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int i = 0; i < launches; ++i) launch(i, s);
  const double ms = median_pass_ms(s, replays, [&] {
    for (int i = 0; i < launches; ++i) launch(i, s);
  });
  cudaStreamDestroy(s);
  return ms * 1000.0 / launches;
}

// Weight copies a timing harness rotates over: 4 by default (every launch reads HBM);
// TETRA_PARTS_COPIES=1: every launch reads the same weights, which then stay in the L2.
inline int weight_copies() {
  const char* e = std::getenv("TETRA_PARTS_COPIES");
  return e ? std::clamp(std::atoi(e), 1, 4) : 4;
}

}  // namespace tetra::test
