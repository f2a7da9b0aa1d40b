// CUDA device buffers staged through pinned host memory (src/shim/staging.h),
// against the mock runtime of tests/gpu/mock: its "device" memory is host
// memory the runtime reports as cudaMemoryTypeDevice, its streams run their
// work (copies, host functions, flag waits) in order on a thread each.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_loader.h"
#include "gpu/mock/mock_cudart_api.h"
#include "nccl.h"
#include "nccl_stream_world.h"
#include "shim/staging.h"

namespace {

constexpr int kN = 4;

// The shim loads the CUDA runtime once, on first use: point it at the mock
// first (the staging build; the plain one, without staging functions, in the child process of
// RuntimeWithoutStagingRefusesDeviceBuffers).
const bool kNoStagingChild = std::getenv("LOOM_TEST_NOSTAGING_CHILD") != nullptr;
const char* const kCudart = kNoStagingChild ? LOOM_MOCK_CUDART_PATH : LOOM_MOCK_CUDART_STAGING_PATH;
const bool kEnv = [] {
  setenv("LOOM_CUDART_LIBRARY", kCudart, 1);
  setenv("LOOM_MOCK_GPUS", "4:none", 1);
  return true;
}();

using Mock = loom::testing::MockCudart;

Mock& mock() {
  static Mock m(kCudart);
  return m;
}

struct World : loom::testing::StreamWorld<kN> {
  World() : StreamWorld(mock()) { EXPECT_TRUE(kEnv); }
};

// A mock device buffer of `n` floats (rank `host_rank` gets plain host
// memory instead, to mix both kinds in one call).
struct DevBuf {
  float* p = nullptr;
  size_t n = 0;
  bool device = true;
  explicit DevBuf(size_t count, bool dev = true) : n(count), device(dev) {
    void* v = nullptr;
    if (dev) EXPECT_EQ(mock().malloc_dev(&v, n * sizeof(float)), 0);
    else v = std::malloc(n * sizeof(float));
    p = static_cast<float*>(v);
  }
  ~DevBuf() {
    if (device) (void)mock().free_dev(p);
    else std::free(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void fill(float (*f)(size_t)) {
    for (size_t i = 0; i < n; ++i) p[i] = f(i);
  }
};

// One mock device buffer of `count` floats per rank.
using DevBufs = std::vector<std::unique_ptr<DevBuf>>;
DevBufs per_rank(size_t count) {
  DevBufs v;
  for (int r = 0; r < kN; ++r) v.push_back(std::make_unique<DevBuf>(count));
  return v;
}

// Rank r's i-th input element: exact in float.
float v(int r, size_t i) { return static_cast<float>((r + 1) * 1000 + static_cast<int>(i % 500)); }
constexpr float kSentinel = -7.0f;

void fill_rank(DevBuf& b, int r) {
  for (size_t i = 0; i < b.n; ++i) b.p[i] = v(r, i);
}
void fill_value(DevBuf& b, float x) {
  for (size_t i = 0; i < b.n; ++i) b.p[i] = x;
}

#define EXPECT_ALL(buf, count, expr_of_i, what)                                         \
  do {                                                                                  \
    int bad_ = 0;                                                                       \
    for (size_t i = 0; i < (count) && bad_ < 3; ++i)                                    \
      if ((buf)[i] != (expr_of_i)) {                                                    \
        ADD_FAILURE() << what << " [" << i << "] = " << (buf)[i] << ", want " << (expr_of_i); \
        ++bad_;                                                                         \
      }                                                                                 \
  } while (0)

class Staged : public ::testing::TestWithParam<bool> {};  // in place?

TEST_P(Staged, AllReduceSumAndPreMulSum) {
  const bool in_place = GetParam();
  World w;
  const size_t n = 3000;
  std::vector<std::unique_ptr<DevBuf>> send, recv;
  for (int r = 0; r < kN; ++r) {
    const bool dev = r != kN - 1;  // the last rank mixes in host memory
    send.push_back(std::make_unique<DevBuf>(n, dev));
    recv.push_back(in_place ? nullptr : std::make_unique<DevBuf>(n, true));
  }
  auto out = [&](int r) { return in_place ? send[r]->p : recv[r]->p; };
  for (int r = 0; r < kN; ++r) fill_rank(*send[r], r);
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(ncclAllReduce(send[r]->p, out(r), n, ncclFloat32, ncclSum, w.c[r], w.s[r]), ncclSuccess)
        << ncclGetLastError(w.c[r]);
  w.sync();
  for (int r = 0; r < kN; ++r) EXPECT_ALL(out(r), n, v(0, i) + v(1, i) + v(2, i) + v(3, i), "rank " << r);

  // PreMulSum with the scalar in (mock) device memory, read when the stream gets there.
  DevBuf scalar(1);
  scalar.p[0] = 3.0f;
  ncclRedOp_t op[kN];
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op[r], scalar.p, ncclFloat32, ncclScalarDevice, w.c[r]), ncclSuccess);
  for (int r = 0; r < kN; ++r) fill_rank(*send[r], r);
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(ncclAllReduce(send[r]->p, out(r), n, ncclFloat32, op[r], w.c[r], w.s[r]), ncclSuccess)
        << ncclGetLastError(w.c[r]);
  w.sync();
  for (int r = 0; r < kN; ++r) EXPECT_ALL(out(r), n, 3 * (v(0, i) + v(1, i) + v(2, i) + v(3, i)), "premul rank " << r);
  for (int r = 0; r < kN; ++r) EXPECT_EQ(ncclRedOpDestroy(op[r], w.c[r]), ncclSuccess);
}

TEST_P(Staged, BroadcastAndReduce) {
  const bool in_place = GetParam();
  World w;
  const size_t n = 1000;
  const int root = 1;
  DevBufs send = per_rank(n), recv = per_rank(n);
  for (int r = 0; r < kN; ++r) {
    fill_rank(*send[r], r);
    fill_value(*recv[r], kSentinel);
  }
  for (int r = 0; r < kN; ++r) {
    ncclResult_t res = in_place ? ncclBcast(send[r]->p, n, ncclFloat32, root, w.c[r], w.s[r])
                                : ncclBroadcast(send[r]->p, recv[r]->p, n, ncclFloat32, root, w.c[r], w.s[r]);
    ASSERT_EQ(res, ncclSuccess) << ncclGetLastError(w.c[r]);
  }
  w.sync();
  for (int r = 0; r < kN; ++r) EXPECT_ALL(in_place ? send[r]->p : recv[r]->p, n, v(root, i), "bcast rank " << r);

  // Reduce (max) to root 2: only the root's recvbuff is written.
  const int rroot = 2;
  for (int r = 0; r < kN; ++r) {
    fill_rank(*send[r], r);
    fill_value(*recv[r], kSentinel);
  }
  for (int r = 0; r < kN; ++r) {
    float* out = in_place ? send[r]->p : recv[r]->p;
    ASSERT_EQ(ncclReduce(send[r]->p, out, n, ncclFloat32, ncclMax, rroot, w.c[r], w.s[r]), ncclSuccess)
        << ncclGetLastError(w.c[r]);
  }
  w.sync();
  EXPECT_ALL(in_place ? send[rroot]->p : recv[rroot]->p, n, v(3, i), "reduce root");
  for (int r = 0; r < kN; ++r) {
    if (r == rroot) continue;
    if (in_place) EXPECT_ALL(send[r]->p, n, v(r, i), "reduce non-root in place " << r);
    else EXPECT_ALL(recv[r]->p, n, kSentinel, "reduce non-root recvbuff " << r);
  }
}

TEST_P(Staged, AllGatherReduceScatterAlltoAll) {
  const bool in_place = GetParam();
  World w;
  const size_t n = 700;  // per-rank block
  DevBufs big = per_rank(n * kN), small = per_rank(n), big2 = per_rank(n * kN);
  // AllGather: in place, rank r's input is its block of recvbuff.
  for (int r = 0; r < kN; ++r) {
    fill_value(*big[r], kSentinel);
    float* in = in_place ? big[r]->p + r * n : small[r]->p;
    for (size_t i = 0; i < n; ++i) in[i] = v(r, i);
  }
  for (int r = 0; r < kN; ++r) {
    const float* in = in_place ? big[r]->p + r * n : small[r]->p;
    ASSERT_EQ(ncclAllGather(in, big[r]->p, n, ncclFloat32, w.c[r], w.s[r]), ncclSuccess) << ncclGetLastError(w.c[r]);
  }
  w.sync();
  for (int r = 0; r < kN; ++r) EXPECT_ALL(big[r]->p, n * kN, v(static_cast<int>(i / n), i % n), "allgather rank " << r);

  // ReduceScatter: in place, rank r's output is its block of sendbuff.
  for (int r = 0; r < kN; ++r) {
    fill_rank(*big[r], r);
    fill_value(*small[r], kSentinel);
  }
  for (int r = 0; r < kN; ++r) {
    float* out = in_place ? big[r]->p + r * n : small[r]->p;
    ASSERT_EQ(ncclReduceScatter(big[r]->p, out, n, ncclFloat32, ncclSum, w.c[r], w.s[r]), ncclSuccess)
        << ncclGetLastError(w.c[r]);
  }
  w.sync();
  for (int r = 0; r < kN; ++r) {
    const float* out = in_place ? big[r]->p + r * n : small[r]->p;
    const size_t off = r * n;
    EXPECT_ALL(out, n, v(0, off + i) + v(1, off + i) + v(2, off + i) + v(3, off + i), "reducescatter rank " << r);
  }

  // AlltoAll: block b of rank r's output is block r of rank b's input.
  for (int r = 0; r < kN; ++r) {
    fill_rank(*big[r], r);
    fill_value(*big2[r], kSentinel);
  }
  for (int r = 0; r < kN; ++r) {
    float* out = in_place ? big[r]->p : big2[r]->p;
    ASSERT_EQ(ncclAlltoAll(big[r]->p, out, n, ncclFloat32, w.c[r], w.s[r]), ncclSuccess) << ncclGetLastError(w.c[r]);
  }
  w.sync();
  for (int r = 0; r < kN; ++r) {
    const float* out = in_place ? big[r]->p : big2[r]->p;
    EXPECT_ALL(out, n * kN, v(static_cast<int>(i / n), r * n + i % n), "alltoall rank " << r);
  }
}

TEST_P(Staged, GatherScatterSendRecv) {
  const bool in_place = GetParam();
  World w;
  const size_t n = 500;
  const int root = 3;
  DevBufs big = per_rank(n * kN), small = per_rank(n);
  // Gather to root: in place, the root's input is its block of recvbuff.
  for (int r = 0; r < kN; ++r) {
    fill_value(*big[r], kSentinel);
    float* in = in_place && r == root ? big[r]->p + r * n : small[r]->p;
    for (size_t i = 0; i < n; ++i) in[i] = v(r, i);
  }
  for (int r = 0; r < kN; ++r) {
    const float* in = in_place && r == root ? big[r]->p + r * n : small[r]->p;
    ASSERT_EQ(ncclGather(in, big[r]->p, n, ncclFloat32, root, w.c[r], w.s[r]), ncclSuccess) << ncclGetLastError(w.c[r]);
  }
  w.sync();
  EXPECT_ALL(big[root]->p, n * kN, v(static_cast<int>(i / n), i % n), "gather root");
  for (int r = 0; r < kN; ++r)
    if (r != root) EXPECT_ALL(big[r]->p, n * kN, kSentinel, "gather non-root recvbuff " << r);

  // Scatter from root 0: block r of its sendbuff to rank r.
  for (int r = 0; r < kN; ++r) {
    fill_value(*big[r], kSentinel);
    fill_value(*small[r], kSentinel);
  }
  for (size_t i = 0; i < n * kN; ++i) big[0]->p[i] = v(static_cast<int>(i / n), i);
  for (int r = 0; r < kN; ++r) {
    float* out = in_place && r == 0 ? big[0]->p : small[r]->p;
    ASSERT_EQ(ncclScatter(big[r]->p, out, n, ncclFloat32, 0, w.c[r], w.s[r]), ncclSuccess) << ncclGetLastError(w.c[r]);
  }
  w.sync();
  for (int r = 0; r < kN; ++r) {
    const float* out = in_place && r == 0 ? big[0]->p : small[r]->p;
    EXPECT_ALL(out, n, v(r, r * n + i), "scatter rank " << r);
  }

  // Send/Recv ring, each rank's pair grouped on its one stream; in place:
  // a rank sends from and receives into different halves of one buffer.
  for (int r = 0; r < kN; ++r) {
    fill_value(*big[r], kSentinel);
    for (size_t i = 0; i < n; ++i) big[r]->p[i] = v(r, i);
  }
  // One thread drives every rank: one group (a blocking GroupEnd waits for its ops).
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kN; ++r) {
    float* rbuf = in_place ? big[r]->p + n : small[r]->p;
    ASSERT_EQ(ncclSend(big[r]->p, n, ncclFloat32, (r + 1) % kN, w.c[r], w.s[r]), ncclSuccess);
    ASSERT_EQ(ncclRecv(rbuf, n, ncclFloat32, (r + kN - 1) % kN, w.c[r], w.s[r]), ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  w.sync();
  for (int r = 0; r < kN; ++r) {
    const float* rbuf = in_place ? big[r]->p + n : small[r]->p;
    EXPECT_ALL(rbuf, n, v((r + kN - 1) % kN, i), "recv rank " << r);
    EXPECT_ALL(big[r]->p, n, v(r, i), "send buffer rank " << r);
  }
}

INSTANTIATE_TEST_SUITE_P(NcclCudaStaged, Staged, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "InPlace" : "OutOfPlace"; });

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// A delayed stream copy into the device sendbuff before the call is seen by
// the op; a copy after the call sees the result. `wait_fails`: the driver
// refuses cuStreamWaitValue32, so streams wait in a host function.
void stream_order(bool wait_fails) {
  if (wait_fails) setenv("LOOM_MOCK_WAIT_VALUE_FAILS", "1", 1);
  World w;
  constexpr int kDelayMs = 600;  // the calls get 80% of it to return (they must not wait for the stream): room for a loaded machine
  const size_t n = 2048;
  DevBufs send = per_rank(n), recv = per_rank(n);
  std::vector<std::vector<float>> staged(kN), after(kN);
  for (int r = 0; r < kN; ++r) {
    fill_value(*send[r], -1000.0f);  // stale until the stream writes it
    fill_value(*recv[r], kSentinel);
    staged[r].assign(n, static_cast<float>(r + 1));
    after[r].assign(n, 0.0f);
  }
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < kN; ++r) {
    ASSERT_EQ(mock().enqueue_copy(w.s[r], send[r]->p, staged[r].data(), n * sizeof(float), kDelayMs), 0);
    ASSERT_EQ(ncclAllReduce(send[r]->p, recv[r]->p, n, ncclFloat32, ncclSum, w.c[r], w.s[r]), ncclSuccess)
        << ncclGetLastError(w.c[r]);
    ASSERT_EQ(mock().enqueue_copy(w.s[r], after[r].data(), recv[r]->p, n * sizeof(float), 0), 0);
  }
  EXPECT_LT(ms_since(t0), kDelayMs * 0.8) << "the calls waited for the stream";
  w.sync();
  for (int r = 0; r < kN; ++r) {
    EXPECT_ALL(recv[r]->p, n, 10.0f, "rank " << r);
    EXPECT_ALL(after[r].data(), n, 10.0f, "rank " << r << ": later stream work ran before the copy out");
  }
  unsetenv("LOOM_MOCK_WAIT_VALUE_FAILS");
}

TEST(NcclCudaStaged, StreamOrderWithFlagWait) { stream_order(false); }
TEST(NcclCudaStaged, StreamOrderWithHostFunctionWait) { stream_order(true); }

// One group, several calls per rank on one stream, after a delayed write.
TEST(NcclCudaStaged, GroupOfSeveralCallsOnOneStream) {
  World w;
  const size_t n = 256;
  DevBufs a = per_rank(n), b = per_rank(n), g = per_rank(n * kN), bc = per_rank(n);
  std::vector<std::vector<float>> staged(kN);
  for (int r = 0; r < kN; ++r) {
    fill_value(*a[r], -1000.0f);
    fill_value(*bc[r], static_cast<float>(100 + r));
    staged[r].assign(n, static_cast<float>(r + 1));
  }
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(mock().enqueue_copy(w.s[r], a[r]->p, staged[r].data(), n * sizeof(float), 20 * (r + 1)), 0);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kN; ++r) {
    ASSERT_EQ(ncclAllReduce(a[r]->p, b[r]->p, n, ncclFloat32, ncclSum, w.c[r], w.s[r]), ncclSuccess);
    ASSERT_EQ(ncclAllGather(a[r]->p, g[r]->p, n, ncclFloat32, w.c[r], w.s[r]), ncclSuccess);
    ASSERT_EQ(ncclBcast(bc[r]->p, n, ncclFloat32, 2, w.c[r], w.s[r]), ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  w.sync();
  for (int r = 0; r < kN; ++r) {
    EXPECT_ALL(b[r]->p, n, 10.0f, "group allreduce rank " << r);
    EXPECT_ALL(g[r]->p, n * kN, static_cast<float>(i / n + 1), "group allgather rank " << r);
    EXPECT_ALL(bc[r]->p, n, 102.0f, "group bcast rank " << r);
  }
}

// A loop of same-size calls reuses the staging buffers, and destroying the
// communicators frees them all.
TEST(NcclCudaStaged, StagingBuffersAreReusedAndFreed) {
  ASSERT_NE(mock().host_live, nullptr);
  const long live0 = mock().host_live();
  {
    World w;
    const size_t n = 5000;
    DevBufs send = per_rank(n), recv = per_rank(n);
    const long total0 = mock().host_total();
    for (int it = 0; it < 20; ++it) {
      for (int r = 0; r < kN; ++r) fill_value(*send[r], static_cast<float>(it + r));
      for (int r = 0; r < kN; ++r)
        ASSERT_EQ(ncclAllReduce(send[r]->p, recv[r]->p, n, ncclFloat32, ncclSum, w.c[r], w.s[r]), ncclSuccess);
      w.sync();
      for (int r = 0; r < kN; ++r) ASSERT_EQ(recv[r]->p[n - 1], static_cast<float>(4 * it + 6)) << it;
    }
    // Per rank: send and recv copies plus the stream's flag word, once.
    EXPECT_LE(mock().host_total() - total0, 3 * kN);
    EXPECT_GT(mock().host_live(), live0);
  }
  EXPECT_EQ(mock().host_live(), live0) << "staging buffers outlived their communicators";
}

// Calls queued on one stream (nothing synchronised between them) share
// their staging: the stream runs each call's copy in after the previous
// call's copy out. Each call has its own inputs and outputs, so a buffer
// reused out of stream order would show as another call's values.
// Regression: the pool took a buffer per call in flight (here 16 x 2 per
// rank, plus a flag word each).
TEST(NcclCudaStaged, CallsQueuedOnOneStreamShareTheirStaging) {
  const long live0 = mock().host_live();
  {
    World w;
    constexpr int kCalls = 16;
    const size_t n = 5000;
    std::vector<DevBufs> send, recv;
    for (int k = 0; k < kCalls; ++k) {
      send.push_back(per_rank(n));
      recv.push_back(per_rank(n));
      for (int r = 0; r < kN; ++r) {
        fill_value(*send[k][r], static_cast<float>(k * 10 + r));
        fill_value(*recv[k][r], kSentinel);
      }
    }
    std::vector<float> one(1, 0.0f), sink(kN, 0.0f);  // a word per stream (they write at once)
    const long total0 = mock().host_total();
    // The streams start late, so every call is queued before any copy runs.
    for (int r = 0; r < kN; ++r)
      ASSERT_EQ(mock().enqueue_copy(w.s[r], &sink[r], one.data(), sizeof(float), 200), 0);
    for (int k = 0; k < kCalls; ++k)
      for (int r = 0; r < kN; ++r)
        ASSERT_EQ(ncclAllReduce(send[k][r]->p, recv[k][r]->p, n, ncclFloat32, ncclSum, w.c[r], w.s[r]), ncclSuccess)
            << ncclGetLastError(w.c[r]);
    w.sync();
    for (int k = 0; k < kCalls; ++k)
      for (int r = 0; r < kN; ++r)
        EXPECT_ALL(recv[k][r]->p, n, static_cast<float>(40 * k + 6), "call " << k << " rank " << r);
    // Per rank: the send and recv copies and the comm's flag word, once.
    EXPECT_LE(mock().host_total() - total0, 3 * kN);
  }
  EXPECT_EQ(mock().host_live(), live0) << "staging buffers outlived their communicators";
}

// A buffer whose copies are still on one stream is not given to a call on
// another stream (nothing orders the two streams): that call gets its own,
// and once the first stream has passed its copies the buffer is anyone's.
TEST(NcclCudaStaged, AnotherStreamDoesNotTakeABufferStillOnItsStream) {
  World w;
  cudaStream_t s2[kN] = {};
  for (auto& st : s2) ASSERT_EQ(mock().stream_create(&st), 0);
  const size_t n = 3000;
  DevBufs a_send = per_rank(n), a_recv = per_rank(n), b_send = per_rank(n), b_recv = per_rank(n);
  for (int r = 0; r < kN; ++r) {
    fill_value(*a_send[r], static_cast<float>(1 + r));    // sum 10
    fill_value(*b_send[r], static_cast<float>(100 + r));  // sum 406
  }
  auto sync_both = [&] {
    for (int r = 0; r < kN; ++r) {
      ASSERT_EQ(mock().stream_sync(w.s[r]), 0);
      ASSERT_EQ(mock().stream_sync(s2[r]), 0);
    }
  };
  std::vector<float> one(1, 0.0f), sink(kN, 0.0f);  // a word per stream (they write at once)
  // Stream 1 starts late; stream 2 would copy B's input at once into a
  // buffer it took from A (A's copy in then overwrites it, and B's op reads
  // A's result).
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(mock().enqueue_copy(w.s[r], &sink[r], one.data(), sizeof(float), 200), 0);
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(ncclAllReduce(a_send[r]->p, a_recv[r]->p, n, ncclFloat32, ncclSum, w.c[r], w.s[r]), ncclSuccess);
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(ncclAllReduce(b_send[r]->p, b_recv[r]->p, n, ncclFloat32, ncclSum, w.c[r], s2[r]), ncclSuccess);
  sync_both();
  for (int r = 0; r < kN; ++r) {
    EXPECT_ALL(a_recv[r]->p, n, 10.0f, "stream 1 call, rank " << r);
    EXPECT_ALL(b_recv[r]->p, n, 406.0f, "stream 2 call, rank " << r);
  }
  // Both streams have passed their calls: a call on either reuses what is there.
  const long total0 = mock().host_total();
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(ncclAllReduce(b_send[r]->p, a_recv[r]->p, n, ncclFloat32, ncclSum, w.c[r], w.s[r]), ncclSuccess);
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(ncclAllReduce(a_send[r]->p, b_recv[r]->p, n, ncclFloat32, ncclSum, w.c[r], s2[r]), ncclSuccess);
  sync_both();
  EXPECT_EQ(mock().host_total(), total0) << "buffers the streams had passed were not reused";
  for (int r = 0; r < kN; ++r) {
    EXPECT_ALL(a_recv[r]->p, n, 406.0f, "second stream 1 call, rank " << r);
    EXPECT_ALL(b_recv[r]->p, n, 10.0f, "second stream 2 call, rank " << r);
  }
  for (auto& st : s2) EXPECT_EQ(mock().stream_destroy(st), 0);
}

// The comm's flag word: a stream waiting for ticket t passes only once every
// op up to t is done, also when a later op is done first (an earlier op's
// completion steps, e.g. Gather's root block, run on its own thread); and the
// 32-bit word crosses zero as cuStreamWaitValue32's cyclic GEQ expects.
TEST(NcclCudaStaged, FlagWordWaitsForEveryEarlierTicket) {
  const auto* rt = loom::cuda::CudaLoader::get().runtime();
  ASSERT_NE(rt, nullptr) << loom::cuda::CudaLoader::get().runtime_status();
  auto pool = std::make_shared<loom::shim::StagingPool>(*rt);
  pool->set_next_ticket_for_test(0xFFFFFFFEull);  // two tickets below the wrap
  std::vector<loom::shim::FlagTicket> t;
  for (int i = 0; i < 4; ++i) {
    auto r = pool->next_flag_ticket();
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    t.push_back(r.value());
  }
  EXPECT_EQ(t[2].wait_value(), 0u);  // the word wraps between t[1] and t[2]
  auto reached = [&](int i) { return loom::shim::flag_reached(t[i].word, t[i].wait_value()); };
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(reached(i)) << i;
  t[2].done();  // done before t[0] and t[1]: nobody may pass yet
  t[3].done();
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(reached(i)) << "after 2 and 3: " << i;
  t[0].done();
  EXPECT_TRUE(reached(0));
  EXPECT_FALSE(reached(1));
  EXPECT_FALSE(reached(2)) << "a stream passed an op that was not done (ticket 1 is not)";
  t[1].done();
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(reached(i)) << i;
  EXPECT_EQ(*t[3].word, 1u);
  pool->close();
  t.clear();  // the word's buffer goes with its last holder
  EXPECT_EQ(pool->allocated(), 0u);
}

// ncclCommInitRank* record the calling thread's current device
// (cudaGetDevice, as NCCL), which ncclCommCuDevice reports; a split keeps it.
TEST(NcclCudaStaged, InitRankRecordsTheCurrentDevice) {
  ASSERT_NE(mock().set_device, nullptr);
  int dev = -1;
  std::thread t([&] {
    ASSERT_EQ(mock().set_device(2), 0);
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t c = nullptr, child = nullptr;
    ASSERT_EQ(ncclCommInitRank(&c, 1, id, 0), ncclSuccess) << ncclGetLastError(nullptr);
    ASSERT_EQ(mock().set_device(0), 0);  // later changes do not move the comm
    EXPECT_EQ(ncclCommCuDevice(c, &dev), ncclSuccess);
    ASSERT_EQ(ncclCommSplit(c, 0, 0, &child, nullptr), ncclSuccess) << ncclGetLastError(c);
    int child_dev = -1;
    EXPECT_EQ(ncclCommCuDevice(child, &child_dev), ncclSuccess);
    EXPECT_EQ(child_dev, 2);
    EXPECT_EQ(ncclCommDestroy(child), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  });
  t.join();
  EXPECT_EQ(dev, 2);
}

// With a CUDA runtime, ncclMemAlloc hands out device memory (NVIDIA's does,
// and CUDA programs write it from kernels), collectives stage it like any
// device buffer, and ncclMemFree returns it to cudaFree.
TEST(NcclCudaStaged, MemAllocGivesDeviceMemory) {
  auto attrs = mock().sym<int (*)(loom::cuda::CudaPointerAttributes*, const void*)>("cudaPointerGetAttributes");
  ASSERT_NE(attrs, nullptr);
  auto is_device = [&](const void* p) {
    loom::cuda::CudaPointerAttributes a;
    return attrs(&a, p) == 0 && a.type == loom::cuda::CudaMemoryType::kDevice;
  };
  World w;
  const size_t n = 5000;
  float* buf[kN];
  for (int r = 0; r < kN; ++r) {
    void* p = nullptr;
    ASSERT_EQ(ncclMemAlloc(&p, n * sizeof(float)), ncclSuccess) << ncclGetLastError(nullptr);
    buf[r] = static_cast<float*>(p);
    EXPECT_TRUE(is_device(p)) << "rank " << r << ": ncclMemAlloc gave host memory";
    for (size_t i = 0; i < n; ++i) buf[r][i] = v(r, i);
  }
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(ncclAllReduce(buf[r], buf[r], n, ncclFloat32, ncclSum, w.c[r], w.s[r]), ncclSuccess)
        << ncclGetLastError(w.c[r]);
  w.sync();
  for (int r = 0; r < kN; ++r) EXPECT_ALL(buf[r], n, v(0, i) + v(1, i) + v(2, i) + v(3, i), "rank " << r);
  for (int r = 0; r < kN; ++r) {
    EXPECT_EQ(ncclMemFree(buf[r]), ncclSuccess) << ncclGetLastError(nullptr);
    EXPECT_FALSE(is_device(buf[r])) << "rank " << r << ": ncclMemFree did not give it to cudaFree";
  }
  EXPECT_EQ(ncclMemFree(nullptr), ncclSuccess);
}

// The runtime without cudaMemcpyAsync & co (the plain build of the mock) in
// a child process: device buffers are refused with the old reason.
TEST(NcclCudaStaged, RuntimeWithoutStagingRefusesDeviceBuffers) {
  if (kNoStagingChild) GTEST_SKIP() << "the child runs NoStagingChild";
  char self[PATH_MAX] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof self - 1), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("LOOM_TEST_NOSTAGING_CHILD", "1", 1);
    execl(self, self, "--gtest_filter=NcclCudaStaged.NoStagingChild", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's checks failed (its output is above)";
}

TEST(NcclCudaStaged, NoStagingChild) {
  if (!kNoStagingChild) GTEST_SKIP() << "run by RuntimeWithoutStagingRefusesDeviceBuffers";
  World w;
  DevBuf dev(1024);
  std::vector<float> host(1024, 1.0f);
  EXPECT_EQ(ncclAllReduce(dev.p, host.data(), 1024, ncclFloat32, ncclSum, w.c[0], w.s[0]), ncclInvalidArgument);
  std::string why = ncclGetLastError(w.c[0]);
  EXPECT_NE(why.find("sendbuff"), std::string::npos) << why;
  EXPECT_NE(why.find("CUDA device memory"), std::string::npos) << why;
  EXPECT_NE(why.find("CUDA memory backend"), std::string::npos) << why;
  EXPECT_EQ(ncclRecv(dev.p, 1024, ncclFloat32, 1, w.c[1], w.s[1]), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(w.c[1])).find("recvbuff"), std::string::npos);
  // Host memory still works there, stream-ordered (a host function waits).
  std::vector<float> out[kN];
  for (int r = 0; r < kN; ++r) {
    out[r].assign(1024, 0.0f);
    ASSERT_EQ(ncclAllReduce(host.data(), out[r].data(), 1024, ncclFloat32, ncclSum, w.c[r], w.s[r]), ncclSuccess)
        << ncclGetLastError(w.c[r]);
  }
  w.sync();
  for (int r = 0; r < kN; ++r) EXPECT_EQ(out[r][1023], 4.0f);
}

}  // namespace
