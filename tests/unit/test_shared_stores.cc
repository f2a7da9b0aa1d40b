// SharedStores (src/core/shared_stores.h): how a shared-memory sender
// chooses between cached and streaming stores for its FIFO steps, from the
// rate of its own cached copies. Times are given, not measured.
#include <gtest/gtest.h>
#include <stdlib.h>

#include "core/config.h"
#include "core/shared_stores.h"

namespace loom {
namespace {

constexpr size_t KiB = 1024;
constexpr int64_t kMs = 1'000'000;

// One step of the auto policy at time t: the cached bytes it chose, then
// their copy recorded at `gbps`.
size_t step(SharedStores& s, int64_t t, double gbps, size_t n = 256 * KiB) {
  const size_t cached = s.cached_bytes(n, t);
  if (s.timed(n)) s.record(cached, static_cast<int64_t>(static_cast<double>(cached) / gbps), t);
  return cached;
}

TEST(SharedStores, FixedPolicies) {
  SharedStores cached(SharedStores::Policy::kCached), streaming(SharedStores::Policy::kStreaming);
  for (size_t n : {size_t{8}, 16 * KiB, 256 * KiB}) {
    EXPECT_EQ(cached.cached_bytes(n, 0), n);
    EXPECT_FALSE(cached.timed(n)) << "a fixed policy reads no clock";
    EXPECT_FALSE(streaming.timed(n));
  }
  EXPECT_EQ(streaming.cached_bytes(256 * KiB, 0), 0u);
  EXPECT_EQ(streaming.cached_bytes(16 * KiB, 0), 0u);
  EXPECT_EQ(streaming.cached_bytes(16 * KiB - 8, 0), 16 * KiB - 8) << "small steps stay cached";
  for (int i = 0; i < 5; ++i) cached.record(256 * KiB, 1'000'000, i);  // 0.26 GB/s: a fixed policy ignores it
  EXPECT_FALSE(cached.streaming());
  EXPECT_TRUE(streaming.streaming());
}

TEST(SharedStores, FastCopiesStayCached) {
  SharedStores s;
  int64_t t = 0;
  for (int i = 0; i < 1000; ++i, t += 20'000) EXPECT_EQ(step(s, t, 25.0), 256 * KiB);
  EXPECT_FALSE(s.streaming());
  EXPECT_EQ(s.switches(), 0u);
  EXPECT_NEAR(s.last_gbps(), 25.0, 0.1);
}

TEST(SharedStores, ThreeSlowStepsInARowSwitchToStreaming) {
  SharedStores s;
  int64_t t = 0;
  // Two slow steps then a fast one (a page fault, a preemption): still cached.
  step(s, t, 2.4), step(s, t += 1000, 2.4), step(s, t += 1000, 20.0);
  step(s, t += 1000, 2.4), step(s, t += 1000, 2.4);
  EXPECT_FALSE(s.streaming());
  // Steps too small to time neither count nor break the run.
  EXPECT_EQ(step(s, t += 1000, 0.1, 8 * KiB), 8 * KiB);
  EXPECT_FALSE(s.streaming());
  step(s, t += 1000, 2.4);
  EXPECT_TRUE(s.streaming());
  EXPECT_EQ(s.switches(), 1u);
  // Streaming from here: large steps stream whole, small ones stay cached.
  EXPECT_EQ(s.cached_bytes(256 * KiB, t + 1000), 0u);
  EXPECT_EQ(s.cached_bytes(16 * KiB, t + 1000), 0u);
  EXPECT_EQ(s.cached_bytes(16 * KiB - 8, t + 1000), 16 * KiB - 8);
  // Exactly at the threshold (6 GB/s) is not slow.
  SharedStores edge;
  for (int i = 0; i < 5; ++i) step(edge, i * 1000, SharedStores::kSlowGBps);
  EXPECT_FALSE(edge.streaming());
}

// A probe: kProbeSteps steps cached, judged on the last (the first cached
// step after streaming ones measured fast between far cores too).
void probe(SharedStores& s, int64_t t, double first_gbps, double rest_gbps) {
  for (int i = 0; i < SharedStores::kProbeSteps; ++i)
    EXPECT_EQ(step(s, t + i, i == 0 ? first_gbps : rest_gbps), 256 * KiB) << "probe step " << i;
}

TEST(SharedStores, ProbesBackOffAndAFastProbeSwitchesBack) {
  SharedStores s;
  int64_t t = 0;
  for (int i = 0; i < 3; ++i) step(s, t += 1000, 2.0);
  ASSERT_TRUE(s.streaming());
  const int64_t switched = t;
  // The first probe 1 ms after the switch; before it nothing is cached.
  EXPECT_EQ(step(s, switched + kMs - 1, 2.0), 0u);
  probe(s, switched + kMs, 12.0, 2.5);
  EXPECT_EQ(s.probes(), 1u);
  EXPECT_TRUE(s.streaming()) << "a probe fast only in its first step keeps streaming";
  // Gaps double while the probes stay slow: 2, 4, ... 64, 64 ms.
  int64_t last = switched + kMs + SharedStores::kProbeSteps - 1;
  for (int64_t gap : {2, 4, 8, 16, 32, 64, 64}) {
    EXPECT_EQ(step(s, last + gap * kMs - 1, 2.0), 0u) << "gap " << gap;
    probe(s, last + gap * kMs, 2.0, 2.0);
    last += gap * kMs + SharedStores::kProbeSteps - 1;
  }
  EXPECT_EQ(s.probes(), 8u);
  EXPECT_TRUE(s.streaming());
  // A step too small to time stays cached and neither starts a probe nor
  // counts in one.
  EXPECT_EQ(step(s, last + 64 * kMs, 0.5, 8 * KiB), 8 * KiB);
  EXPECT_EQ(step(s, last + 64 * kMs, 24.0), 256 * KiB);
  EXPECT_EQ(step(s, last + 64 * kMs + 1, 0.5, 8 * KiB), 8 * KiB);
  EXPECT_EQ(step(s, last + 64 * kMs + 2, 24.0), 256 * KiB);
  EXPECT_TRUE(s.streaming()) << "the probe's last step not yet taken";
  EXPECT_EQ(step(s, last + 64 * kMs + 3, 24.0), 256 * KiB);
  EXPECT_FALSE(s.streaming()) << "a fast probe ends the streaming";
  EXPECT_EQ(s.switches(), 2u);
  EXPECT_EQ(step(s, last + 70 * kMs, 24.0), 256 * KiB);
  // Slow again: the back-off starts over at 1 ms.
  for (int i = 0; i < 3; ++i) step(s, t = last + 80 * kMs + i, 2.0);
  ASSERT_TRUE(s.streaming());
  EXPECT_EQ(step(s, t + kMs - 1, 2.0), 0u);
  EXPECT_EQ(step(s, t + kMs, 2.0), 256 * KiB);
}

TEST(SharedStores, TheVariable) {
  unsetenv("LOOM_SHM_STREAM_STORES");
  EXPECT_EQ(params::shm_stream_stores(), -1);
  const std::pair<const char*, int> cases[] = {{"auto", -1}, {"AUTO", -1}, {"1", 1}, {"on", 1}, {"yes", 1},
                                               {"0", 0},     {"off", 0},   {"false", 0}, {"fast", -1}};
  for (const auto& [v, want] : cases) {
    setenv("LOOM_SHM_STREAM_STORES", v, 1);
    EXPECT_EQ(params::shm_stream_stores(), want) << v;
  }
  unsetenv("LOOM_SHM_STREAM_STORES");
}

}  // namespace
}  // namespace loom
