// ncclCommRevoke with NCCL 2.28's semantics, 4 non-blocking ranks driven from
// one thread: a large allreduce that one rank never joins is stopped by the
// others' revoke, the state goes ncclInProgress -> ncclSuccess, the revoked
// communicator refuses work and Finalize, and Split or Shrink of it still
// gives a working communicator.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "nccl.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kN = 4;
constexpr int kLate = 3;  // the rank that never joins the big allreduce
constexpr size_t kBig = 4 << 20;  // floats: far more than one FIFO round

ncclConfig_t non_blocking() {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  return cfg;
}

// Polls until the state leaves ncclInProgress (or 20 s pass); every value seen
// before must have been ncclInProgress.
ncclResult_t settle(ncclComm_t comm, int* in_progress_seen = nullptr) {
  ncclResult_t state = ncclInProgress;
  auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
    if (state != ncclInProgress) return state;
    if (in_progress_seen) ++*in_progress_seen;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return state;
}

struct World {
  ncclComm_t c[kN] = {};
  World() {
    ncclUniqueId id;
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclConfig_t cfg = non_blocking();
    EXPECT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < kN; ++r) EXPECT_EQ(ncclCommInitRankConfig(&c[r], kN, id, r, &cfg), ncclSuccess);
    ncclResult_t end = ncclGroupEnd();
    EXPECT_TRUE(end == ncclSuccess || end == ncclInProgress) << end;
    for (auto x : c) EXPECT_EQ(settle(x), ncclSuccess) << ncclGetLastError(x);
  }
  ~World() {
    for (auto x : c)
      if (x != nullptr) {
        EXPECT_EQ(ncclCommDestroy(x), ncclSuccess) << ncclGetLastError(x);
      }
  }
};

// Ranks 0..2 start a large allreduce without rank kLate and revoke it. Returns
// the buffers (kept alive until the comms are destroyed).
std::vector<std::vector<float>> start_and_revoke(World& w) {
  std::vector<std::vector<float>> bufs(kN);
  for (int r = 0; r < kN; ++r) {
    if (r == kLate) continue;
    bufs[r].assign(kBig, 1.0f);
    EXPECT_EQ(ncclAllReduce(bufs[r].data(), bufs[r].data(), kBig, ncclFloat, ncclSum, w.c[r], nullptr),
              ncclInProgress);
  }
  // The allreduce cannot finish: it waits for rank kLate.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (int r = 0; r < kN; ++r) {
    if (r == kLate) continue;
    ncclResult_t state = ncclSuccess;
    EXPECT_EQ(ncclCommGetAsyncError(w.c[r], &state), ncclSuccess);
    EXPECT_EQ(state, ncclInProgress) << "rank " << r;
  }
  const auto t0 = Clock::now();
  for (int r = 0; r < kN; ++r) {
    if (r == kLate) continue;
    // The state is in progress while the revoked allreduce ends.
    EXPECT_EQ(ncclCommRevoke(w.c[r], NCCL_REVOKE_DEFAULT), ncclInProgress) << ncclGetLastError(w.c[r]);
  }
  for (int r = 0; r < kN; ++r) {
    if (r == kLate) continue;
    EXPECT_EQ(settle(w.c[r]), ncclSuccess) << "rank " << r << ": " << ncclGetLastError(w.c[r]);
    // What ended the operation is still told.
    EXPECT_NE(std::string(ncclGetLastError(w.c[r])).find("revoked by rank"), std::string::npos)
        << ncclGetLastError(w.c[r]);
  }
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3)) << "revoked operations took too long to end";
  return bufs;
}

// The late rank was not part of the revoke: when it finally joins the
// allreduce, the operation fails (does not hang) because its peers revoked;
// then it revokes too.
void late_rank_fails_then_revokes(World& w) {
  std::vector<float> v(kBig, 1.0f);
  const auto t0 = Clock::now();
  ncclResult_t r = ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat, ncclSum, w.c[kLate], nullptr);
  EXPECT_TRUE(r == ncclInProgress || r == ncclRemoteError) << r;
  if (r == ncclInProgress) {
    EXPECT_EQ(settle(w.c[kLate]), ncclRemoteError);
  }
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));
  EXPECT_NE(std::string(ncclGetLastError(w.c[kLate])).find("revoked by rank"), std::string::npos)
      << ncclGetLastError(w.c[kLate]);
  r = ncclCommRevoke(w.c[kLate], NCCL_REVOKE_DEFAULT);
  EXPECT_TRUE(r == ncclInProgress || r == ncclSuccess) << r;
  EXPECT_EQ(settle(w.c[kLate]), ncclSuccess);
}

void check_revoked_comm_refuses(ncclComm_t comm) {
  int v = 1;
  EXPECT_EQ(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, nullptr), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("revoked"), std::string::npos) << ncclGetLastError(comm);
  EXPECT_EQ(ncclSend(&v, 1, ncclInt32, 1, comm, nullptr), ncclInvalidUsage);
  EXPECT_EQ(ncclCommFinalize(comm), ncclInvalidUsage);
  ncclResult_t state = ncclInternalError;
  ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
  EXPECT_EQ(state, ncclSuccess);  // revoke completed; the refusals are not async errors
}

// Allreduce on the new communicators: rank r (of the old numbering) adds r+1
// at element i, plus i.
void check_allreduce(ncclComm_t* sub, const std::vector<int>& members) {
  const size_t n = 4096;
  std::vector<std::vector<int32_t>> v(kN);
  for (int r : members) {
    v[r].resize(n);
    for (size_t i = 0; i < n; ++i) v[r][i] = (r + 1) + static_cast<int32_t>(i);
    ncclResult_t res = ncclAllReduce(v[r].data(), v[r].data(), n, ncclInt32, ncclSum, sub[r], nullptr);
    ASSERT_TRUE(res == ncclInProgress || res == ncclSuccess) << res << " " << ncclGetLastError(sub[r]);
  }
  int32_t weight = 0;
  for (int r : members) weight += r + 1;
  for (int r : members) {
    ASSERT_EQ(settle(sub[r]), ncclSuccess) << ncclGetLastError(sub[r]);
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(v[r][i], weight + static_cast<int32_t>(members.size() * i)) << "rank " << r << " element " << i;
  }
}

TEST(NcclRevoke, StopsInFlightWorkThenSplitWorks) {
  World w;
  auto bufs = start_and_revoke(w);
  late_rank_fails_then_revokes(w);
  for (auto x : w.c) check_revoked_comm_refuses(x);

  // Split of the revoked comm (every rank; key reverses the order), asking
  // for splitShare, which is ignored while revoked.
  ncclConfig_t cfg = non_blocking();
  cfg.splitShare = 1;
  ncclComm_t sub[kN] = {};
  for (int r = 0; r < kN; ++r) {
    ncclResult_t res = ncclCommSplit(w.c[r], 5, kN - r, &sub[r], &cfg);
    ASSERT_TRUE(res == ncclInProgress || res == ncclSuccess) << res << " " << ncclGetLastError(w.c[r]);
  }
  for (int r = 0; r < kN; ++r) {
    ASSERT_EQ(settle(sub[r]), ncclSuccess) << "rank " << r << ": " << ncclGetLastError(sub[r]);
    int n = 0, me = -1;
    ASSERT_EQ(ncclCommCount(sub[r], &n), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(sub[r], &me), ncclSuccess);
    EXPECT_EQ(n, kN);
    EXPECT_EQ(me, kN - 1 - r);
  }
  check_allreduce(sub, {0, 1, 2, 3});
  for (auto s : sub) EXPECT_EQ(ncclCommDestroy(s), ncclSuccess) << ncclGetLastError(s);
}

TEST(NcclRevoke, ShrinkOfARevokedCommWorks) {
  World w;
  auto bufs = start_and_revoke(w);
  for (int r = 0; r < kN; ++r)
    if (r != kLate) check_revoked_comm_refuses(w.c[r]);

  // The late rank is excluded (it may as well be dead) and takes no part.
  ncclConfig_t cfg = non_blocking();
  cfg.shrinkShare = 1;  // ignored while revoked
  int excluded = kLate;
  ncclComm_t sub[kN] = {};
  for (int r = 0; r < kN; ++r) {
    if (r == kLate) continue;
    ncclResult_t res = ncclCommShrink(w.c[r], &excluded, 1, &sub[r], &cfg, NCCL_SHRINK_DEFAULT);
    ASSERT_TRUE(res == ncclInProgress || res == ncclSuccess) << res << " " << ncclGetLastError(w.c[r]);
  }
  for (int r = 0; r < kN; ++r) {
    if (r == kLate) continue;
    ASSERT_EQ(settle(sub[r]), ncclSuccess) << "rank " << r << ": " << ncclGetLastError(sub[r]);
    int n = 0;
    ASSERT_EQ(ncclCommCount(sub[r], &n), ncclSuccess);
    EXPECT_EQ(n, kN - 1);
  }
  check_allreduce(sub, {0, 1, 2});
  for (int r = 0; r < kN; ++r)
    if (r != kLate) {
      EXPECT_EQ(ncclCommDestroy(sub[r]), ncclSuccess) << ncclGetLastError(sub[r]);
    }
}

TEST(NcclRevoke, BlockingCommRevokeReturnsWhenQuiescent) {
  ncclComm_t c[kN] = {};
  ASSERT_EQ(ncclCommInitAll(c, kN, nullptr), ncclSuccess);
  for (auto x : c) EXPECT_EQ(ncclCommRevoke(x, NCCL_REVOKE_DEFAULT), ncclSuccess);
  for (auto x : c) {
    ncclResult_t state = ncclInternalError;
    ASSERT_EQ(ncclCommGetAsyncError(x, &state), ncclSuccess);
    EXPECT_EQ(state, ncclSuccess);
  }
  EXPECT_EQ(ncclCommRevoke(c[0], 7), ncclInvalidArgument);
  // A blocking split after revoke (needs every rank at once: one thread each),
  // with a rank that takes no part.
  ncclComm_t sub[kN] = {};
  std::vector<std::thread> t;
  ncclResult_t res[kN];
  for (int r = 0; r < kN; ++r)
    t.emplace_back([&, r] { res[r] = ncclCommSplit(c[r], r == 0 ? NCCL_SPLIT_NOCOLOR : 1, r, &sub[r], nullptr); });
  for (auto& th : t) th.join();
  for (int r = 0; r < kN; ++r) ASSERT_EQ(res[r], ncclSuccess) << r << ": " << ncclGetLastError(c[r]);
  EXPECT_EQ(sub[0], nullptr);
  for (int r = 1; r < kN; ++r) {
    int me = -1;
    ASSERT_EQ(ncclCommUserRank(sub[r], &me), ncclSuccess);
    EXPECT_EQ(me, r - 1);
  }
  // Blocking comms run a lone call to completion: one thread per rank.
  std::vector<int> v(kN, 0);
  t.clear();
  for (int r = 1; r < kN; ++r)
    t.emplace_back([&, r] {
      v[r] = r;
      res[r] = ncclAllReduce(&v[r], &v[r], 1, ncclInt32, ncclSum, sub[r], nullptr);
    });
  for (auto& th : t) th.join();
  for (int r = 1; r < kN; ++r) {
    EXPECT_EQ(res[r], ncclSuccess) << ncclGetLastError(sub[r]);
    EXPECT_EQ(v[r], 1 + 2 + 3);
    EXPECT_EQ(ncclCommDestroy(sub[r]), ncclSuccess);
  }
  for (auto x : c) EXPECT_EQ(ncclCommDestroy(x), ncclSuccess) << ncclGetLastError(x);
}

}  // namespace

namespace {

// PyTorch's watchdog ends a hung collective by calling ncclCommAbort from its
// own thread while the collective's thread is still inside the call (here a
// blocking allreduce that rank 1 never joins). The call must return with an
// error, and Abort must not free the communicator under it. Regression: the
// woken call locked the freed communicator's mutex on its way out (a
// heap-use-after-free under ASan; a normal build mostly got away with it).
TEST(NcclAbort, FromAnotherThreadEndsAHungCall) {
  ncclComm_t c[2] = {};
  ASSERT_EQ(ncclCommInitAll(c, 2, nullptr), ncclSuccess);
  std::vector<float> buf(1 << 20, 1.0f);
  std::atomic<bool> returned{false};
  ncclResult_t res = ncclSuccess;
  std::thread caller([&] {
    res = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, c[0], nullptr);
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(returned.load()) << "the allreduce cannot finish without rank 1";
  const auto t0 = Clock::now();
  EXPECT_EQ(ncclCommAbort(c[0]), ncclSuccess);
  caller.join();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  EXPECT_NE(res, ncclSuccess) << "an aborted allreduce reported success";
  EXPECT_EQ(ncclCommAbort(c[1]), ncclSuccess);
}

// A non-blocking init whose peer never comes (rank 1 of 2 never calls):
// ncclCommAbort must end it at once, not after the init timeout. Regression:
// Abort waited for the init to fail by itself at LOOM_TIMEOUT (here set to
// 60 s, so the old code takes a minute).
TEST(NcclAbort, OfACommStillInitialising) {
  setenv("LOOM_TIMEOUT", "60", 1);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t c = nullptr;
  EXPECT_EQ(ncclCommInitRankConfig(&c, 2, id, 0, &cfg), ncclInProgress);
  ASSERT_NE(c, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // well into the wait for rank 1
  ncclResult_t state = ncclSuccess;
  EXPECT_EQ(ncclCommGetAsyncError(c, &state), ncclSuccess);
  EXPECT_EQ(state, ncclInProgress) << "the init cannot finish without rank 1";
  const auto t0 = Clock::now();
  EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  unsetenv("LOOM_TIMEOUT");
}

}  // namespace
