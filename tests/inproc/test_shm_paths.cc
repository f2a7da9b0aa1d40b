// The shared-memory transport's two data paths — FIFO copies and single-copy
// reads from the sender's memory (process_vm_readv) — give the same results,
// including messages that straddle the FIFO's wrap point and mixed sizes.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <thread>

#include "common/test_util.h"
#include "transport/shm/shm_transport.h"

namespace loom {
namespace {

// Every rank (a thread) runs the cases in order; a failing rank aborts its
// communicator so the others do not wait for it.
template <typename Comms>
void run_all(Comms& comms, const std::vector<testing::Case>& cases) {
  const int n = static_cast<int>(comms.size());
  std::vector<std::string> err(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      for (const auto& c : cases) {
        Status st = testing::run_case(*comms[r], c);
        if (!st.is_ok()) {
          err[r] = st.to_string();
          comms[r]->abort("test failure");
          return;
        }
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(err[r], "") << "rank " << r;
}

void run_mix(int n, const char* single_copy_bytes, const char* fifo_bytes) {
  setenv("LOOM_SHM_SINGLE_COPY_BYTES", single_copy_bytes, 1);
  setenv("LOOM_SHM_FIFO_BYTES", fifo_bytes, 1);
  auto comms = Comm::init_all(n);
  unsetenv("LOOM_SHM_SINGLE_COPY_BYTES");
  unsetenv("LOOM_SHM_FIFO_BYTES");
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  // Sizes on both sides of the threshold, odd sizes that leave the FIFO
  // unaligned to the next message, and every collective that moves data.
  std::vector<testing::Case> cases;
  int k = 0;
  for (size_t count : {size_t{3}, size_t{70001}, size_t{1} << 18, (size_t{1} << 20) + 3, size_t{5}}) {
    for (Collective c : {Collective::kAllReduce, Collective::kAllGather, Collective::kBroadcast,
                         Collective::kReduceScatter, Collective::kAllToAll, Collective::kSendRecv}) {
      testing::Case cs;
      cs.coll = c;
      cs.count = count;
      cs.dt = (k % 2) ? DataType::kFloat32 : DataType::kInt8;
      cs.in_place = (k % 3) == 1 && c != Collective::kSendRecv;
      cs.root = k % n;
      ++k;
      cases.push_back(cs);
    }
  }
  run_all(*comms, cases);
}

// Shared single copy: a root whose phase only sends writes half of each
// large message into the receiver while the receiver reads the other half.
// Odd sizes put the split off the element grid; both roots; then off.
void shared_copy_case(bool enabled) {
  setenv("LOOM_SHM_SHARED_COPY", enabled ? "1" : "0", 1);
  auto comms = Comm::init_all(2);
  unsetenv("LOOM_SHM_SHARED_COPY");
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  const uint64_t before = ShmTransport::shared_copy_bytes();
  std::vector<testing::Case> cases;
  for (size_t count : {(size_t{1} << 20) + 3, size_t{1} << 19, (size_t{3} << 18) + 1})
    for (int root : {0, 1}) {
      testing::Case cs;
      cs.coll = Collective::kBroadcast;
      cs.count = count;
      cs.dt = count % 2 ? DataType::kInt8 : DataType::kFloat32;
      cs.in_place = true;  // out of place the root also copies, so it is not idle
      cs.root = root;
      cases.push_back(cs);
    }
  run_all(*comms, cases);
  const uint64_t pushed = ShmTransport::shared_copy_bytes() - before;
  if (enabled) EXPECT_GT(pushed, 0u) << "no sender wrote into a receiver";
  else EXPECT_EQ(pushed, 0u);
}

TEST(ShmPaths, SharedSingleCopy) { shared_copy_case(true); }
TEST(ShmPaths, SharedSingleCopyOff) { shared_copy_case(false); }

TEST(ShmPaths, FifoOnly) { run_mix(3, "0", "64K"); }
TEST(ShmPaths, SingleCopyLarge) { run_mix(3, "256K", "64K"); }
TEST(ShmPaths, SingleCopyEverything) { run_mix(4, "1", "4K"); }

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// Send and receive from the same buffer in one group (in place, like
// MPI_Sendrecv_replace): the receive must not overwrite data before the peer
// has read it, with the single-copy path too. Regression: sendrecv_perf's
// in-place column was wrong from 256 KiB on.
TEST(ShmPaths, InPlaceSendRecvInAGroup) {
  const int n = 3;
  auto comms = Comm::init_all(n);
  ASSERT_TRUE(comms.is_ok());
  std::vector<std::string> err(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      for (size_t count : {size_t{7}, size_t{1} << 16, size_t{1} << 20}) {
        std::vector<int32_t> buf(count);
        for (size_t i = 0; i < count; ++i) buf[i] = static_cast<int32_t>(r * 1000003 + i);
        Comm& c = *(*comms)[r];
        c.group_start();
        (void)c.send(buf.data(), count, DataType::kInt32, (r + 1) % n);
        (void)c.recv(buf.data(), count, DataType::kInt32, (r + n - 1) % n);
        auto w = c.group_end();
        Status st = w.is_ok() ? w->wait() : w.status();
        if (!st.is_ok()) {
          err[r] = st.to_string();
          return;
        }
        const int from = (r + n - 1) % n;
        for (size_t i = 0; i < count; ++i)
          if (buf[i] != static_cast<int32_t>(from * 1000003 + i)) {
            err[r] = "count " + std::to_string(count) + ": element " + std::to_string(i) + " wrong";
            return;
          }
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(err[r], "") << "rank " << r;
}

// The FIFOs are mapped in at setup. Regression: they were faulted in page by
// page while they filled for the first time (one fault in the sender's
// mapping, one in the receiver's), which made the first ~100 operations of
// 4-64 KiB 10-100x slower than the steady state, enough to ruin every
// nccl-tests-style run with its 20 iterations per size.
TEST(ShmPaths, FifosArePrefaultedAtSetup) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "sanitizer shadow memory faults on every first touch: page-fault counts mean nothing here";
#endif
  const int n = 2;
  setenv("LOOM_SHM_FIFO_BYTES", "2M", 1);
  setenv("LOOM_SHM_SINGLE_COPY_BYTES", "0", 1);  // all bytes through the FIFOs
  auto comms = Comm::init_all(n);
  unsetenv("LOOM_SHM_FIFO_BYTES");
  unsetenv("LOOM_SHM_SINGLE_COPY_BYTES");
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  const size_t count = 8192;  // 32 KiB: 128 ops push 4 MiB, twice around each FIFO
  std::vector<std::vector<float>> in(n, std::vector<float>(count, 1.0f)), out(n, std::vector<float>(count));
  auto run = [&](int ops) {
    std::vector<std::thread> ts;
    std::vector<std::string> err(n);
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        for (int i = 0; i < ops; ++i) {
          auto w = (*comms)[r]->allreduce(in[r].data(), out[r].data(), count, DataType::kFloat32, RedOp::kSum);
          Status st = w.is_ok() ? w->wait() : w.status();
          if (!st.is_ok()) {
            err[r] = st.to_string();
            return;
          }
        }
      });
    for (auto& t : ts) t.join();
    for (int r = 0; r < n; ++r) EXPECT_EQ(err[r], "") << "rank " << r;
  };
  run(1);  // schedules, staging buffers and thread stacks exist from here on
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  run(128);
  getrusage(RUSAGE_SELF, &after);
  const long faults = after.ru_minflt - before.ru_minflt;
  // Faulting the FIFOs in on use costs 2 ranks x 2 mappings x 512 pages = 2048.
  EXPECT_LT(faults, 300) << "minor page faults during 128 allreduces of 32 KiB";
  printf("minor page faults during 128 allreduces of 32 KiB: %ld\n", faults);
  EXPECT_EQ(out[0][0], 2.0f);
  EXPECT_EQ(out[1][count - 1], 2.0f);
}

}  // namespace
}  // namespace loom
