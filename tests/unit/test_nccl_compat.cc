// Behaviours of NCCL 2.28 that programs written for NCCL rely on, checked on
// one thread driving N ranks (ncclCommInitAll, grouped calls): root-only
// buffers, in-place conventions, self and empty point-to-point, queries and
// what a failed call leaves behind. Each test names where NCCL defines it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/test_util.h"
#include "core/log.h"
#include "nccl.h"
#include "unit/nccl_comms.h"

namespace {

constexpr int kN = 4;
using Comms = loom::testing::NcclComms<kN>;

// Runs body(r) for every rank inside one group and returns GroupEnd's result.
template <typename F>
ncclResult_t grouped(F body) {
  if (ncclGroupStart() != ncclSuccess) return ncclInternalError;
  for (int r = 0; r < kN; ++r) {
    const ncclResult_t res = body(r);
    if (res != ncclSuccess) {
      (void)ncclGroupEnd();
      return res;
    }
  }
  return ncclGroupEnd();
}

// NCCL's colls docs: Reduce's recvbuff "is only used on rank root" and
// Broadcast's sendbuff "only used on rank root and ignored for other ranks";
// non-roots may pass NULL, and a non-root's recvbuff is left alone.
TEST(NcclCompat, RootOnlyBuffersMayBeNullOrUntouchedElsewhere) {
  Comms w;
  const int root = 1;
  const size_t n = 1000;
  std::vector<float> in[kN], out[kN];
  for (int r = 0; r < kN; ++r) {
    in[r].assign(n, static_cast<float>(r + 1));
    out[r].assign(n, -7.0f);
  }
  // Reduce: NULL recvbuff on two non-roots, a sentinel buffer on the third.
  ASSERT_EQ(grouped([&](int r) {
              void* recv = r == root ? out[r].data() : r == 3 ? out[r].data() : nullptr;
              return ncclReduce(in[r].data(), recv, n, ncclFloat32, ncclSum, root, w.c[r], nullptr);
            }),
            ncclSuccess)
      << ncclGetLastError(nullptr);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[root][i], 10.0f) << i;
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[3][i], -7.0f) << "a non-root's recvbuff was written at " << i;
  // Broadcast: NULL sendbuff on non-roots.
  for (int r = 0; r < kN; ++r) out[r].assign(n, -7.0f);
  ASSERT_EQ(grouped([&](int r) {
              const void* send = r == root ? in[r].data() : nullptr;
              return ncclBroadcast(send, out[r].data(), n, ncclFloat32, root, w.c[r], nullptr);
            }),
            ncclSuccess)
      << ncclGetLastError(nullptr);
  for (int r = 0; r < kN; ++r)
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[r][i], 2.0f) << r << " " << i;
  // Gather/Scatter: root-only buffers NULL elsewhere.
  std::vector<float> all(n * kN, -1.0f);
  ASSERT_EQ(grouped([&](int r) {
              return ncclGather(in[r].data(), r == root ? all.data() : nullptr, n, ncclFloat32, root, w.c[r],
                                nullptr);
            }),
            ncclSuccess)
      << ncclGetLastError(nullptr);
  for (int r = 0; r < kN; ++r) ASSERT_EQ(all[r * n + 5], static_cast<float>(r + 1));
  ASSERT_EQ(grouped([&](int r) {
              return ncclScatter(r == root ? all.data() : nullptr, out[r].data(), n, ncclFloat32, root, w.c[r],
                                 nullptr);
            }),
            ncclSuccess)
      << ncclGetLastError(nullptr);
  for (int r = 0; r < kN; ++r) ASSERT_EQ(out[r][7], static_cast<float>(r + 1));
}

// NCCL's "In-place Operations" page: ReduceScatter is in place when
// recvbuff == sendbuff + rank*recvcount, AllGather when sendbuff ==
// recvbuff + rank*sendcount; Broadcast/Reduce/AllReduce when the pointers
// are equal, and ncclBcast is the in-place Broadcast.
TEST(NcclCompat, InPlaceForms) {
  Comms w;
  const size_t n = 333;
  std::vector<int32_t> buf[kN];
  // ReduceScatter in place.
  for (int r = 0; r < kN; ++r) {
    buf[r].resize(n * kN);
    for (size_t i = 0; i < buf[r].size(); ++i) buf[r][i] = static_cast<int32_t>(i) * (r + 1);
  }
  ASSERT_EQ(grouped([&](int r) {
              return ncclReduceScatter(buf[r].data(), buf[r].data() + r * n, n, ncclInt32, ncclSum, w.c[r],
                                       nullptr);
            }),
            ncclSuccess)
      << ncclGetLastError(nullptr);
  for (int r = 0; r < kN; ++r)
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(buf[r][r * n + i], static_cast<int32_t>(r * n + i) * 10) << r;
  // AllGather in place.
  for (int r = 0; r < kN; ++r) {
    buf[r].assign(n * kN, -1);
    for (size_t i = 0; i < n; ++i) buf[r][r * n + i] = 1000 * r + static_cast<int32_t>(i);
  }
  ASSERT_EQ(grouped([&](int r) {
              return ncclAllGather(buf[r].data() + r * n, buf[r].data(), n, ncclInt32, w.c[r], nullptr);
            }),
            ncclSuccess)
      << ncclGetLastError(nullptr);
  for (int r = 0; r < kN; ++r)
    for (int q = 0; q < kN; ++q)
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(buf[r][q * n + i], 1000 * q + static_cast<int32_t>(i));
  // AllReduce, Reduce and Bcast in place.
  for (int r = 0; r < kN; ++r) buf[r].assign(n, r + 1);
  ASSERT_EQ(grouped([&](int r) {
              return ncclAllReduce(buf[r].data(), buf[r].data(), n, ncclInt32, ncclMax, w.c[r], nullptr);
            }),
            ncclSuccess);
  for (int r = 0; r < kN; ++r) ASSERT_EQ(buf[r][n - 1], kN);
  for (int r = 0; r < kN; ++r) buf[r].assign(n, r + 1);
  ASSERT_EQ(grouped([&](int r) {
              return ncclReduce(buf[r].data(), buf[r].data(), n, ncclInt32, ncclProd, 2, w.c[r], nullptr);
            }),
            ncclSuccess);
  ASSERT_EQ(buf[2][0], 24);
  for (int r = 0; r < kN; ++r) buf[r].assign(n, r == 3 ? 77 : 0);
  ASSERT_EQ(grouped([&](int r) { return ncclBcast(buf[r].data(), n, ncclInt32, 3, w.c[r], nullptr); }), ncclSuccess);
  for (int r = 0; r < kN; ++r) ASSERT_EQ(buf[r][n / 2], 77);
  // Gather and Scatter (nccl.h 2.28): in place at the root when its own
  // block is sendbuff == recvbuff + root*count (Gather), recvbuff ==
  // sendbuff + root*count (Scatter).
  const int root = 1;
  for (int r = 0; r < kN; ++r) {
    buf[r].assign(n * kN, -1);
    for (size_t i = 0; i < n; ++i) buf[r][(r == root ? root * n : 0) + i] = 100 * r + static_cast<int32_t>(i);
  }
  ASSERT_EQ(grouped([&](int r) {
              const int32_t* send = r == root ? buf[r].data() + root * n : buf[r].data();
              return ncclGather(send, buf[r].data(), n, ncclInt32, root, w.c[r], nullptr);
            }),
            ncclSuccess)
      << ncclGetLastError(nullptr);
  for (int q = 0; q < kN; ++q)
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(buf[root][q * n + i], 100 * q + static_cast<int32_t>(i)) << q;
  for (int r = 0; r < kN; ++r)
    if (r != root) buf[r].assign(n, -1);
  ASSERT_EQ(grouped([&](int r) {
              int32_t* recv = r == root ? buf[r].data() + root * n : buf[r].data();
              return ncclScatter(buf[r].data(), recv, n, ncclInt32, root, w.c[r], nullptr);
            }),
            ncclSuccess)
      << ncclGetLastError(nullptr);
  for (int r = 0; r < kN; ++r)
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(buf[r][(r == root ? root * n : 0) + i], 100 * r + static_cast<int32_t>(i)) << r;
}

// ncclAvg: the sum divided by nranks; integers truncate (NCCL computes the
// integer quotient), floats divide.
TEST(NcclCompat, AvgForIntegersAndFloats) {
  Comms w;
  int32_t in_i[kN][3], out_i[kN][3];
  double in_d[kN][3], out_d[kN][3];
  for (int r = 0; r < kN; ++r)
    for (int i = 0; i < 3; ++i) {
      in_i[r][i] = r + i;          // sums 6, 10, 14 -> 1, 2, 3
      in_d[r][i] = r + i + 0.5;    // sums 8, 12, 16 -> 2, 3, 4
    }
  ASSERT_EQ(grouped([&](int r) {
              ncclResult_t a = ncclAllReduce(in_i[r], out_i[r], 3, ncclInt32, ncclAvg, w.c[r], nullptr);
              return a != ncclSuccess ? a : ncclAllReduce(in_d[r], out_d[r], 3, ncclFloat64, ncclAvg, w.c[r], nullptr);
            }),
            ncclSuccess)
      << ncclGetLastError(nullptr);
  for (int r = 0; r < kN; ++r) {
    EXPECT_EQ(out_i[r][0], 1);
    EXPECT_EQ(out_i[r][1], 2);
    EXPECT_EQ(out_i[r][2], 3);
    EXPECT_EQ(out_d[r][0], 2.0);
    EXPECT_EQ(out_d[r][2], 4.0);
  }
}

// Send/recv to self in a group, zero-count send/recv, and collectives mixed
// with p2p in one group (NCCL's p2p docs: a rank may send to itself).
TEST(NcclCompat, SelfAndEmptyPointToPointInAGroup) {
  Comms w;
  std::vector<int> in[kN], self[kN], ring[kN], sum[kN];
  for (int r = 0; r < kN; ++r) {
    in[r].assign(64, r * 10);
    self[r].assign(64, -1);
    ring[r].assign(64, -1);
    sum[r].assign(64, -1);
  }
  ASSERT_EQ(grouped([&](int r) {
              ncclResult_t s[] = {
                  ncclSend(in[r].data(), 64, ncclInt32, r, w.c[r], nullptr),
                  ncclRecv(self[r].data(), 64, ncclInt32, r, w.c[r], nullptr),
                  ncclSend(in[r].data(), 0, ncclInt32, (r + 1) % kN, w.c[r], nullptr),
                  ncclRecv(nullptr, 0, ncclInt32, (r + kN - 1) % kN, w.c[r], nullptr),
                  ncclAllReduce(in[r].data(), sum[r].data(), 64, ncclInt32, ncclSum, w.c[r], nullptr),
                  ncclSend(in[r].data(), 64, ncclInt32, (r + 1) % kN, w.c[r], nullptr),
                  ncclRecv(ring[r].data(), 64, ncclInt32, (r + kN - 1) % kN, w.c[r], nullptr),
              };
              for (ncclResult_t x : s)
                if (x != ncclSuccess) return x;
              return ncclSuccess;
            }),
            ncclSuccess)
      << ncclGetLastError(nullptr);
  for (int r = 0; r < kN; ++r) {
    EXPECT_EQ(self[r][63], r * 10);
    EXPECT_EQ(ring[r][0], ((r + kN - 1) % kN) * 10);
    EXPECT_EQ(sum[r][5], 60);
  }
}

// Every ncclResult_t has a non-empty string of its own; values outside the
// enum say so (NCCL's ncclGetErrorString: "unknown result code").
TEST(NcclCompat, ErrorStringForEveryResult) {
  std::set<std::string> seen;
  for (int r = ncclSuccess; r < ncclNumResults; ++r) {
    const char* s = ncclGetErrorString(static_cast<ncclResult_t>(r));
    ASSERT_NE(s, nullptr);
    EXPECT_GT(std::strlen(s), 0u);
    EXPECT_TRUE(seen.insert(s).second) << "duplicate string for " << r << ": " << s;
  }
  EXPECT_NE(std::string(ncclGetErrorString(ncclNumResults)).find("unknown"), std::string::npos);
  EXPECT_NE(std::string(ncclGetErrorString(static_cast<ncclResult_t>(-1))).find("unknown"), std::string::npos);
  int v = 0;
  ASSERT_EQ(ncclGetVersion(&v), ncclSuccess);
  EXPECT_EQ(v, NCCL_VERSION_CODE);
  EXPECT_EQ(v, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH));
}

// Invalid arguments: NCCL's codes (argcheck.cc, enqueue.cc).
TEST(NcclCompat, InvalidArgumentsAreInvalidArgument) {
  Comms w;
  float x[8] = {};
  EXPECT_EQ(ncclAllReduce(x, x, 8, ncclFloat32, ncclSum, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(x, x, 8, static_cast<ncclDataType_t>(ncclNumTypes), ncclSum, w.c[0], nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(x, x, 8, ncclFloat32, static_cast<ncclRedOp_t>(ncclNumOps), w.c[0], nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(x, x, 8, ncclFloat32, static_cast<ncclRedOp_t>(-1), w.c[0], nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclBroadcast(x, x, 8, ncclFloat32, kN, w.c[0], nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclReduce(x, x, 8, ncclFloat32, ncclSum, -1, w.c[0], nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(x, 8, ncclFloat32, kN, w.c[0], nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclRecv(x, 8, ncclFloat32, -1, w.c[0], nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(nullptr, x, 8, ncclFloat32, ncclSum, w.c[0], nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)), "");
  int n = 0;
  EXPECT_EQ(ncclCommCount(nullptr, &n), ncclInvalidArgument);
  EXPECT_EQ(ncclCommCount(w.c[0], nullptr), ncclInvalidArgument);
  ncclResult_t st;
  EXPECT_EQ(ncclCommGetAsyncError(nullptr, &st), ncclInvalidArgument);
  // The comm stays usable after argument errors (a blocking comm keeps no
  // async error for them).
  ASSERT_EQ(ncclCommGetAsyncError(w.c[0], &st), ncclSuccess);
  EXPECT_EQ(st, ncclSuccess);
}

// ncclCommInitRank* with a bad rank or size: ncclInvalidArgument, and
// *newcomm is NULL afterwards (NCCL's ncclCommInitRankDev clears it on
// every failure), so a program that checks the handle sees no comm.
TEST(NcclCompat, FailedInitLeavesNoHandle) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  auto* junk = reinterpret_cast<ncclComm_t>(uintptr_t{0x1234});
  ncclComm_t c = junk;
  EXPECT_EQ(ncclCommInitRank(&c, 2, id, 2), ncclInvalidArgument);
  EXPECT_EQ(c, nullptr);
  c = junk;
  EXPECT_EQ(ncclCommInitRank(&c, 0, id, 0), ncclInvalidArgument);
  EXPECT_EQ(c, nullptr);
  c = junk;
  EXPECT_EQ(ncclCommInitRank(&c, 2, id, -1), ncclInvalidArgument);
  EXPECT_EQ(c, nullptr);
  c = junk;
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.blocking = 5;
  EXPECT_EQ(ncclCommInitRankConfig(&c, 2, id, 0, &bad), ncclInvalidArgument);
  EXPECT_EQ(c, nullptr);
  // (A bad nId is refused before NCCL touches *newcomm; not checked here.)
  EXPECT_EQ(ncclCommInitRankScalable(&c, 2, 0, 3, &id, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(nullptr, 2, id, 0), ncclInvalidArgument);
}

// ncclMemAlloc of 0 bytes: NCCL falls back to cudaMalloc(ptr, 0), which
// succeeds with a NULL pointer; ncclMemFree(NULL) succeeds.
TEST(NcclCompat, MemAllocOfZeroBytesGivesNull) {
  void* p = reinterpret_cast<void*>(uintptr_t{0x1234});
  EXPECT_EQ(ncclMemAlloc(&p, 0), ncclSuccess) << ncclGetLastError(nullptr);
  ASSERT_EQ(p, nullptr);
  EXPECT_EQ(ncclMemFree(p), ncclSuccess);
}

// A communicator split from another lives on the parent's device (NCCL's
// ncclCommSplit: the child's job takes comm->cudaDev), so
// ncclCommCuDevice of the child names the parent's device.
TEST(NcclCompat, SplitChildKeepsTheParentsDevice) {
  const int devs[kN] = {3, 1, 2, 0};
  ncclComm_t c[kN] = {};
  ASSERT_EQ(ncclCommInitAll(c, kN, devs), ncclSuccess);
  ncclComm_t child[kN] = {};
  ASSERT_EQ(grouped([&](int r) { return ncclCommSplit(c[r], r % 2, -r, &child[r], nullptr); }), ncclSuccess)
      << ncclGetLastError(nullptr);
  for (int r = 0; r < kN; ++r) {
    int dev = -1, rank = -1, count = -1;
    ASSERT_EQ(ncclCommCuDevice(child[r], &dev), ncclSuccess);
    EXPECT_EQ(dev, devs[r]) << r;
    // Key ordering: keys -r, so the higher parent rank comes first.
    ASSERT_EQ(ncclCommUserRank(child[r], &rank), ncclSuccess);
    ASSERT_EQ(ncclCommCount(child[r], &count), ncclSuccess);
    EXPECT_EQ(count, 2);
    EXPECT_EQ(rank, r < 2 ? 1 : 0) << r;
  }
  for (int r = 0; r < kN; ++r) EXPECT_EQ(ncclCommDestroy(child[r]), ncclSuccess);
  for (int r = 0; r < kN; ++r) EXPECT_EQ(ncclCommDestroy(c[r]), ncclSuccess);
}

// NCCL_COMM_ID=<host>:<port>: every process makes the same unique id from
// the variable, without exchanging one, and rank 0's ncclCommInitRank hosts
// the rendezvous there (NCCL's bootstrapGetUniqueId and
// ncclCommInitRankDev); the other ranks wait for it. A malformed value is
// refused by ncclGetUniqueId.
TEST(NcclCompat, CommIdFromTheEnvironment) {
  const int port = loom::testing::unused_loopback_port();
  ASSERT_NE(port, 0);
  struct EnvVar {
    explicit EnvVar(const std::string& v) { setenv("NCCL_COMM_ID", v.c_str(), 1); }
    ~EnvVar() { unsetenv("NCCL_COMM_ID"); }
  } env("127.0.0.1:" + std::to_string(port));
  constexpr int n = 3;
  ncclUniqueId ids[n];
  for (auto& id : ids) ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 1; r < n; ++r) ASSERT_EQ(std::memcmp(&ids[0], &ids[r], sizeof(ncclUniqueId)), 0) << r;
  ncclComm_t comms[n] = {};
  ncclResult_t res[n];
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      // Rank 0 comes last: the others retry until its rendezvous listens.
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      res[r] = ncclCommInitRank(&comms[r], n, ids[r], r);
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < n; ++r) ASSERT_EQ(res[r], ncclSuccess) << r << ": " << ncclGetLastError(nullptr);
  int in[n], out[n];
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    in[r] = r + 1;
    ASSERT_EQ(ncclAllReduce(&in[r], &out[r], 1, ncclInt32, ncclSum, comms[r], nullptr), ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[r], 6);
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  setenv("NCCL_COMM_ID", "no-port-here", 1);
  ncclUniqueId bad;
  EXPECT_EQ(ncclGetUniqueId(&bad), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("NCCL_COMM_ID"), std::string::npos);
}

// What DebugOutputGoesWhereNcclDebugFileSays runs in a fresh process (the
// logging settings are read once): a call that may log before any
// communicator exists, then an invalid call the shim warns about.
TEST(NcclCompat, DebugOutputChild) {
  if (std::getenv("LOOM_NCCL_DEBUG_CHILD") == nullptr) GTEST_SKIP() << "run by DebugOutputGoesWhereNcclDebugFileSays";
  void* p = nullptr;
  ASSERT_EQ(ncclMemAlloc(&p, 4096), ncclSuccess);
  ASSERT_EQ(ncclMemFree(p), ncclSuccess);
  ncclComm_t c[2] = {};
  ASSERT_EQ(ncclCommInitAll(c, 2, nullptr), ncclSuccess);
  float x = 0;
  EXPECT_EQ(ncclAllReduce(&x, &x, 1, static_cast<ncclDataType_t>(99), ncclSum, c[0], nullptr), ncclInvalidArgument);
  for (ncclComm_t x : c) EXPECT_EQ(ncclCommDestroy(x), ncclSuccess);
}

// NCCL_DEBUG_FILE receives all of the library's output (NCCL's debug.cc
// writes every line there, %h and %p expanded), the shim's own warnings
// included, and NCCL_DEBUG_SUBSYS never hides a warning (NCCL's WARN is
// logged for every subsystem). The settings apply although a call logged
// before the first communicator read them (ncclMemAlloc).
TEST(NcclCompat, DebugOutputGoesWhereNcclDebugFileSays) {
  const std::string dir = ::testing::TempDir() + "/nccl_debug_" + std::to_string(getpid());
  ASSERT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  auto run = [&](const std::string& level, const std::string& subsys, const std::string& tag) {
    const std::string cmd = "env -u LOOM_DEBUG -u LOOM_DEBUG_FILE -u LOOM_DEBUG_SUBSYS LOOM_NCCL_DEBUG_CHILD=1 NCCL_DEBUG=" +
                            level + " NCCL_DEBUG_SUBSYS=" + subsys + " NCCL_DEBUG_FILE=" + dir + "/" + tag +
                            ".%h.%p /proc/" + std::to_string(getpid()) +
                            "/exe --gtest_filter=NcclCompat.DebugOutputChild >/dev/null 2>" + dir + "/" + tag +
                            ".stderr; echo rc=$?";
    EXPECT_EQ(loom::testing::run_command(cmd), "rc=0\n") << cmd;
    // The one file the child wrote, its name expanded.
    const std::string files = loom::testing::run_command("cd " + dir + " && ls " + tag + ".*.*");
    EXPECT_EQ(std::count(files.begin(), files.end(), '\n'), 1) << files;
    EXPECT_EQ(files.find('%'), std::string::npos) << files;
    return std::make_pair(loom::testing::run_command("cat " + dir + "/" + files.substr(0, files.find('\n'))),
                          loom::testing::run_command("cat " + dir + "/" + tag + ".stderr"));
  };
  // INFO for INIT: Loom's INIT lines and the shim's warning go to the file.
  auto [log, err] = run("INFO", "INIT", "info");
  EXPECT_NE(log.find("ncclAllReduce: invalid datatype 99"), std::string::npos) << log;
  EXPECT_NE(log.find(" INFO INIT "), std::string::npos) << log;
  EXPECT_EQ(err.find("invalid datatype"), std::string::npos) << err;
  EXPECT_EQ(err.find(" INFO "), std::string::npos) << err;
  // WARN for NET only: the warning is still written.
  std::tie(log, err) = run("WARN", "NET", "warn");
  EXPECT_NE(log.find("ncclAllReduce: invalid datatype 99"), std::string::npos) << log;
  EXPECT_EQ(log.find(" INFO "), std::string::npos) << log;
  EXPECT_EQ(err, "");
  ASSERT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
}

// Polls a communicator's state until it leaves ncclInProgress (60 s at most).
ncclResult_t settled(ncclComm_t comm) {
  ncclResult_t state = ncclInProgress;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (state == ncclInProgress && std::chrono::steady_clock::now() < until) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
    if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return state;
}

// Whether ncclCommSplit waits is the parent's mode: NCCL launches the split
// as an async job of the parent (init.cc, ncclCommInitChildComm ->
// ncclAsyncLaunch(job, ..., comm)), so on a non-blocking parent it returns
// at once, also for NCCL_SPLIT_NOCOLOR and for a child config that asks for
// a blocking child; the parent is then polled. One thread may so split N
// non-blocking ranks one after the other, without a group.
TEST(NcclCompat, SplitOfNonBlockingParentsNeverWaits) {
  // Short deadlines: without the fix the first split waits for the others.
  setenv("LOOM_TIMEOUT", "10", 1);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t nb = NCCL_CONFIG_INITIALIZER;
  nb.blocking = 0;
  ncclComm_t p[kN] = {};
  for (int r = 0; r < kN; ++r) ASSERT_EQ(ncclCommInitRankConfig(&p[r], kN, id, r, &nb), ncclInProgress);
  for (ncclComm_t c : p) ASSERT_EQ(settled(c), ncclSuccess);
  unsetenv("LOOM_TIMEOUT");
  ncclConfig_t blocking_child = NCCL_CONFIG_INITIALIZER;
  blocking_child.blocking = 1;
  ncclComm_t sub[kN] = {};
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < kN; ++r) {
    const ncclResult_t res = ncclCommSplit(p[r], r == 0 ? NCCL_SPLIT_NOCOLOR : 7, -r, &sub[r], &blocking_child);
    EXPECT_TRUE(res == ncclSuccess || res == ncclInProgress) << r << ": " << res << " " << ncclGetLastError(p[r]);
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0)
      << "a split on a non-blocking parent waited for the other ranks";
  for (int r = 0; r < kN; ++r) ASSERT_EQ(settled(p[r]), ncclSuccess) << r << ": " << ncclGetLastError(p[r]);
  EXPECT_EQ(sub[0], nullptr);
  for (int r = 1; r < kN; ++r) {
    ASSERT_NE(sub[r], nullptr);
    int n = 0, me = -1;
    ASSERT_EQ(ncclCommCount(sub[r], &n), ncclSuccess) << ncclGetLastError(sub[r]);
    ASSERT_EQ(ncclCommUserRank(sub[r], &me), ncclSuccess);
    EXPECT_EQ(n, kN - 1);
    EXPECT_EQ(me, kN - 1 - r);  // keys -r
  }
  int in[kN], out[kN];
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 1; r < kN; ++r) {
    in[r] = r;
    EXPECT_EQ(ncclAllReduce(&in[r], &out[r], 1, ncclInt32, ncclSum, sub[r], nullptr), ncclSuccess);
  }
  // The children are blocking (their config): GroupEnd has finished them.
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 1; r < kN; ++r) EXPECT_EQ(out[r], 6);
  for (int r = 1; r < kN; ++r) EXPECT_EQ(ncclCommDestroy(sub[r]), ncclSuccess);
  for (ncclComm_t c : p) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// ncclCommDestroy or ncclCommAbort inside a group that already holds calls
// of that communicator: NCCL defers the teardown to GroupEnd and skips the
// communicator's tasks; the group's other communicators still run. (The
// common form, a group of Destroys over every rank, must also work.)
TEST(NcclCompat, DestroyOrAbortInsideAGroupDropsItsCalls) {
  ncclComm_t a[2] = {}, b[2] = {};
  ASSERT_EQ(ncclCommInitAll(a, 2, nullptr), ncclSuccess);
  ASSERT_EQ(ncclCommInitAll(b, 2, nullptr), ncclSuccess);
  int xa[2] = {1, 2}, xb[2] = {3, 4};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ncclAllReduce(&xa[r], &xa[r], 1, ncclInt32, ncclSum, a[r], nullptr), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(&xb[r], &xb[r], 1, ncclInt32, ncclSum, b[r], nullptr), ncclSuccess);
  }
  EXPECT_EQ(ncclCommAbort(a[0]), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(a[1]), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(xa[0], 1);
  EXPECT_EQ(xa[1], 2);
  EXPECT_EQ(xb[0], 7);
  EXPECT_EQ(xb[1], 7);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (ncclComm_t c : b) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
}

// A unique id nobody initialises with is not an error: NCCL's root thread
// of an unused id waits silently. ncclCommInitRankScalable with several ids
// (PyTorch above TORCH_NCCL_RANKS_PER_ROOT ranks) leaves Loom's roots of all
// but the first unused, and their expiry must not warn.
TEST(NcclCompat, AnUnusedUniqueIdWarnsNobody) {
  const std::string file = ::testing::TempDir() + "/unused_id_" + std::to_string(getpid()) + ".log";
  std::remove(file.c_str());
  setenv("LOOM_DEBUG", "WARN", 1);
  setenv("LOOM_DEBUG_FILE", file.c_str(), 1);
  loom::log_reinit();
  setenv("LOOM_TIMEOUT", "0.2", 1);
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  unsetenv("LOOM_TIMEOUT");
  std::this_thread::sleep_for(std::chrono::milliseconds(800));  // the root's deadline passes
  unsetenv("LOOM_DEBUG_FILE");
  unsetenv("LOOM_DEBUG");
  loom::log_reinit();
  const std::string logged = loom::testing::run_command("cat " + file + " 2>/dev/null");
  EXPECT_EQ(logged.find("WARN"), std::string::npos) << logged;
  std::remove(file.c_str());
}

// Every call NCCL checks with ncclCommEnsureReady refuses a non-blocking
// communicator still initialising at once (ncclInvalidArgument) instead of
// waiting for its peers: Finalize, Split, Shrink, Revoke, buffer and window
// registration. One thread initialising N non-blocking ranks in turn
// depends on it.
TEST(NcclCompat, EveryCallRefusesACommStillInitializing) {
  setenv("LOOM_TIMEOUT", "10", 1);  // without the fix: each call below waits this long
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t nb = NCCL_CONFIG_INITIALIZER;
  nb.blocking = 0;
  ncclComm_t c[2] = {};
  ASSERT_EQ(ncclCommInitRankConfig(&c[0], 2, id, 0, &nb), ncclInProgress);
  unsetenv("LOOM_TIMEOUT");
  const auto t0 = std::chrono::steady_clock::now();
  float buf[4] = {};
  void* handle = nullptr;
  ncclWindow_t win = nullptr;
  ncclComm_t sub = nullptr;
  int exclude = 1;
  EXPECT_EQ(ncclCommRegister(c[0], buf, sizeof buf, &handle), ncclInvalidArgument);
  EXPECT_EQ(ncclCommWindowRegister(c[0], buf, sizeof buf, &win, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommSplit(c[0], 0, 0, &sub, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommShrink(c[0], &exclude, 1, &sub, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
  EXPECT_EQ(ncclCommRevoke(c[0], NCCL_REVOKE_DEFAULT), ncclInvalidArgument);
  EXPECT_EQ(ncclCommFinalize(c[0]), ncclInvalidArgument);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  ASSERT_EQ(ncclCommInitRankConfig(&c[1], 2, id, 1, &nb), ncclInProgress);
  for (ncclComm_t k : c) ASSERT_EQ(settled(k), ncclSuccess) << ncclGetLastError(k);
  EXPECT_EQ(ncclCommRegister(c[0], buf, sizeof buf, &handle), ncclSuccess);
  EXPECT_EQ(ncclCommDeregister(c[0], handle), ncclSuccess);
  for (ncclComm_t k : c) {
    const ncclResult_t f = ncclCommFinalize(k);
    EXPECT_TRUE(f == ncclSuccess || f == ncclInProgress) << f;
    EXPECT_EQ(settled(k), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(k), ncclSuccess);
  }
}

// ncclCommRevoke's edges (NVIDIA's revoke design and apitest list: NULL is
// a no-op; a communicator already revoked, or finalizing, is refused with
// ncclInvalidArgument).
TEST(NcclCompat, RevokeEdgesAsNccl) {
  EXPECT_EQ(ncclCommRevoke(nullptr, NCCL_REVOKE_DEFAULT), ncclSuccess);
  ncclComm_t c[2] = {};
  ASSERT_EQ(ncclCommInitAll(c, 2, nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommRevoke(c[0], NCCL_REVOKE_DEFAULT), ncclSuccess) << ncclGetLastError(c[0]);
  EXPECT_EQ(ncclCommRevoke(c[0], NCCL_REVOKE_DEFAULT), ncclInvalidArgument) << "revoked twice";
  EXPECT_EQ(ncclCommFinalize(c[1]), ncclSuccess);
  EXPECT_EQ(ncclCommRevoke(c[1], NCCL_REVOKE_DEFAULT), ncclInvalidArgument) << "revoke after finalize";
  for (ncclComm_t k : c) EXPECT_EQ(ncclCommDestroy(k), ncclSuccess);
}

}  // namespace
