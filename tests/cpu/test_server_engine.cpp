// The engine hooks the server relies on: cancel() ends queued and running requests and frees
// their KV blocks, release() forgets finished ones, and the KV usage getters track all of it.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model_fixture.h"
#include "runtime/engine.h"

namespace tetra {
namespace {

std::unique_ptr<runtime::Engine> small_engine() {
  runtime::EngineOptions o;
  o.backend = "cpu";
  o.max_batch = 1;  // the second request has to wait
  o.max_context = 64;
  o.kv_block_size = 4;
  return runtime::Engine::load(test::tiny_model("tiny-glm4.5-air", "nvfp4"), o);
}

TEST(EngineCancel, FreesBlocksOfRunningAndQueuedRequests) {
  auto e = small_engine();
  EXPECT_EQ(e->kv_blocks_used(), 0);
  EXPECT_EQ(e->kv_blocks_total(), 16);  // max_batch full contexts: 64 / 4
  ops::SamplingParams p;
  p.temperature = 0;
  const int64_t a = e->add_request({1, 2, 3, 4, 5}, p, 20);
  const int64_t b = e->add_request({6, 7}, p, 20);
  e->step();  // a prefills; b waits for the only slot
  EXPECT_EQ(e->num_running(), 1);
  EXPECT_EQ(e->num_waiting(), 1);
  EXPECT_EQ(e->kv_blocks_used(), 2);  // 5 prompt tokens in blocks of 4
  EXPECT_TRUE(e->cancel(a));
  EXPECT_EQ(e->kv_blocks_used(), 0);
  EXPECT_EQ(e->num_running(), 0);
  EXPECT_EQ(e->request(a).finish, runtime::FinishReason::Cancelled);
  EXPECT_STREQ(runtime::finish_reason_name(e->request(a).finish), "cancelled");
  EXPECT_FALSE(e->cancel(a));  // already over
  EXPECT_TRUE(e->cancel(b));   // still queued
  EXPECT_EQ(e->num_waiting(), 0);
  EXPECT_FALSE(e->has_work());
  e->release(a);
  EXPECT_THROW(e->request(a), Error);
}

TEST(EngineCancel, ReleaseRefusesUnfinishedAndFreedSlotsServeTheNext) {
  auto e = small_engine();
  ops::SamplingParams p;
  p.temperature = 0;
  const int64_t a = e->add_request({1, 2}, p, 30);
  e->step();
  EXPECT_THROW(e->release(a), Error);
  const int64_t b = e->add_request({3, 4}, p, 3);
  e->cancel(a);
  e->run_to_completion();
  EXPECT_EQ(e->request(b).output.size(), 3u);
  EXPECT_EQ(e->kv_blocks_used(), 0);
}

}  // namespace
}  // namespace tetra
