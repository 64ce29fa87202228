// Multi-GPU all-reduce on the GPUs of one process (needs >= 2 GPUs; skips otherwise): the one-shot
// peer-memory kernel must give exactly its CPU twin's bits (float32 sum in rank order, one
// rounding) on every rank; NCCL's bf16 sum must be within one bf16 ulp of it. Odd counts and
// misaligned pointers take the scalar path; outputs sit between poisoned guard bytes; repeated
// calls cross the 32-bit epoch wrap; a captured CUDA graph is replayed with fresh inputs.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/cuda_check.h"
#include "core/half.h"
#include "dist/allreduce.h"
#include "dist/nccl_library.h"
#include "dist/rank_threads.h"

using namespace tetra;
using namespace tetra::dist;

namespace {

constexpr int kRanks = 2;
constexpr uint8_t kPoison = 0xA5;
constexpr size_t kGuard = 256;  // bytes on each side of every output
constexpr size_t kOneShotMax = size_t(1) << 20;

// Device bf16 array of n values between poisoned guards; `shift` elements of offset make a
// pointer that is not 16-byte aligned.
class DevBuf {
 public:
  DevBuf(size_t n, size_t shift) : n_(n), shift_(shift) {
    TETRA_CUDA_CHECK(cudaMalloc(&base_, total()));
    poison();
  }
  ~DevBuf() { cudaFree(base_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  uint16_t* get() { return reinterpret_cast<uint16_t*>(base_ + kGuard) + shift_; }
  void poison() { TETRA_CUDA_CHECK(cudaMemset(base_, kPoison, total())); }
  void upload(const std::vector<uint16_t>& v) {
    TETRA_CUDA_CHECK(cudaMemcpy(get(), v.data(), n_ * 2, cudaMemcpyHostToDevice));
  }
  std::vector<uint16_t> download() {
    std::vector<uint16_t> v(n_);
    TETRA_CUDA_CHECK(cudaMemcpy(v.data(), get(), n_ * 2, cudaMemcpyDeviceToHost));
    return v;
  }
  bool guards_intact() {
    std::vector<uint8_t> raw(total());
    TETRA_CUDA_CHECK(cudaMemcpy(raw.data(), base_, raw.size(), cudaMemcpyDeviceToHost));
    const size_t lo = kGuard + shift_ * 2, hi = lo + n_ * 2;
    for (size_t i = 0; i < raw.size(); ++i)
      if ((i < lo || i >= hi) && raw[i] != kPoison) return false;
    return true;
  }

 private:
  size_t total() const { return 2 * kGuard + (n_ + shift_) * 2; }
  size_t n_, shift_;
  uint8_t* base_ = nullptr;
};

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = float_to_bf16(dist(rng));
  return v;
}

std::vector<uint16_t> cpu_sum(const std::vector<std::vector<uint16_t>>& inputs) {
  std::vector<const uint16_t*> ptrs;
  for (const auto& v : inputs) ptrs.push_back(v.data());
  std::vector<uint16_t> out(inputs[0].size());
  one_shot_reduce_cpu(ptrs, out.data(), out.size());
  return out;
}

// Distance in bf16 steps (sign-magnitude mapped to a monotonic integer line).
int ulp_distance(uint16_t a, uint16_t b) {
  auto line = [](uint16_t x) { return (x & 0x8000) ? -int(x & 0x7FFF) : int(x); };
  return std::abs(line(a) - line(b));
}

// First index where got != want, or -1.
long first_mismatch(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) return long(i);
  return -1;
}

class AllReduceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (visible_gpu_count() < kRanks) return;
    AllReduceConfig cfg;
    cfg.one_shot_max_bytes = kOneShotMax;
    group_ = std::make_unique<AllReduceGroup>(first_devices(kRanks), cfg);
    std::printf("[ info ] NCCL %s, %d GPUs\n", nccl_version_string().c_str(), visible_gpu_count());
  }
  static void TearDownTestSuite() { group_.reset(); }
  void SetUp() override {
    const int n = visible_gpu_count();
    if (n < kRanks) GTEST_SKIP() << "needs " << kRanks << " GPUs in this process, found " << n;
  }

  // One all-reduce of `count` values per rank through `call`; returns each rank's output and
  // checks its guards. Inputs come from seed + rank.
  template <typename Call>
  std::vector<std::vector<uint16_t>> reduce_once(size_t count, size_t shift, uint32_t seed,
                                                 std::vector<std::vector<uint16_t>>& inputs,
                                                 Call call, bool in_place = false) {
    inputs.assign(kRanks, {});
    for (int r = 0; r < kRanks; ++r) inputs[size_t(r)] = random_bf16(count, seed + uint32_t(r));
    std::vector<std::vector<uint16_t>> outputs(kRanks);
    run_on_ranks(first_devices(kRanks), [&](int rank) {
      DevBuf in(count, shift), out(count, shift);
      in.upload(inputs[size_t(rank)]);
      cudaStream_t s;
      TETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      uint16_t* dst = in_place ? in.get() : out.get();
      call(rank, in.get(), dst, count, s);
      TETRA_CUDA_CHECK(cudaStreamSynchronize(s));
      TETRA_CUDA_CHECK(cudaStreamDestroy(s));
      DevBuf& result = in_place ? in : out;
      outputs[size_t(rank)] = result.download();
      if (!result.guards_intact()) ADD_FAILURE() << "rank " << rank << " wrote outside its output";
    });
    return outputs;
  }

  static std::unique_ptr<AllReduceGroup> group_;

 public:
  // Every count of kCounts, aligned and not, on every rank of `peer`.
  void counts_body(PeerAllReduce& peer);
};

std::unique_ptr<AllReduceGroup> AllReduceTest::group_;

const std::vector<size_t> kCounts = {1, 3, 7, 8, 9, 19, 99, 989, 4095, 4096, 12345, 65539, 262144,
                                     kOneShotMax / 2};

// 40 back-to-back calls per rank crossing the epoch wrap, no host sync between them.
void check_back_to_back(PeerAllReduce& peer);

TEST_F(AllReduceTest, OneShotEqualsCpuTwinOnEveryRank) { counts_body(*group_->peer()); }

TEST_F(AllReduceTest, PushVariantEqualsCpuTwin) {
  PeerAllReduceOptions o;
  o.max_bytes = kOneShotMax;
  o.push = true;
  PeerAllReduce push(first_devices(kRanks), o);
  counts_body(push);
  check_back_to_back(push);
}

void AllReduceTest::counts_body(PeerAllReduce& peer) {
  for (size_t shift : {0, 1}) {  // 1: unaligned pointers, scalar path
    for (size_t count : kCounts) {
      if (count * 2 + shift * 2 > kOneShotMax) continue;
      std::vector<std::vector<uint16_t>> inputs;
      auto out = reduce_once(count, shift, uint32_t(count * 7 + shift), inputs,
                             [&](int r, const uint16_t* in, uint16_t* o, size_t n, cudaStream_t s) {
                               peer.run(r, in, o, n, s);
                             });
      const auto want = cpu_sum(inputs);
      for (int r = 0; r < kRanks; ++r)
        EXPECT_EQ(first_mismatch(out[size_t(r)], want), -1)
            << "rank " << r << " count " << count << " shift " << shift;
    }
  }
}

TEST_F(AllReduceTest, NcclWithinOneUlpOfCpuTwin) {
  for (size_t count : kCounts) {
    std::vector<std::vector<uint16_t>> inputs;
    auto out = reduce_once(count, 0, uint32_t(count * 3 + 1), inputs,
                           [&](int r, const uint16_t* in, uint16_t* o, size_t n, cudaStream_t s) {
                             group_->nccl()->all_reduce_bf16(r, in, o, n, s);
                           });
    const auto want = cpu_sum(inputs);
    size_t exact = 0;
    int worst = 0;
    for (size_t i = 0; i < count; ++i) {
      worst = std::max(worst, ulp_distance(out[0][i], want[i]));
      exact += out[0][i] == want[i];
      ASSERT_EQ(out[0][i], out[1][i]) << "ranks disagree at " << i << " count " << count;
    }
    EXPECT_LE(worst, 1) << "count " << count;
    std::printf("[ info ] nccl count %zu: %zu/%zu bit-equal to the one-shot sum\n", count, exact,
                count);
  }
}

TEST_F(AllReduceTest, InPlaceAndFacadeBothPaths) {
  // 4096 values take the one-shot path, 1M values (2 MB, above the 1 MiB limit) NCCL.
  for (size_t count : {size_t(4096), size_t(1) << 20}) {
    const AllReducePath path = choose_all_reduce_path(count * 2, kRanks, group_->config());
    EXPECT_EQ(path, count == 4096 ? AllReducePath::OneShot : AllReducePath::Nccl);
    std::vector<std::vector<uint16_t>> inputs;
    auto out = reduce_once(
        count, 0, 99, inputs,
        [&](int r, const uint16_t* in, uint16_t* o, size_t n, cudaStream_t s) {
          group_->rank(r).run(in, o, n, s);
        },
        /*in_place=*/true);
    const auto want = cpu_sum(inputs);
    for (size_t i = 0; i < count; ++i)
      ASSERT_LE(ulp_distance(out[0][i], want[i]), 1) << "count " << count << " at " << i;
    EXPECT_EQ(first_mismatch(out[0], out[1]), -1) << "ranks disagree, count " << count;
  }
}

TEST_F(AllReduceTest, RepeatedCallsAcrossEpochWrap) { check_back_to_back(*group_->peer()); }

void check_back_to_back(PeerAllReduce& peer) {
  peer.reset_epochs_for_test(0xFFFFFFFFu - 6);  // wraps after 6 calls
  constexpr int kCalls = 40;
  constexpr size_t kCount = 5001;
  std::vector<std::vector<std::vector<uint16_t>>> inputs(kCalls);  // [call][rank][count]
  for (int c = 0; c < kCalls; ++c)
    for (int r = 0; r < kRanks; ++r)
      inputs[size_t(c)].push_back(random_bf16(kCount, uint32_t(1000 + c * kRanks + r)));
  std::vector<std::vector<std::vector<uint16_t>>> outputs(kCalls,
                                                          std::vector<std::vector<uint16_t>>(kRanks));
  // Back-to-back calls on each rank's stream, no host sync between them: ranks drift apart and
  // the flags/halves must keep them apart correctly.
  run_on_ranks(first_devices(kRanks), [&](int rank) {
    std::vector<std::unique_ptr<DevBuf>> in, out;
    for (int c = 0; c < kCalls; ++c) {
      in.push_back(std::make_unique<DevBuf>(kCount, 0));
      out.push_back(std::make_unique<DevBuf>(kCount, 0));
      in.back()->upload(inputs[size_t(c)][size_t(rank)]);
    }
    cudaStream_t s;
    TETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int c = 0; c < kCalls; ++c)
      peer.run(rank, in[size_t(c)]->get(), out[size_t(c)]->get(), kCount, s);
    TETRA_CUDA_CHECK(cudaStreamSynchronize(s));
    TETRA_CUDA_CHECK(cudaStreamDestroy(s));
    for (int c = 0; c < kCalls; ++c) outputs[size_t(c)][size_t(rank)] = out[size_t(c)]->download();
  });
  for (int c = 0; c < kCalls; ++c) {
    const auto want = cpu_sum(inputs[size_t(c)]);
    for (int r = 0; r < kRanks; ++r)
      EXPECT_EQ(first_mismatch(outputs[size_t(c)][size_t(r)], want), -1)
          << "call " << c << " rank " << r;
  }
}

TEST_F(AllReduceTest, CudaGraphReplayedWithFreshInputs) {
  constexpr int kReplays = 300;
  constexpr size_t kCount = 3001;  // odd: vector body and scalar tail
  std::vector<std::vector<std::vector<uint16_t>>> inputs(kReplays);  // [replay][rank][count]
  for (int i = 0; i < kReplays; ++i)
    for (int r = 0; r < kRanks; ++r)
      inputs[size_t(i)].push_back(random_bf16(kCount, uint32_t(50000 + i * kRanks + r)));
  std::vector<int> bad(kRanks, 0), first_bad(kRanks, -1);
  run_on_ranks(first_devices(kRanks), [&](int rank) {
    DevBuf in(kCount, 0), out(kCount, 0);
    cudaStream_t s;
    TETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    TETRA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    group_->peer()->run(rank, in.get(), out.get(), kCount, s);
    TETRA_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    TETRA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    std::vector<uint16_t> got(kCount);
    for (int i = 0; i < kReplays; ++i) {
      const auto& mine = inputs[size_t(i)][size_t(rank)];
      TETRA_CUDA_CHECK(cudaMemcpyAsync(in.get(), mine.data(), kCount * 2, cudaMemcpyHostToDevice, s));
      TETRA_CUDA_CHECK(cudaMemsetAsync(out.get(), kPoison, kCount * 2, s));
      TETRA_CUDA_CHECK(cudaGraphLaunch(exec, s));
      TETRA_CUDA_CHECK(cudaMemcpyAsync(got.data(), out.get(), kCount * 2, cudaMemcpyDeviceToHost, s));
      TETRA_CUDA_CHECK(cudaStreamSynchronize(s));
      if (first_mismatch(got, cpu_sum(inputs[size_t(i)])) != -1 && bad[size_t(rank)]++ == 0)
        first_bad[size_t(rank)] = i;
    }
    TETRA_CUDA_CHECK(cudaGraphExecDestroy(exec));
    TETRA_CUDA_CHECK(cudaGraphDestroy(graph));
    TETRA_CUDA_CHECK(cudaStreamDestroy(s));
  });
  for (int r = 0; r < kRanks; ++r)
    EXPECT_EQ(bad[size_t(r)], 0) << "rank " << r << " wrong replays, first " << first_bad[size_t(r)];
}

}  // namespace
