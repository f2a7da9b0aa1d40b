// The NCCL C API on one thread driving N ranks (ncclCommInitAll, grouped
// calls): group semantics, non-blocking communicators, Split/Shrink/Revoke
// and errors inside groups. Multi-process coverage is in tests/abi.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/shared_buffers.h"
#include "nccl.h"
#include "unit/nccl_comms.h"

namespace {

constexpr int kN = 4;

using Comms = loom::testing::NcclComms<kN>;

// A config asking for a non-blocking communicator.
ncclConfig_t non_blocking() {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  return cfg;
}

ncclResult_t wait_ready(ncclComm_t comm) {
  ncclResult_t state = ncclInProgress;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (state == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
    if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return state;
}

// ncclMemAlloc hands out loom::mem_alloc memory, which peers of this host
// read through a mapping (tests/multiproc/test_shared_buffers.cc), and
// ncclMemFree returns it.
TEST(NcclApi, MemAllocGivesBuffersPeersCanMap) {
  void* p = nullptr;
  ASSERT_EQ(ncclMemAlloc(&p, 3 << 20), ncclSuccess);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % NCCL_WIN_REQUIRED_ALIGNMENT, 0u);
  EXPECT_TRUE(loom::shared_buffers::find(p, 3 << 20).has_value());
  EXPECT_EQ(ncclMemFree(p), ncclSuccess);
  EXPECT_FALSE(loom::shared_buffers::find(p, 1).has_value());
}

TEST(NcclApi, GatherScatterAndAllReduceInOneGroup) {
  Comms w;
  const int root = 2, n = 5;
  std::vector<int> send[kN], gathered(kN * n, -1), scat[kN], sum[kN];
  std::vector<int> root_src(kN * n);
  for (int i = 0; i < kN * n; ++i) root_src[i] = 100 + i;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kN; ++r) {
    send[r].assign(n, r * 10);
    scat[r].assign(n, -1);
    sum[r].assign(n, r);
    ASSERT_EQ(ncclGather(send[r].data(), r == root ? gathered.data() : nullptr, n, ncclInt32, root,
                         w.c[r], nullptr), ncclSuccess);
    ASSERT_EQ(ncclScatter(r == root ? root_src.data() : nullptr, scat[r].data(), n, ncclInt32, root,
                          w.c[r], nullptr), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(sum[r].data(), sum[r].data(), n, ncclInt32, ncclSum, w.c[r], nullptr),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < kN; ++r)
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(gathered[r * n + i], r * 10);
      EXPECT_EQ(scat[r][i], 100 + r * n + i);
      EXPECT_EQ(sum[r][i], 0 + 1 + 2 + 3);
    }
}

TEST(NcclApi, AFailedCallDiscardsItsGroup) {
  Comms w;
  float v[kN] = {1, 1, 1, 1};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(ncclAllReduce(&v[r], &v[r], 1, ncclFloat, ncclSum, w.c[r], nullptr), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(&v[0], &v[0], 1, (ncclDataType_t)99, ncclSum, w.c[0], nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("datatype"), std::string::npos);
  for (float x : v) EXPECT_EQ(x, 1.0f);  // nothing ran
  // The next group is clean.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(ncclAllReduce(&v[r], &v[r], 1, ncclFloat, ncclSum, w.c[r], nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (float x : v) EXPECT_EQ(x, 4.0f);
}

TEST(NcclApi, SimulateEndEstimatesWithoutRunning) {
  Comms w;
  std::vector<float> big[kN];
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kN; ++r) {
    big[r].assign(1 << 16, 2.0f);
    ASSERT_EQ(ncclAllReduce(big[r].data(), big[r].data(), big[r].size(), ncclFloat, ncclSum, w.c[r],
                            nullptr), ncclSuccess);
  }
  ncclSimInfo_t small_sim = NCCL_SIM_INFO_INITIALIZER;
  ASSERT_EQ(ncclGroupSimulateEnd(&small_sim), ncclSuccess);
  for (auto& b : big) EXPECT_EQ(b[0], 2.0f);
  // A larger message is estimated to take longer.
  ncclSimInfo_t big_sim = NCCL_SIM_INFO_INITIALIZER;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kN; ++r)
    for (int k = 0; k < 4; ++k)
      ASSERT_EQ(ncclAllReduce(big[r].data(), big[r].data(), big[r].size(), ncclFloat, ncclSum,
                              w.c[r], nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupSimulateEnd(&big_sim), ncclSuccess);
  EXPECT_GT(small_sim.estimatedTime, 0.0f);
  EXPECT_GT(big_sim.estimatedTime, small_sim.estimatedTime);
}

// SimulateEnd ends the group whatever its simInfo, as NCCL's
// ncclGroupEndInternal: NULL runs it like GroupEnd, a bad magic drops it
// with ncclInvalidArgument, and a group with a failed call returns that
// error. Regression: a NULL or bad simInfo left the group open, so a later
// standalone allreduce returned success without running.
TEST(NcclApi, SimulateEndAlwaysEndsTheGroup) {
  Comms w;
  int v[kN];
  auto group_allreduce = [&](int start) {
    for (int r = 0; r < kN; ++r) v[r] = start + r;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < kN; ++r) ASSERT_EQ(ncclAllReduce(&v[r], &v[r], 1, ncclInt32, ncclSum, w.c[r], nullptr), ncclSuccess);
  };
  ncclSimInfo_t bad = NCCL_SIM_INFO_INITIALIZER;
  bad.magic = 0;
  group_allreduce(1);
  EXPECT_EQ(ncclGroupSimulateEnd(&bad), ncclInvalidArgument);
  EXPECT_EQ(v[0], 1) << "a group ended by a bad simInfo ran";
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage) << "the group should be over";
  // Not in a group any more: a grouped allreduce ends normally and runs.
  group_allreduce(1);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(v[0], 10);
  // NULL: a plain GroupEnd.
  group_allreduce(2);
  EXPECT_EQ(ncclGroupSimulateEnd(nullptr), ncclSuccess);
  for (int x : v) EXPECT_EQ(x, 14);
  // A failed call in the group: its error, nothing runs.
  group_allreduce(3);
  EXPECT_EQ(ncclAllReduce(&v[0], &v[0], 1, static_cast<ncclDataType_t>(99), ncclSum, w.c[0], nullptr),
            ncclInvalidArgument);
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclInvalidArgument);
  EXPECT_EQ(v[0], 3);
  EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclInvalidUsage) << "outside a group";
}

// Inside a group, only the calls NCCL checks with ncclGroupErrCheck
// (collectives, p2p, init/split/shrink, finalize/destroy/abort, window
// registration) fail the group; a failed query or operator call does not.
TEST(NcclApi, OnlyEnqueueAndLifecycleCallsFailAGroup) {
  Comms w;
  int v[kN];
  for (int r = 0; r < kN; ++r) v[r] = r + 1;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kN; ++r) ASSERT_EQ(ncclAllReduce(&v[r], &v[r], 1, ncclInt32, ncclSum, w.c[r], nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommCount(w.c[0], nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclRedOpDestroy(ncclSum, w.c[0]), ncclInvalidArgument);
  EXPECT_EQ(ncclCommDeregister(w.c[0], reinterpret_cast<void*>(0x1234)), ncclInvalidUsage);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int x : v) EXPECT_EQ(x, 10);
  // A failed collective does fail it.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kN; ++r) ASSERT_EQ(ncclAllReduce(&v[r], &v[r], 1, ncclInt32, ncclSum, w.c[r], nullptr), ncclSuccess);
  EXPECT_EQ(ncclBroadcast(&v[0], &v[0], 1, ncclInt32, kN, w.c[0], nullptr), ncclInvalidArgument);  // root out of range
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  for (int x : v) EXPECT_EQ(x, 10) << "a failed group ran";
}

TEST(NcclApi, NestedGroupsRunAtTheOutermostEnd) {
  Comms w;
  int v[kN] = {1, 2, 3, 4};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(ncclAllReduce(&v[r], &v[r], 1, ncclInt32, ncclMax, w.c[r], nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(v[0], 1);  // not yet
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int x : v) EXPECT_EQ(x, 4);
}

TEST(NcclApi, NonBlockingCommunicatorsInitAndRunInProgress) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t c[kN];
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kN; ++r) ASSERT_EQ(ncclCommInitRankConfig(&c[r], kN, id, r, &cfg), ncclSuccess);
  ncclResult_t end = ncclGroupEnd();
  EXPECT_TRUE(end == ncclInProgress || end == ncclSuccess) << end;
  for (auto x : c) ASSERT_EQ(wait_ready(x), ncclSuccess) << ncclGetLastError(x);
  double v[kN] = {1, 2, 3, 4};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(ncclAllReduce(&v[r], &v[r], 1, ncclDouble, ncclProd, c[r], nullptr), ncclSuccess);
  end = ncclGroupEnd();
  EXPECT_TRUE(end == ncclInProgress || end == ncclSuccess) << end;
  for (auto x : c) ASSERT_EQ(wait_ready(x), ncclSuccess);
  for (double x : v) EXPECT_EQ(x, 24.0);
  for (auto x : c) EXPECT_EQ(ncclCommDestroy(x), ncclSuccess);
}

TEST(NcclApi, SplitInAGroupAndShrinkArguments) {
  Comms w;
  ncclComm_t sub[kN] = {};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(ncclCommSplit(w.c[r], r == 0 ? NCCL_SPLIT_NOCOLOR : 1, r, &sub[r], nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(sub[0], nullptr);
  for (int r = 1; r < kN; ++r) {
    int n = 0, me = -1;
    ASSERT_EQ(ncclCommCount(sub[r], &n), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(sub[r], &me), ncclSuccess);
    EXPECT_EQ(n, 3);
    EXPECT_EQ(me, r - 1);
    EXPECT_EQ(ncclCommDestroy(sub[r]), ncclSuccess);
  }

  // Shrinks that exclude ranks are tested in tests/inproc/test_shrink.cc and
  // tests/multiproc/test_shrink.cc; here only the local argument checks.
  // As NCCL (ncclCommInitChildComm): an empty exclude list is
  // ncclInvalidArgument. Regression: it made a duplicate of the parent.
  int excluded = 3, self = 0;
  ncclComm_t none = nullptr;
  EXPECT_EQ(ncclCommShrink(w.c[0], nullptr, 0, &none, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
  EXPECT_EQ(ncclCommShrink(w.c[0], &excluded, 0, &none, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
  EXPECT_EQ(ncclCommShrink(w.c[0], nullptr, 1, &none, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
  EXPECT_EQ(none, nullptr);
  EXPECT_EQ(ncclCommShrink(w.c[0], &self, 1, &none, nullptr, NCCL_SHRINK_ABORT), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(w.c[0])).find("excludes itself"), std::string::npos);
}

TEST(NcclApi, RevokedAndFinalizedCommsRefuseWork) {
  Comms w;
  int v = 1;
  ASSERT_EQ(ncclCommRevoke(w.c[0], NCCL_REVOKE_DEFAULT), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, w.c[0], nullptr), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(w.c[0])).find("revoked"), std::string::npos);
  EXPECT_EQ(ncclCommFinalize(w.c[0]), ncclInvalidUsage);
  ASSERT_EQ(ncclCommFinalize(w.c[1]), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, w.c[1], nullptr), ncclInvalidUsage);
  // (How peers see a revoke/abort is covered across processes in tests/abi.)
}

TEST(NcclApi, GetAsyncErrorAndQueries) {
  Comms w;
  ncclResult_t e = ncclInternalError;
  ASSERT_EQ(ncclCommGetAsyncError(w.c[1], &e), ncclSuccess);
  EXPECT_EQ(e, ncclSuccess);
  EXPECT_EQ(ncclCommGetAsyncError(w.c[1], nullptr), ncclInvalidArgument);
  int dev = -1;
  ASSERT_EQ(ncclCommCuDevice(w.c[3], &dev), ncclSuccess);
  EXPECT_EQ(dev, 3);  // InitAll without a devlist: device i for rank i
  EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommAbort(nullptr), ncclSuccess);
}

// ncclGetLastError(comm) may come from a watchdog thread while the comm's
// own thread keeps failing calls (each replaces the comm's error text). The
// returned text must stay readable: the pointer belongs to the caller's
// thread. Regression: it pointed into the comm's string, which the other
// thread reallocated (a heap-use-after-free under ASan).
TEST(NcclApi, LastErrorOfACommIsReadableWhileAnotherThreadFails) {
  Comms comms;
  std::atomic<bool> stop{false};
  std::thread failing([&] {
    float x = 0;
    for (int i = 0; i < 3000; ++i) {
      // Two messages of different lengths, so the text is reallocated.
      if (i % 2) (void)ncclAllReduce(&x, &x, 1, static_cast<ncclDataType_t>(99), ncclSum, comms.c[0], nullptr);
      else (void)ncclBroadcast(&x, &x, 1, ncclFloat, 12345, comms.c[0], nullptr);
    }
    stop = true;
  });
  size_t reads = 0, total = 0;
  while (!stop.load()) {
    const char* e = ncclGetLastError(comms.c[0]);
    total += std::string(e).size();
    ++reads;
  }
  failing.join();
  EXPECT_GT(reads, 0u);
  EXPECT_NE(std::string(ncclGetLastError(comms.c[0])).find("ncclAllReduce"), std::string::npos)
      << ncclGetLastError(comms.c[0]);
  (void)total;
}

// ncclCommInitAll's argument checks return NCCL's codes (its init.cc): a
// device listed twice is ncclInvalidUsage, a negative count or device
// ncclInvalidArgument, and ndev 0 succeeds with nothing created.
// Regression: Loom returned ncclInvalidArgument for all four.
TEST(NcclApi, InitAllChecksArgumentsWithNcclsCodes) {
  ncclComm_t c[2] = {nullptr, nullptr};
  const int twice[2] = {0, 0}, negative[2] = {0, -1};
  EXPECT_EQ(ncclCommInitAll(c, 2, twice), ncclInvalidUsage);
  EXPECT_EQ(ncclCommInitAll(c, 2, negative), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitAll(c, -1, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitAll(c, 0, nullptr), ncclSuccess);
  EXPECT_EQ(c[0], nullptr);
  EXPECT_EQ(c[1], nullptr);
}

// Whether a communicator is blocking shows in its creation call: a
// one-rank communicator is ready at once, so a blocking InitRankConfig or
// Split returns ncclSuccess and a non-blocking one ncclInProgress.
ncclResult_t init_one(ncclComm_t* c, const ncclConfig_t* cfg) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return ncclInternalError;
  return ncclCommInitRankConfig(c, 1, id, 0, const_cast<ncclConfig_t*>(cfg));
}

// NCCL_COMM_BLOCKING=0|1 overrides ncclConfig_t.blocking (NCCL's
// envConfigOverride), whether the config sets it or not; other values are
// ignored. Regression: the variable only filled in a config's unset field.
TEST(NcclApi, CommBlockingEnvOverridesTheConfig) {
  struct Case {
    const char* env;  // nullptr: unset
    int blocking;     // the config's; NCCL_CONFIG_UNDEF_INT: left unset
    ncclResult_t want;
  };
  for (const Case& k : {Case{"0", 1, ncclInProgress}, Case{"1", 0, ncclSuccess}, Case{"0", NCCL_CONFIG_UNDEF_INT, ncclInProgress},
                        Case{nullptr, 0, ncclInProgress}, Case{nullptr, NCCL_CONFIG_UNDEF_INT, ncclSuccess},
                        Case{"yes", 0, ncclInProgress}}) {
    if (k.env) setenv("NCCL_COMM_BLOCKING", k.env, 1);
    else unsetenv("NCCL_COMM_BLOCKING");
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = k.blocking;
    ncclComm_t c = nullptr;
    EXPECT_EQ(init_one(&c, &cfg), k.want) << "NCCL_COMM_BLOCKING=" << (k.env ? k.env : "(unset)")
                                          << " config.blocking=" << k.blocking;
    unsetenv("NCCL_COMM_BLOCKING");
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(wait_ready(c), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
}

// A split without a config inherits the parent's blocking; one with a
// config starts from the defaults (blocking), as NCCL's parseCommConfig.
// Regression: a config that left `blocking` unset kept the parent's. (The
// split itself runs in the parent's mode, non-blocking here, whatever the
// child's: NcclCompat.SplitOfNonBlockingParentsNeverWaits.)
TEST(NcclApi, SplitWithAConfigStartsFromTheDefaults) {
  ncclConfig_t nb = NCCL_CONFIG_INITIALIZER;
  nb.blocking = 0;
  ncclComm_t parent = nullptr;
  ASSERT_EQ(init_one(&parent, &nb), ncclInProgress);
  ASSERT_EQ(wait_ready(parent), ncclSuccess);
  ncclComm_t inherited = nullptr, fresh = nullptr;
  EXPECT_EQ(ncclCommSplit(parent, 0, 0, &inherited, nullptr), ncclInProgress);
  ASSERT_NE(inherited, nullptr);
  ASSERT_EQ(wait_ready(parent), ncclSuccess);
  EXPECT_EQ(wait_ready(inherited), ncclSuccess);
  ncclConfig_t unset = NCCL_CONFIG_INITIALIZER;
  EXPECT_EQ(ncclCommSplit(parent, 0, 0, &fresh, &unset), ncclInProgress);
  ASSERT_NE(fresh, nullptr);
  ASSERT_EQ(wait_ready(parent), ncclSuccess);
  ASSERT_EQ(wait_ready(fresh), ncclSuccess);
  // The children's own modes: a call on the blocking one has finished when
  // it returns, the non-blocking one's is in progress.
  float x = 1, y = 0;
  EXPECT_EQ(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, fresh, nullptr), ncclSuccess);
  EXPECT_EQ(y, 1.0f);
  EXPECT_EQ(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, inherited, nullptr), ncclInProgress);
  // (ncclCommShrink parses its config the same way, parse_config; a shrink
  // needs a rank to exclude, so it is not run on this one-rank parent.)
  for (ncclComm_t c : {inherited, fresh, parent}) {
    EXPECT_EQ(wait_ready(c), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
}

// A PreMulSum operator belongs to the communicator that made it (NCCL
// mangles its value with the communicator): used or destroyed on another
// one it is ncclInvalidArgument. Regression: operators were numbered per
// communicator from the same base, so comm B's allreduce with comm A's
// operator silently scaled by B's scalar, and RedOpDestroy(opA, B) destroyed
// B's operator.
TEST(NcclApi, PreMulSumOperatorsBelongToTheirCommunicator) {
  Comms a, b;
  float two = 2.0f, three = 3.0f;
  ncclRedOp_t op_a, op_b;
  ASSERT_EQ(ncclRedOpCreatePreMulSum(&op_a, &two, ncclFloat, ncclScalarHostImmediate, a.c[0]), ncclSuccess);
  ASSERT_EQ(ncclRedOpCreatePreMulSum(&op_b, &three, ncclFloat, ncclScalarHostImmediate, b.c[0]), ncclSuccess);
  EXPECT_NE(op_a, op_b);
  float x = 1.0f;
  EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclFloat, op_a, b.c[0], nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(b.c[0])).find("not one of this communicator's"), std::string::npos)
      << ncclGetLastError(b.c[0]);
  EXPECT_EQ(ncclRedOpDestroy(op_a, b.c[0]), ncclInvalidArgument);
  // op_b still works on every rank of b (each rank makes its own, as in NCCL).
  ncclRedOp_t ops[kN];
  ops[0] = op_b;
  for (int r = 1; r < kN; ++r)
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&ops[r], &three, ncclFloat, ncclScalarHostImmediate, b.c[r]), ncclSuccess);
  float v[kN] = {1, 1, 1, 1};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kN; ++r) ASSERT_EQ(ncclAllReduce(&v[r], &v[r], 1, ncclFloat, ops[r], b.c[r], nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (float y : v) EXPECT_EQ(y, 3.0f * kN);
  for (int r = 0; r < kN; ++r) EXPECT_EQ(ncclRedOpDestroy(ops[r], b.c[r]), ncclSuccess);
  EXPECT_EQ(ncclRedOpDestroy(op_a, a.c[0]), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclFloat, op_a, a.c[0], nullptr), ncclInvalidArgument) << "used after destroy";
}

// Window registration as NCCL's dev_runtime.cc: deregistering NULL (a
// window never registered) succeeds, a failed registration leaves *win
// NULL, and flags Loom does not act on are accepted. Regression: NULL was
// ncclInvalidArgument (cleanup code checking the result threw), *win kept
// its old value, and any flag but 0/1 was refused.
TEST(NcclApi, WindowRegistrationEdgesAsNccl) {
  Comms w;
  EXPECT_EQ(ncclCommWindowDeregister(w.c[0], nullptr), ncclSuccess);
  ncclWindow_t win = reinterpret_cast<ncclWindow_t>(0x1);
  EXPECT_EQ(ncclCommWindowRegister(w.c[0], nullptr, 0, &win, NCCL_WIN_DEFAULT), ncclInvalidArgument);
  EXPECT_EQ(win, nullptr);
  std::vector<char> buf(4096);
  EXPECT_EQ(ncclCommWindowRegister(w.c[0], buf.data(), buf.size(), &win, 0x100), ncclSuccess);
  ASSERT_NE(win, nullptr);
  EXPECT_EQ(ncclCommWindowDeregister(w.c[0], win), ncclSuccess);
}

// A non-blocking communicator still initialising (its peer has not called
// init yet) is refused at once, as NCCL's ncclCommEnsureReady: queries and
// collectives return ncclInvalidArgument instead of waiting here for the
// creation (up to LOOM_TIMEOUT). Once it is ready they work.
TEST(NcclApi, ACommStillInitializingIsRefusedAtOnce) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t cfg = non_blocking();
  ncclComm_t c[2] = {};
  ASSERT_EQ(ncclCommInitRankConfig(&c[0], 2, id, 0, &cfg), ncclInProgress);
  const auto t0 = std::chrono::steady_clock::now();
  int n = 0;
  EXPECT_EQ(ncclCommCount(c[0], &n), ncclInvalidArgument);
  float x = 1.0f;
  EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, c[0], nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(c[0])).find("still initializing"), std::string::npos)
      << ncclGetLastError(c[0]);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  ASSERT_EQ(ncclCommInitRankConfig(&c[1], 2, id, 1, &cfg), ncclInProgress);
  for (auto k : c) ASSERT_EQ(wait_ready(k), ncclSuccess);
  EXPECT_EQ(ncclCommCount(c[0], &n), ncclSuccess);
  EXPECT_EQ(n, 2);
  float v[2] = {1, 2};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ncclAllReduce(&v[r], &v[r], 1, ncclFloat, ncclSum, c[r], nullptr), ncclSuccess);
  ncclResult_t end = ncclGroupEnd();
  EXPECT_TRUE(end == ncclSuccess || end == ncclInProgress) << end;
  for (auto k : c) EXPECT_EQ(wait_ready(k), ncclSuccess);
  EXPECT_EQ(v[0], 3.0f);
  for (auto k : c) EXPECT_EQ(ncclCommDestroy(k), ncclSuccess);
}

// A non-blocking split runs on its parent: until it ends the parent is in
// progress (ncclCommGetAsyncError), refuses other use and a second split
// with ncclInvalidArgument, and cannot be destroyed; ncclCommAbort of it
// waits for the split to end. PyTorch's new_group over non-blocking comms
// splits, polls the parent, then splits again. Regression: the parent read
// ncclSuccess at once and accepted a second split, which ran concurrently
// with the first over the same bootstrap (both children failed at the
// timeout), and Abort freed the parent under the running split.
TEST(NcclApi, ANonBlockingSplitKeepsItsParentInProgress) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t cfg = non_blocking();
  ncclComm_t p[2] = {};
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ncclCommInitRankConfig(&p[r], 2, id, r, &cfg), ncclInProgress);
  for (auto c : p) ASSERT_EQ(wait_ready(c), ncclSuccess);
  for (int round = 0; round < 2; ++round) {
    ncclComm_t child[2] = {};
    ASSERT_EQ(ncclCommSplit(p[0], 0, 0, &child[0], nullptr), ncclInProgress);
    ncclResult_t state = ncclSuccess;
    EXPECT_EQ(ncclCommGetAsyncError(p[0], &state), ncclSuccess);
    EXPECT_EQ(state, ncclInProgress) << "the parent of a running split";
    int n = 0;
    EXPECT_EQ(ncclCommCount(p[0], &n), ncclInvalidArgument);
    ncclComm_t again = nullptr;
    EXPECT_EQ(ncclCommSplit(p[0], 0, 0, &again, nullptr), ncclInvalidArgument) << "a second split at once";
    EXPECT_EQ(ncclCommDestroy(p[0]), ncclInvalidArgument) << "destroying the parent of a running split";
    ASSERT_EQ(ncclCommSplit(p[1], 0, 1, &child[1], nullptr), ncclInProgress);
    // NCCL's protocol: poll the parents, then the children.
    for (auto c : p) ASSERT_EQ(wait_ready(c), ncclSuccess) << "round " << round;
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(wait_ready(child[r]), ncclSuccess) << ncclGetLastError(child[r]);
      int me = -1;
      EXPECT_EQ(ncclCommUserRank(child[r], &me), ncclSuccess);
      EXPECT_EQ(me, r);
      EXPECT_EQ(ncclCommDestroy(child[r]), ncclSuccess);
    }
  }
  // Abort of a parent whose split waits for the other rank: the abort ends
  // the split's exchange and returns promptly; the child reports the error.
  ncclComm_t lone = nullptr;
  ASSERT_EQ(ncclCommSplit(p[0], 0, 0, &lone, nullptr), ncclInProgress);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(ncclCommAbort(p[0]), ncclSuccess);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  ncclResult_t child_state = ncclInProgress;
  EXPECT_EQ(ncclCommGetAsyncError(lone, &child_state), ncclSuccess);
  EXPECT_NE(child_state, ncclSuccess);
  EXPECT_NE(child_state, ncclInProgress);
  EXPECT_EQ(ncclCommAbort(lone), ncclSuccess);
  EXPECT_EQ(ncclCommAbort(p[1]), ncclSuccess);
}

// ncclCommInitRankScalable takes 1 to nranks ids (NCCL's
// ncclCommInitRankDev); more ids than ranks was accepted.
TEST(NcclApi, ScalableInitTakesOneToNranksIds) {
  ncclUniqueId ids[3];
  for (auto& id : ids) ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t c = nullptr;
  EXPECT_EQ(ncclCommInitRankScalable(&c, 2, 0, 3, ids, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRankScalable(&c, 2, 0, 0, ids, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRankScalable(&c, 1, 0, 1, ids, nullptr), ncclSuccess);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// As NCCL (init.cc, ncclCommFinalize): finalizing NULL is a no-op, a
// second finalize ncclInvalidArgument. Regression: NULL was
// ncclInvalidArgument and a second call ncclSuccess.
TEST(NcclApi, FinalizeOfNullAndTwiceAsNccl) {
  EXPECT_EQ(ncclCommFinalize(nullptr), ncclSuccess);
  ncclComm_t c = nullptr;
  ASSERT_EQ(init_one(&c, nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommFinalize(c), ncclSuccess);
  EXPECT_EQ(ncclCommFinalize(c), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(c)).find("twice"), std::string::npos) << ncclGetLastError(c);
  EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// As NCCL (enqueue.cc, ncclEnqueueCheck): an argument error in a collective
// on a non-blocking communicator becomes its asynchronous error; on a
// blocking one it is only returned. Regression: it was only returned.
TEST(NcclApi, ArgumentErrorOnANonBlockingCommIsItsAsyncError) {
  for (int blocking : {0, 1}) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = blocking;
    ncclComm_t c = nullptr;
    init_one(&c, &cfg);
    ASSERT_NE(c, nullptr);
    ASSERT_EQ(wait_ready(c), ncclSuccess);
    int v = 1;
    EXPECT_EQ(ncclAllReduce(&v, &v, 1, static_cast<ncclDataType_t>(99), ncclSum, c, nullptr), ncclInvalidArgument);
    ncclResult_t async = ncclSuccess;
    ASSERT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
    EXPECT_EQ(async, blocking ? ncclSuccess : ncclInvalidArgument) << "blocking=" << blocking;
    // The non-blocking comm refuses further work, as NCCL's ncclCommEnsureReady.
    EXPECT_EQ(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, c, nullptr), blocking ? ncclSuccess : ncclInvalidArgument);
    EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
  }
}

// The config fields NCCL 2.28's parseCommConfig refuses are refused here
// too (Loom has no kernels to apply them to). Regression: only magic, size,
// blocking and CTAPolicy were checked.
TEST(NcclApi, ConfigFieldsNcclRefusesAreRefused) {
  struct Case {
    const char* name;
    void (*set)(ncclConfig_t&);
    ncclResult_t want;
  };
  const Case cases[] = {
      {"cgaClusterSize=-1", [](ncclConfig_t& c) { c.cgaClusterSize = -1; }, ncclInvalidArgument},
      {"minCTAs=0", [](ncclConfig_t& c) { c.minCTAs = 0; c.maxCTAs = 4; }, ncclInvalidArgument},
      {"maxCTAs=-2", [](ncclConfig_t& c) { c.maxCTAs = -2; }, ncclInvalidArgument},
      {"minCTAs 8 > maxCTAs 4", [](ncclConfig_t& c) { c.minCTAs = 8; c.maxCTAs = 4; }, ncclInvalidArgument},
      {"minCTAs without maxCTAs", [](ncclConfig_t& c) { c.minCTAs = 2; }, ncclInvalidArgument},
      {"splitShare=2", [](ncclConfig_t& c) { c.splitShare = 2; }, ncclInvalidArgument},
      {"collnetEnable=3", [](ncclConfig_t& c) { c.collnetEnable = 3; }, ncclInvalidArgument},
      {"shrinkShare=-1", [](ncclConfig_t& c) { c.shrinkShare = -1; }, ncclInvalidArgument},
      {"nvlsCTAs=0", [](ncclConfig_t& c) { c.nvlsCTAs = 0; }, ncclInvalidArgument},
      {"nChannelsPerNetPeer=65", [](ncclConfig_t& c) { c.nChannelsPerNetPeer = 65; }, ncclInvalidArgument},
      {"nvlinkCentricSched=2", [](ncclConfig_t& c) { c.nvlinkCentricSched = 2; }, ncclInvalidArgument},
      {"valid values", [](ncclConfig_t& c) {
         c.cgaClusterSize = 0; c.minCTAs = 2; c.maxCTAs = 8; c.splitShare = 1; c.collnetEnable = 0;
         c.shrinkShare = 1; c.nvlsCTAs = 16; c.nChannelsPerNetPeer = 64; c.nvlinkCentricSched = 1; },
       ncclSuccess},
  };
  for (const Case& k : cases) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    k.set(cfg);
    ncclComm_t c = nullptr;
    EXPECT_EQ(init_one(&c, &cfg), k.want) << k.name;
    if (k.want == ncclSuccess) {
      ASSERT_NE(c, nullptr);
      EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
    }
  }
}

}  // namespace
