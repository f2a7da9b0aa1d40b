// The shim with a CUDA runtime present (the mock of tests/gpu/mock, whose
// streams run their work in order on a thread each): host collectives are
// ordered on the stream argument (after the stream's prior work, before its
// later work) without blocking the caller, and device buffers are refused.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <cstdio>
#include <chrono>
#include <memory>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu/mock/mock_cudart_api.h"
#include "nccl.h"
#include "nccl_stream_world.h"

namespace {

constexpr int kN = 4;
constexpr int kDelayMs = 600;  // the calls get 80% of it to return (they must not wait for the stream): room for a loaded machine

// The shim loads the CUDA runtime once, on first use: point it at the mock first.
const bool kEnv = [] {
  setenv("LOOM_CUDART_LIBRARY", LOOM_MOCK_CUDART_PATH, 1);
  setenv("LOOM_MOCK_GPUS", "4:none", 1);
  return true;
}();

// The mock's stream API (the same library instance the shim opened).
using Mock = loom::testing::MockCudart;

Mock& mock() {
  static Mock m(LOOM_MOCK_CUDART_PATH);
  return m;
}

struct World : loom::testing::StreamWorld<kN> {
  World() : StreamWorld(mock()) { EXPECT_TRUE(kEnv); }
};

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// The send buffer holds stale values until a delayed copy on the stream
// writes the real ones: an op that ran at once would sum the stale values.
// A copy enqueued after the op snapshots the result when the stream gets there.
void ordered_allreduce(ncclRedOp_t op_for(World&, int), float scale) {
  // Declared before the world: its destructor waits for the streams, whose
  // queued copies use these buffers until then (also when an assertion fails).
  std::vector<float> send[kN], staged[kN], recv[kN], after[kN];
  World w;
  const int n = 1000;
  for (int r = 0; r < kN; ++r) {
    send[r].assign(n, -1000.0f);
    staged[r].assign(n, static_cast<float>(r + 1));
    recv[r].assign(n, 0.0f);
    after[r].assign(n, 0.0f);
  }
  const size_t bytes = n * sizeof(float);
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < kN; ++r) {
    ASSERT_EQ(mock().enqueue_copy(w.s[r], send[r].data(), staged[r].data(), bytes, kDelayMs), 0);
    ASSERT_EQ(ncclAllReduce(send[r].data(), recv[r].data(), n, ncclFloat32, op_for(w, r), w.c[r], w.s[r]),
              ncclSuccess)
        << ncclGetLastError(w.c[r]);
    ASSERT_EQ(mock().enqueue_copy(w.s[r], after[r].data(), recv[r].data(), bytes, 0), 0);
  }
  // NCCL semantics: the calls enqueue and return; they do not wait for the stream.
  EXPECT_LT(ms_since(t0), kDelayMs * 0.8);
  for (int r = 0; r < kN; ++r) ASSERT_EQ(mock().stream_sync(w.s[r]), 0);
  EXPECT_GE(ms_since(t0), kDelayMs);
  const float want = scale * (1 + 2 + 3 + 4);
  for (int r = 0; r < kN; ++r) {
    EXPECT_EQ(recv[r][0], want) << "rank " << r;
    EXPECT_EQ(recv[r][n - 1], want) << "rank " << r;
    EXPECT_EQ(after[r][0], want) << "rank " << r << ": later stream work ran before the op finished";
    EXPECT_EQ(after[r][n - 1], want) << "rank " << r;
  }
  ncclResult_t async = ncclInternalError;
  for (int r = 0; r < kN; ++r) {
    EXPECT_EQ(ncclCommGetAsyncError(w.c[r], &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);
  }
}

TEST(NcclStream, AllReduceRunsAfterPriorStreamWorkAndBeforeLaterWork) {
  ordered_allreduce([](World&, int) { return ncclSum; }, 1.0f);
}

TEST(NcclStream, PreMulSumScalesTheInputTheStreamWrote) {
  static ncclRedOp_t ops[kN];
  ordered_allreduce(
      [](World& w, int r) {
        float two = 2.0f;
        EXPECT_EQ(ncclRedOpCreatePreMulSum(&ops[r], &two, ncclFloat32, ncclScalarHostImmediate, w.c[r]),
                  ncclSuccess);
        return ops[r];
      },
      2.0f);
}

TEST(NcclStream, GroupedCallsWaitForEveryStream) {
  std::vector<int> send[kN], staged[kN], recv[kN];  // outlive the streams' copies (see above)
  World w;
  const int n = 64;
  for (int r = 0; r < kN; ++r) {
    send[r].assign(n, -1000);
    staged[r].assign(n, 10 * (r + 1));
    recv[r].assign(kN * n, 0);
  }
  // Different delays per stream: the group's op must wait for the slowest.
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(mock().enqueue_copy(w.s[r], send[r].data(), staged[r].data(), n * sizeof(int), 30 * (r + 1)), 0);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(ncclAllGather(send[r].data(), recv[r].data(), n, ncclInt32, w.c[r], w.s[r]), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < kN; ++r) ASSERT_EQ(mock().stream_sync(w.s[r]), 0);
  for (int r = 0; r < kN; ++r)
    for (int b = 0; b < kN; ++b) {
      EXPECT_EQ(recv[r][b * n], 10 * (b + 1)) << "rank " << r << " block " << b;
      EXPECT_EQ(recv[r][b * n + n - 1], 10 * (b + 1)) << "rank " << r << " block " << b;
    }
}

TEST(NcclStream, DeviceBuffersAreRefusedWithAReason) {
  std::vector<float> host(1024, 1.0f), out[kN];  // outlive the streams' work (see above)
  World w;
  void* dev = nullptr;
  ASSERT_EQ(mock().malloc_dev(&dev, 4096), 0);
  EXPECT_EQ(ncclAllReduce(dev, host.data(), 1024, ncclFloat32, ncclSum, w.c[0], w.s[0]), ncclInvalidArgument);
  std::string why = ncclGetLastError(w.c[0]);
  EXPECT_NE(why.find("sendbuff"), std::string::npos) << why;
  EXPECT_NE(why.find("CUDA device memory"), std::string::npos) << why;
  EXPECT_NE(why.find("CUDA memory backend"), std::string::npos) << why;
  EXPECT_EQ(ncclBroadcast(host.data(), dev, 1024, ncclFloat32, 0, w.c[1], w.s[1]), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(w.c[1])).find("recvbuff"), std::string::npos);
  EXPECT_EQ(mock().free_dev(dev), 0);
  // Plain host memory on the same communicators still works, stream-ordered.
  for (int r = 0; r < kN; ++r) {
    out[r].assign(1024, 0.0f);
    ASSERT_EQ(ncclAllReduce(host.data(), out[r].data(), 1024, ncclFloat32, ncclSum, w.c[r], w.s[r]), ncclSuccess)
        << ncclGetLastError(w.c[r]);
  }
  for (int r = 0; r < kN; ++r) ASSERT_EQ(mock().stream_sync(w.s[r]), 0);
  for (int r = 0; r < kN; ++r) EXPECT_EQ(out[r][1023], 4.0f);
}

// A stream that does not reach the op within the communicator's timeout:
// the op fails with a timeout naming the stream wait, the communicator
// reports it, and the stream is released (its later work still runs).
//
// The timeout also bounds the communicators' creation: 1.5 s, not less (under
// TSan on a loaded host, creating 4 communicators on 2 cores took over 0.5 s),
// and the stream's first copy takes 4 s, well past it. The buffers outlive
// the world, whose destructor waits for the streams: the mock's copies write
// into them until then (regression: a failed assertion left the test body
// with a copy still queued, and TSan saw it write into freed memory).
TEST(NcclStream, StreamThatNeverArrivesTimesOut) {
  std::vector<float> buf[kN], staged(16, 1.0f), after[kN];
  setenv("LOOM_TIMEOUT", "1.5", 1);
  {
    World w;
    unsetenv("LOOM_TIMEOUT");
    for (int r = 0; r < kN; ++r) {
      buf[r].assign(16, 0.0f);
      after[r].assign(16, -1.0f);
      ASSERT_EQ(mock().enqueue_copy(w.s[r], buf[r].data(), staged.data(), 16 * sizeof(float), 4000), 0);
      ASSERT_EQ(ncclAllReduce(buf[r].data(), buf[r].data(), 16, ncclFloat32, ncclSum, w.c[r], w.s[r]), ncclSuccess);
      ASSERT_EQ(mock().enqueue_copy(w.s[r], after[r].data(), staged.data(), 16 * sizeof(float), 0), 0);
    }
    for (int r = 0; r < kN; ++r) ASSERT_EQ(mock().stream_sync(w.s[r]), 0);
    for (int r = 0; r < kN; ++r) {
      ncclResult_t async = ncclSuccess;
      EXPECT_EQ(ncclCommGetAsyncError(w.c[r], &async), ncclSuccess);
      EXPECT_NE(async, ncclSuccess) << "rank " << r;
      EXPECT_EQ(after[r][0], 1.0f) << "rank " << r << ": the stream was not released";
    }
    std::string why;
    for (int r = 0; r < kN && why.empty(); ++r) {
      ncclResult_t async = ncclSuccess;
      (void)ncclCommGetAsyncError(w.c[r], &async);
      why = ncclGetLastError(w.c[r]);
    }
    EXPECT_NE(why.find("CUDA stream"), std::string::npos) << why;
  }
  unsetenv("LOOM_TIMEOUT");
}

// ncclCommAbort while ops wait for their streams returns at once.
TEST(NcclStream, AbortWhileWaitingForTheStream) {
  std::vector<float> buf[kN], staged(16, 1.0f);  // outlive the streams' copies (see above)
  World w;
  for (int r = 0; r < kN; ++r) {
    buf[r].assign(16, 0.0f);
    ASSERT_EQ(mock().enqueue_copy(w.s[r], buf[r].data(), staged.data(), 16 * sizeof(float), 1500), 0);
    ASSERT_EQ(ncclAllReduce(buf[r].data(), buf[r].data(), 16, ncclFloat32, ncclSum, w.c[r], w.s[r]), ncclSuccess);
  }
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < kN; ++r) {
    EXPECT_EQ(ncclCommAbort(w.c[r]), ncclSuccess);
    w.c[r] = nullptr;
  }
  EXPECT_LT(ms_since(t0), 1000.0);
  for (int r = 0; r < kN; ++r) ASSERT_EQ(mock().stream_sync(w.s[r]), 0);  // released, not stuck
}

// Synchronises `stream` within 10 s. A stream that never passes the call
// under test would hang the test (and its teardown) for good: report and
// leave the process instead. (cudaStreamSynchronize on a helper thread:
// the mock's synchronisation, not a polled flag, orders the results.)
void expect_stream_passes(cudaStream_t stream, const char* what) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread([stream, done] {
    (void)mock().stream_sync(stream);
    done->store(true);
  }).detach();
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done->load() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (!done->load()) {
    ADD_FAILURE() << what << ": the stream never passed the call (hung for good)";
    fflush(stdout);
    std::_Exit(1);
  }
  ASSERT_EQ(mock().stream_sync(stream), 0);  // and this thread synchronises with it
}

// A one-rank Gather/Scatter enqueues no loom op: its stream gate was left
// for the next op to take, so the stream hung until one came (for good).
TEST(NcclStream, OneRankGatherAndScatterPassTheStream) {
  std::vector<int> send(8, 7), recv(8, -1), out(8, -1);
  loom::testing::StreamWorld<1> w(mock());
  ASSERT_EQ(ncclGather(send.data(), recv.data(), 8, ncclInt32, 0, w.c[0], w.s[0]), ncclSuccess);
  expect_stream_passes(w.s[0], "ncclGather on one rank");
  EXPECT_EQ(recv[0], 7);
  ASSERT_EQ(ncclScatter(recv.data(), out.data(), 8, ncclInt32, 0, w.c[0], w.s[0]), ncclSuccess);
  expect_stream_passes(w.s[0], "ncclScatter on one rank");
  EXPECT_EQ(out[7], 7);
}

// A lone call in a group that loom refuses at GroupEnd (its comm failed
// before the shim noticed) must not leave its stream gate behind: the
// stream's host function waited for it for good.
TEST(NcclStream, ARefusedGroupCallPassesTheStream) {
  std::vector<float> buf(16, 0.0f), staged(16, 1.0f);
  setenv("LOOM_TIMEOUT", "1", 1);
  loom::testing::StreamWorld<1> w(mock());
  unsetenv("LOOM_TIMEOUT");
  // The stream reaches the first call only after 2.5 s: it times out.
  ASSERT_EQ(mock().enqueue_copy(w.s[0], buf.data(), staged.data(), 16 * sizeof(float), 2500), 0);
  ASSERT_EQ(ncclAllReduce(buf.data(), buf.data(), 16, ncclFloat32, ncclSum, w.c[0], w.s[0]), ncclSuccess);
  // Past the 1 s timeout, with 1 s for the engine to notice it (not polled
  // through ncclCommGetAsyncError: a comm whose error was read refuses the
  // next call at once, which is not what this test is about).
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(buf.data(), buf.data(), 16, ncclFloat32, ncclSum, w.c[0], w.s[0]), ncclSuccess);
  EXPECT_NE(ncclGroupEnd(), ncclSuccess) << "the communicator had failed";
  expect_stream_passes(w.s[0], "a refused group call");
}

// A CUDA runtime call that fails is ncclUnhandledCudaError, as in NCCL.
// Regression: ncclInternalError ("a Loom bug, please report it").
TEST(NcclStream, CudaRuntimeFailuresAreUnhandledCudaErrors) {
  std::vector<float> buf(16, 1.0f);
  loom::testing::StreamWorld<1> w(mock());
  auto bogus = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(0xdead0));
  EXPECT_EQ(ncclAllReduce(buf.data(), buf.data(), 16, ncclFloat32, ncclSum, w.c[0], bogus), ncclUnhandledCudaError);
  EXPECT_NE(std::string(ncclGetLastError(w.c[0])).find("cudaLaunchHostFunc failed"), std::string::npos)
      << ncclGetLastError(w.c[0]);
}

// A call on a stream being captured into a CUDA graph is refused with the
// reason: recorded once and replayed without Loom it would corrupt memory.
TEST(NcclStream, CapturedCallsAreRefused) {
  ASSERT_NE(mock().set_capturing, nullptr);
  std::vector<float> buf(16, 1.0f);
  loom::testing::StreamWorld<1> w(mock());
  ASSERT_EQ(mock().set_capturing(w.s[0], 1), 0);
  EXPECT_EQ(ncclAllReduce(buf.data(), buf.data(), 16, ncclFloat32, ncclSum, w.c[0], w.s[0]), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(w.c[0])).find("CUDA graph"), std::string::npos) << ncclGetLastError(w.c[0]);
  ASSERT_EQ(mock().set_capturing(w.s[0], 0), 0);
  EXPECT_EQ(ncclAllReduce(buf.data(), buf.data(), 16, ncclFloat32, ncclSum, w.c[0], w.s[0]), ncclSuccess);
}

// A group call whose stream cannot take its host function reports it from
// GroupEnd. Regression: the failure was only logged and GroupEnd returned
// ncclSuccess.
TEST(NcclStream, AGroupCallWhoseStreamFailsReportsIt) {
  std::vector<float> buf(16, 1.0f);
  loom::testing::StreamWorld<1> w(mock());
  auto bogus = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(0xdead0));
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(buf.data(), buf.data(), 16, ncclFloat32, ncclSum, w.c[0], bogus), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclUnhandledCudaError);
  EXPECT_NE(std::string(ncclGetLastError(w.c[0])).find("cudaLaunchHostFunc failed"), std::string::npos)
      << ncclGetLastError(w.c[0]);
}

}  // namespace
