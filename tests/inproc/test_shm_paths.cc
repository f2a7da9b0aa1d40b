// The shared-memory transport's two data paths — FIFO copies and single-copy
// reads from the sender's memory (process_vm_readv) — give the same results,
// including messages that straddle the FIFO's wrap point and mixed sizes.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <thread>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "core/comm_impl.h"
#include "core/config.h"
#include "core/executor.h"
#include "transport/shm/shm_transport.h"

namespace loom {
namespace {

// n thread ranks created with the variables `env` set (and unset again after).
Result<std::vector<std::unique_ptr<Comm>>> init_with_env(
    int n, std::initializer_list<std::pair<const char*, const char*>> env) {
  for (const auto& [k, v] : env) setenv(k, v, 1);
  auto comms = Comm::init_all(n);
  for (const auto& [k, v] : env) unsetenv(k);
  return comms;
}

void run_all(std::vector<std::unique_ptr<Comm>>& comms, const std::vector<testing::Case>& cases) {
  const auto err = testing::run_cases_on_threads(comms, cases);
  for (size_t r = 0; r < err.size(); ++r) EXPECT_EQ(err[r], "") << "rank " << r;
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
  run_all(*comms, testing::mixed_cases(n, {3, 70001, size_t{1} << 18, (size_t{1} << 20) + 3, 5},
                                       {Collective::kAllReduce, Collective::kAllGather, Collective::kBroadcast,
                                        Collective::kReduceScatter, Collective::kAllToAll, Collective::kSendRecv}));
}

// Shared single copy: a root whose phase only sends writes half of each
// large message into the receiver while the receiver reads the other half.
// Odd sizes put the split off the element grid; both roots; then off.
void shared_copy_case(bool enabled) {
  if (enabled && params::host_cores() < 2)
    GTEST_SKIP() << "one CPU: 2 ranks share it, and senders never write into receivers then (shm_transport.cc)";
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

// Two single-copy thresholds: messages the receiver only stores go single
// copy from LOOM_SHM_SINGLE_COPY_PLAIN_BYTES, those it reduces from
// LOOM_SHM_SINGLE_COPY_BYTES. 64 KiB messages at 2 ranks, between the two:
// all_gather's (stored) are read from the sender, reduce_scatter's
// (reduced) go through the FIFO; with the plain threshold at 0, neither.
TEST(ShmPaths, StoredMessagesGoSingleCopyFromTheirOwnThreshold) {
  struct Mode {
    const char* plain_bytes;
    Collective coll;
    bool single_copy;
  };
  for (const Mode& m : {Mode{"16K", Collective::kAllGather, true}, Mode{"16K", Collective::kReduceScatter, false},
                        Mode{"0", Collective::kAllGather, false}}) {
    setenv("LOOM_SHM_SINGLE_COPY_PLAIN_BYTES", m.plain_bytes, 1);
    setenv("LOOM_ALGO", "all_gather:ring;reduce_scatter:ring", 1);
    auto comms = Comm::init_all(2);
    unsetenv("LOOM_SHM_SINGLE_COPY_PLAIN_BYTES");
    unsetenv("LOOM_ALGO");
    ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
    testing::Case cs;
    cs.coll = m.coll;
    cs.count = 16384;  // floats per rank: one 64 KiB message each way
    const uint64_t before = ShmTransport::single_copy_messages();
    run_all(*comms, {cs});
    const uint64_t got = ShmTransport::single_copy_messages() - before;
    if (m.single_copy) EXPECT_GT(got, 0u) << collective_name(m.coll) << " plain threshold " << m.plain_bytes;
    else EXPECT_EQ(got, 0u) << collective_name(m.coll) << " plain threshold " << m.plain_bytes;
  }
}

// Oversubscribed (more ranks on the host than CPUs), the default sends no
// reduced message from ordinary memory single copy: it would not lower the
// receiver's work, only add a system call and park the sender (regression:
// reduce_scatter ring, 8 ranks on 2 cores, 2 MiB: 1930-1977 us with 256 KiB
// reduced messages single copy, 1190-1217 without). Stored messages still go
// single copy, and so do reduced ones from mem_alloc memory, which the
// receiver reads in place (Segment::map_min_bytes): the ring's partial sums
// live in scratch that is such memory, so with mapping on some of its
// messages go single copy, with LOOM_SHM_MAP_SHARED=0 none. With a CPU per
// rank the reduced ones do, from 256 KiB.
TEST(ShmPaths, OversubscribedRanksReadNoReducedMessageSingleCopy) {
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  struct Mode {
    int ranks;
    Collective coll;
    const char* map;
    bool single_copy;
  };
  std::vector<Mode> modes = {{cpus + 1, Collective::kReduceScatter, "0", false},
                             {cpus + 1, Collective::kReduceScatter, "1", true},
                             {cpus + 1, Collective::kAllGather, "0", true}};
  if (cpus >= 2) modes.push_back({2, Collective::kReduceScatter, "0", true});
  for (const Mode& m : modes) {
    setenv("LOOM_SHM_FIFO_BYTES", "256K", 1);  // cpus + 1 ranks: keep the FIFOs small
    setenv("LOOM_ALGO", "all_gather:ring;reduce_scatter:ring", 1);
    setenv("LOOM_SHM_MAP_SHARED", m.map, 1);
    auto comms = Comm::init_all(m.ranks);
    unsetenv("LOOM_SHM_FIFO_BYTES");
    unsetenv("LOOM_ALGO");
    unsetenv("LOOM_SHM_MAP_SHARED");
    ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
    testing::Case cs;
    cs.coll = m.coll;
    cs.count = 65536;  // floats per rank: 256 KiB ring messages
    const uint64_t before = ShmTransport::single_copy_messages();
    run_all(*comms, {cs});
    const uint64_t got = ShmTransport::single_copy_messages() - before;
    const std::string what = std::string(collective_name(m.coll)) + ", " + std::to_string(m.ranks) + " ranks, " +
                             std::to_string(cpus) + " CPUs, LOOM_SHM_MAP_SHARED=" + m.map;
    if (m.single_copy) EXPECT_GT(got, 0u) << what;
    else EXPECT_EQ(got, 0u) << what;
  }
}

// The default thresholds. Stored messages: 256 KiB (regression: 16 KiB with
// a CPU per rank made freshly written data 1.4-2.5x slower at 16-128 KiB,
// perf-tests --fresh; see config.cc). Reduced messages: 256 KiB with a CPU
// per rank, never when oversubscribed, between threads; never between
// processes (a reducing collective's messages through the FIFO measured 2x
// faster than process_vm_readv: config.cc). An explicit
// LOOM_SHM_SINGLE_COPY_BYTES sets all three, LOOM_SHM_SINGLE_COPY_PLAIN_BYTES its own.
TEST(ShmPaths, SingleCopyThresholdDefaults) {
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  EXPECT_EQ(params::shm_single_copy_xproc_bytes(1), 0u);
  EXPECT_EQ(params::shm_single_copy_xproc_bytes(cpus + 1), 0u);
  EXPECT_EQ(params::shm_single_copy_plain_bytes(1), 256u << 10);
  EXPECT_EQ(params::shm_single_copy_plain_bytes(cpus), 256u << 10);
  EXPECT_EQ(params::shm_single_copy_plain_bytes(cpus + 1), 256u << 10);
  EXPECT_EQ(params::shm_single_copy_bytes(1), 256u << 10);
  EXPECT_EQ(params::shm_single_copy_bytes(cpus), 256u << 10);
  EXPECT_EQ(params::shm_single_copy_bytes(cpus + 1), 0u);
  EXPECT_EQ(params::shm_single_copy_plain_xproc_bytes(1), 0u);
  EXPECT_EQ(params::shm_single_copy_plain_xproc_bytes(cpus), 0u);
  EXPECT_EQ(params::shm_single_copy_plain_xproc_bytes(cpus + 1), 0u) << "oversubscribed: the FIFO too (run 18)";
  setenv("LOOM_SHM_SINGLE_COPY_BYTES", "64K", 1);
  EXPECT_EQ(params::shm_single_copy_plain_xproc_bytes(1), 64u << 10);
  EXPECT_EQ(params::shm_single_copy_xproc_bytes(1), 64u << 10);
  EXPECT_EQ(params::shm_single_copy_xproc_bytes(cpus + 1), 64u << 10);
  EXPECT_EQ(params::shm_single_copy_plain_bytes(1), 64u << 10);
  EXPECT_EQ(params::shm_single_copy_bytes(cpus + 1), 64u << 10);
  EXPECT_EQ(params::shm_single_copy_plain_bytes(cpus + 1), 64u << 10);
  setenv("LOOM_SHM_SINGLE_COPY_PLAIN_BYTES", "8K", 1);
  EXPECT_EQ(params::shm_single_copy_plain_bytes(1), 8u << 10);
  EXPECT_EQ(params::shm_single_copy_plain_bytes(cpus + 1), 8u << 10);
  EXPECT_EQ(params::shm_single_copy_plain_xproc_bytes(1), 8u << 10);
  unsetenv("LOOM_SHM_SINGLE_COPY_BYTES");
  unsetenv("LOOM_SHM_SINGLE_COPY_PLAIN_BYTES");
}

// A FIFO write publishes at most LOOM_SHM_FIFO_STEP_BYTES, so the receiver
// copies one step out while the sender copies the next in (2 ranks, 1 MiB
// broadcast through a 2 MiB FIFO: unlimited, the whole message is one write;
// 64K steps, at least 16).
TEST(ShmPaths, FifoWritesAreStepSized) {
  for (const char* step : {"64K", "0"}) {
    setenv("LOOM_SHM_SINGLE_COPY_BYTES", "0", 1);
    setenv("LOOM_SHM_FIFO_BYTES", "2M", 1);
    setenv("LOOM_SHM_FIFO_STEP_BYTES", step, 1);
    auto comms = Comm::init_all(2);
    unsetenv("LOOM_SHM_SINGLE_COPY_BYTES");
    unsetenv("LOOM_SHM_FIFO_BYTES");
    unsetenv("LOOM_SHM_FIFO_STEP_BYTES");
    ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
    testing::Case cs;
    cs.coll = Collective::kBroadcast;
    cs.count = size_t{1} << 20;
    cs.dt = DataType::kInt8;
    const uint64_t before = ShmTransport::fifo_writes();
    run_all(*comms, {cs});
    const uint64_t writes = ShmTransport::fifo_writes() - before;
    if (std::string(step) == "0") EXPECT_LE(writes, 4u) << "unlimited steps";
    else EXPECT_GE(writes, 16u) << "64K steps";
  }
}

// Steps default to 256K with a CPU per rank, none oversubscribed (each step a
// waiting receiver takes would be a context switch there).
// Local copies from a quarter of the last-level cache take streaming
// stores (performance.md Run 19); the variable sets the size, 0 = never.
TEST(ShmPaths, StreamCopyDefaults) {
  unsetenv("LOOM_COPY_STREAM_BYTES");
  EXPECT_GE(params::host_llc_bytes(), size_t{1} << 20);
  EXPECT_EQ(params::copy_stream_bytes(), params::host_llc_bytes() / 4);
  setenv("LOOM_COPY_STREAM_BYTES", "0", 1);
  EXPECT_EQ(params::copy_stream_bytes(), 0u);
  setenv("LOOM_COPY_STREAM_BYTES", "1M", 1);
  EXPECT_EQ(params::copy_stream_bytes(), 1u << 20);
  unsetenv("LOOM_COPY_STREAM_BYTES");
}

TEST(ShmPaths, FifoStepDefaults) {
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  EXPECT_EQ(params::shm_fifo_step_bytes(cpus), 256u << 10);
  EXPECT_EQ(params::shm_fifo_step_bytes(cpus + 1), 0u);
  setenv("LOOM_SHM_FIFO_STEP_BYTES", "96K", 1);
  EXPECT_EQ(params::shm_fifo_step_bytes(cpus + 1), 96u << 10);
  unsetenv("LOOM_SHM_FIFO_STEP_BYTES");
}

TEST(ShmPaths, FifoOnly) { run_mix(3, "0", "64K"); }
// A FIFO of no power-of-two size (72 KiB): positions wrap by the modulo
// there, not at a power of two (a mask there would corrupt data; tried as
// a speed-up for the default sizes, performance.md Run 29, not kept).
TEST(ShmPaths, FifoOfNoPowerOfTwoSize) { run_mix(3, "0", "72K"); }
// Odd steps: partial reads and writes end off any power of two.
TEST(ShmPaths, FifoOddSteps) {
  setenv("LOOM_SHM_FIFO_STEP_BYTES", "4104", 1);
  run_mix(3, "0", "64K");
  unsetenv("LOOM_SHM_FIFO_STEP_BYTES");
}
// Streaming stores for every plain receive out of the FIFO and every local
// copy (LOOM_COPY_STREAM_BYTES=1; by default only from LLC/4), landing at odd
// offsets in odd steps.
TEST(ShmPaths, FifoStreamingCopies) {
  setenv("LOOM_COPY_STREAM_BYTES", "1", 1);
  setenv("LOOM_SHM_FIFO_STEP_BYTES", "4104", 1);
  run_mix(3, "0", "64K");
  unsetenv("LOOM_SHM_FIFO_STEP_BYTES");
  unsetenv("LOOM_COPY_STREAM_BYTES");
}
// FIFO steps by streaming stores (LOOM_SHM_STREAM_STORES=1, as a sender whose
// peer shares no cache with it writes them; shared_stores.h): 20 KiB steps
// through a 72 KiB FIFO, so steps start off any 32-byte boundary and wrap; the
// same cases with cached stores forced stream none.
TEST(ShmPaths, FifoStepsByStreamingStores) {
  for (const char* mode : {"1", "0"}) {
    auto comms = init_with_env(3, {{"LOOM_SHM_STREAM_STORES", mode},
                                   {"LOOM_SHM_SINGLE_COPY_BYTES", "0"},
                                   {"LOOM_SHM_FIFO_BYTES", "72K"},
                                   {"LOOM_SHM_FIFO_STEP_BYTES", "20K"}});
    ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
    const uint64_t before = ShmTransport::streamed_steps(), switches_before = ShmTransport::store_switches();
    run_all(*comms, testing::mixed_cases(3, {3, 70001, size_t{1} << 18, (size_t{1} << 20) + 3, 5},
                                         {Collective::kAllReduce, Collective::kAllGather, Collective::kBroadcast,
                                          Collective::kReduceScatter, Collective::kAllToAll, Collective::kSendRecv}));
    const uint64_t streamed = ShmTransport::streamed_steps() - before;
    if (std::string(mode) == "1") EXPECT_GE(streamed, 50u) << "every step from 16 KiB streams";
    else EXPECT_EQ(streamed, 0u) << "cached stores forced";
    EXPECT_EQ(ShmTransport::store_switches(), switches_before) << "a fixed choice never switches";
  }
}
// A staged broadcast (ranks sharing cores: the root copies its buffer once
// into scratch, peers read it through a mapping) copies into scratch through
// the executor's SharedStores, in 256 KiB pieces: streaming forced, all 16
// pieces of a 4 MiB block stream; cached forced, none; results checked in
// and out of place, both times.
TEST(ShmPaths, StagedCopiesIntoScratchByStreamingStores) {
  const int n = std::max(4, params::host_cores() + 2);  // more ranks than cores: the broadcast is staged
  for (const char* mode : {"1", "0"}) {
    auto comms = init_with_env(n, {{"LOOM_SHM_STREAM_STORES", mode},
                                   {"LOOM_ALGO", "broadcast:direct"},
                                   {"LOOM_COPY_STREAM_BYTES", "0"},  // no copy streams by size alone
                                   {"LOOM_LLC_BYTES", "32M"},
                                   {"LOOM_TIMEOUT", "60"}});
    ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
    std::vector<testing::Case> cases;
    for (bool in_place : {false, true}) {
      testing::Case cs;
      cs.coll = Collective::kBroadcast;
      cs.count = size_t{1} << 20;  // 4 MiB of floats
      cs.in_place = in_place;
      cases.push_back(cs);
    }
    run_all(*comms, cases);
    const auto& root = (*comms)[0]->impl()->executor_for_test().scratch_copies();
    EXPECT_EQ(root.copies, 2u) << "one staging copy per broadcast";
    if (std::string(mode) == "1") EXPECT_EQ(root.streamed_pieces, 32u) << "16 pieces of 256 KiB per copy";
    else EXPECT_EQ(root.streamed_pieces, 0u);
  }
}
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

// Sends to self are local copies, run before the group's transfers: they
// must not clobber what another send of the group still has to read (a
// staged send, or a later send to self), and each send delivers the data
// its buffer held when the group was issued. Regression: the self copies
// were put in front of the staging copies, in reverse order: rank 1 got B
// instead of A, and Z got X instead of Y (found by a helper's review).
TEST(ShmPaths, SendsToSelfDoNotClobberOtherSendsOfTheGroup) {
  auto comms = Comm::init_all(2);
  ASSERT_TRUE(comms.is_ok());
  Comm& c0 = *(*comms)[0];
  Comm& c1 = *(*comms)[1];
  for (size_t count : {size_t{4}, size_t{1} << 18}) {
    // Rank 0: send(A -> 1), send(B -> self), recv(A <- self); rank 1: recv(C <- 0).
    std::vector<int32_t> a(count, 1), b(count, 9), c(count, 0);
    std::string err1;
    std::thread t1([&] {
      auto w = c1.recv(c.data(), count, DataType::kInt32, 0);
      Status st = w.is_ok() ? w->wait() : w.status();
      if (!st.is_ok()) err1 = st.to_string();
    });
    c0.group_start();
    (void)c0.send(a.data(), count, DataType::kInt32, 1);
    (void)c0.send(b.data(), count, DataType::kInt32, 0);
    (void)c0.recv(a.data(), count, DataType::kInt32, 0);
    auto w = c0.group_end();
    Status st = w.is_ok() ? w->wait() : w.status();
    t1.join();
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_EQ(err1, "");
    EXPECT_EQ(c[0], 1) << "rank 1 got the send-to-self's data, count " << count;
    EXPECT_EQ(c[count - 1], 1);
    EXPECT_EQ(a[0], 9);
    // Rank 0 alone: send(Y -> self), recv(Z <- self), send(X -> self), recv(Y <- self).
    std::vector<int32_t> x(count, 3), y(count, 2), z(count, 0);
    c0.group_start();
    (void)c0.send(y.data(), count, DataType::kInt32, 0);
    (void)c0.recv(z.data(), count, DataType::kInt32, 0);
    (void)c0.send(x.data(), count, DataType::kInt32, 0);
    (void)c0.recv(y.data(), count, DataType::kInt32, 0);
    w = c0.group_end();
    st = w.is_ok() ? w->wait() : w.status();
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(z[0], 2) << "Z should get Y's data from before the group, count " << count;
    EXPECT_EQ(z[count - 1], 2);
    EXPECT_EQ(y[0], 3);
  }
}

// NCCL lets one group's sends and receives have their own data types (only
// the two ends of one message must agree). Rank 0 sends floats to rank 1 and
// int64s to rank 2 and receives bf16-sized halves from rank 2 in one group;
// ranks 1 and 2 do not mix. Regression: the mixed group was refused
// ("different data types in one group"), and its peers waited for it. A
// size mismatch is still caught when one end mixes.
TEST(ShmPaths, SendRecvGroupsMayMixDataTypes) {
  const int n = 3;
  auto comms = Comm::init_all(n);
  ASSERT_TRUE(comms.is_ok());
  for (size_t count : {size_t{5}, size_t{1} << 18}) {
    std::vector<float> f0(count), f1(count);
    std::vector<int64_t> i0(count), i2(count);
    std::vector<uint16_t> h0(count), h2(count);
    for (size_t i = 0; i < count; ++i) {
      f0[i] = static_cast<float>(i) + 0.5f;
      i0[i] = static_cast<int64_t>(i) * 3000000007LL;
      h2[i] = static_cast<uint16_t>(i * 7 + 1);
    }
    std::vector<std::string> err(n);
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        Comm& c = *(*comms)[r];
        c.group_start();
        if (r == 0) {
          (void)c.send(f0.data(), count, DataType::kFloat32, 1);
          (void)c.send(i0.data(), count, DataType::kInt64, 2);
          (void)c.recv(h0.data(), count, DataType::kBfloat16, 2);
        } else if (r == 1) {
          (void)c.recv(f1.data(), count, DataType::kFloat32, 0);
        } else {
          (void)c.recv(i2.data(), count, DataType::kInt64, 0);
          (void)c.send(h2.data(), count, DataType::kFloat16, 0);  // same size, another type: NCCL does not mind
        }
        auto w = c.group_end();
        Status st = w.is_ok() ? w->wait() : w.status();
        if (!st.is_ok()) err[r] = st.to_string();
      });
    for (auto& t : ts) t.join();
    for (int r = 0; r < n; ++r) ASSERT_EQ(err[r], "") << "rank " << r << ", count " << count;
    EXPECT_EQ(f1, f0);
    EXPECT_EQ(i2, i0);
    EXPECT_EQ(h0, h2);
  }
  // One end mixes, the other expects another size: the mismatch is named.
  std::vector<float> f(64);
  std::vector<int64_t> l(64);
  std::vector<std::string> err(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      Comm& c = *(*comms)[r];
      c.group_start();
      if (r == 0) {
        (void)c.send(f.data(), 64, DataType::kFloat32, 1);
        (void)c.recv(l.data(), 64, DataType::kInt64, 1);
      } else {
        (void)c.recv(f.data(), 32, DataType::kFloat32, 0);  // half of what rank 0 sends
        (void)c.send(l.data(), 64, DataType::kInt64, 0);
      }
      auto w = c.group_end();
      Status st = w.is_ok() ? w->wait() : w.status();
      err[r] = st.to_string();
    });
  for (auto& t : ts) t.join();
  EXPECT_NE(err[1].find("mismatched operations"), std::string::npos) << err[1];
  EXPECT_NE(err[1].find("send(256 B to rank 1)"), std::string::npos) << err[1];
}

// Data events wake a sleeping rank. Peers ring a receiver's doorbell only
// while it is armed for sleep (Transport::arm_wait), so a lost wake-up would
// not hang but end each wait by its 50 ms timeout: the test counts those.
// Ranks sleep at once (LOOM_SPIN=1, no time floor) while the other rank
// comes late, for each kind of event: FIFO bytes (small allreduce), FIFO
// space freed (1 MiB through a 4 KiB FIFO), single-copy acknowledgements.
TEST(ShmPaths, SleepingRanksAreWokenByDataEvents) {
  struct Mode {
    const char* single_copy_bytes;
    Collective coll;
    size_t count;
  };
  for (const Mode& m : {Mode{"0", Collective::kAllReduce, 2}, Mode{"0", Collective::kBroadcast, size_t{1} << 18},
                        Mode{"1", Collective::kBroadcast, size_t{1} << 18}}) {
    setenv("LOOM_SPIN", "1", 1);
    setenv("LOOM_SPIN_US", "0", 1);
    setenv("LOOM_SHM_FIFO_BYTES", "4K", 1);
    setenv("LOOM_SHM_SINGLE_COPY_BYTES", m.single_copy_bytes, 1);
    setenv("LOOM_SHM_SHARED_COPY", "0", 1);
    auto comms = Comm::init_all(2);
    for (const char* v : {"LOOM_SPIN", "LOOM_SPIN_US", "LOOM_SHM_FIFO_BYTES", "LOOM_SHM_SINGLE_COPY_BYTES",
                          "LOOM_SHM_SHARED_COPY"})
      unsetenv(v);
    ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
    const uint64_t before = ShmTransport::wait_timeouts(), missed_before = ShmTransport::missed_wakeups();
    std::vector<std::string> err(2);
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] {
        testing::Case cs;
        cs.coll = m.coll;
        cs.count = m.count;
        for (int it = 0; it < 20 && err[r].empty(); ++it) {
          cs.root = it % 2;
          if (it % 2 == r) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the peer sleeps meanwhile
          Status st = testing::run_case(*(*comms)[r], cs);
          if (!st.is_ok()) err[r] = st.to_string();
        }
      });
    for (auto& t : ts) t.join();
    for (int r = 0; r < 2; ++r) EXPECT_EQ(err[r], "") << "rank " << r;
    EXPECT_EQ(ShmTransport::missed_wakeups() - missed_before, 0u)
        << collective_name(m.coll) << " single copy from " << m.single_copy_bytes
        << " B: an event arrived during a wait and did not end it";
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
    // Stricter where the peer is fast enough: waits end by their event, not
    // their 50 ms timeout. A doorbell never rung times out every sleeping
    // wait (the allreduce: one per late iteration, 10; the broadcasts: one
    // per 4 KiB of FIFO, hundreds); a peer that lost its core for 50 ms on a
    // loaded machine times out one now and then (run 18 under a sanitizer
    // beside another test: 8-29; none alone), so a few are allowed. Only a
    // missed wake-up (above) is a bug under a sanitizer.
    EXPECT_LE(ShmTransport::wait_timeouts() - before, 3u)
        << collective_name(m.coll) << " single copy from " << m.single_copy_bytes << " B: waits ended by timeout";
#endif
  }
}

// Doorbells a rank owes are paid while its phase still waits. The executor
// holds the doorbells that its writes owe sleeping peers (one fence later
// instead of one per write, Transport::hold_doorbells) and pays them from
// its second idle poll on. Here rank 1's phase sends to rank 0 and then
// waits ~200 ms for rank 0's answer, while rank 0 sleeps (LOOM_SPIN=1, no
// time floor) in its receive. Were the doorbell held until rank 1's phase
// ends, rank 0 would wake only when its wait times out (50 ms chunks).
TEST(ShmPaths, HeldDoorbellsArePaidWhileThePhaseWaits) {
  auto comms = init_with_env(2, {{"LOOM_SPIN", "1"}, {"LOOM_SPIN_US", "0"}});
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  using Clock = std::chrono::steady_clock;
  for (size_t count : {size_t{2}, size_t{300}}) {  // int32: a slot, the FIFO
    // The fastest of 3 rounds: a held doorbell makes every round ~45 ms late
    // (rank 0 wakes by its wait's timeout), while one round can be late on a
    // loaded machine for other reasons (between `sent` and rank 0's return
    // lie two or three thread hand-offs).
    double best_ms = 1e9;
    for (int round = 0; round < 3; ++round) {
      Clock::time_point sent, woke;
      std::vector<std::string> err(2);
      std::vector<std::thread> ts;
      for (int r = 0; r < 2; ++r)
        ts.emplace_back([&, r] {
          Comm& c = *(*comms)[r];
          std::vector<int32_t> out(count, 7 + r), in(count, -1);
          Status st;
          if (r == 0) {
            auto w = c.recv(in.data(), count, DataType::kInt32, 1);
            st = w.is_ok() ? w->wait() : w.status();
            woke = Clock::now();
            if (st.is_ok()) {
              std::this_thread::sleep_for(std::chrono::milliseconds(200));
              auto w2 = c.send(out.data(), count, DataType::kInt32, 1);
              st = w2.is_ok() ? w2->wait() : w2.status();
            }
          } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));  // rank 0 is asleep by now
            c.group_start();
            (void)c.send(out.data(), count, DataType::kInt32, 0);
            (void)c.recv(in.data(), count, DataType::kInt32, 0);
            sent = Clock::now();
            auto w = c.group_end();
            st = w.is_ok() ? w->wait() : w.status();
          }
          if (st.is_ok() && in != std::vector<int32_t>(count, 7 + (1 - r))) st = Status(StatusCode::kInternal, "wrong data");
          if (!st.is_ok()) err[r] = st.to_string();
        });
      for (auto& t : ts) t.join();
      for (int r = 0; r < 2; ++r) ASSERT_EQ(err[r], "") << "rank " << r << ", " << count << " elements";
      best_ms = std::min(best_ms, std::chrono::duration<double, std::milli>(woke - sent).count());
    }
    const double late_ms = best_ms;
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
    // Woken by the doorbell: well under a millisecond here; by the wait's
    // timeout: ~45 ms. Sanitized on a loaded host a thread can lose its core
    // for that long, so there only the data is checked.
    EXPECT_LT(late_ms, 25.0) << count << " elements: rank 0 woke " << late_ms << " ms after rank 1 sent";
#else
    (void)late_ms;
#endif
  }
}

// Small messages travel in cache-line slots (LOOM_SHM_SLOTS). One group
// sends messages to one peer, in order: first slot-sized ones (up to the
// 120 B payload with the 32 B header every send/recv message carries), 36 more than the ring
// holds, while the receiver comes 3 ms late, so the sender fills every slot
// and has to wait for the receiver to free them; then 60 of slot, FIFO (just
// above a slot) and single-copy sizes mixed.
// With slots off everything takes the old paths; the results must agree.
TEST(ShmPaths, SmallMessageSlotsKeepOrderAndWaitWhenFull) {
  for (const char* slots : {"1", "0"}) {
    setenv("LOOM_SHM_SLOTS", slots, 1);
    setenv("LOOM_SHM_SINGLE_COPY_BYTES", "64K", 1);
    setenv("LOOM_TIMEOUT", "30", 1);  // a lost or overwritten slot fails here, not after 300 s
    auto comms = Comm::init_all(2);
    unsetenv("LOOM_TIMEOUT");
    unsetenv("LOOM_SHM_SLOTS");
    unsetenv("LOOM_SHM_SINGLE_COPY_BYTES");
    ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
    // int32 counts, each message with its 32 B fingerprint header: 2 (8 B),
    // 22 (88 B: a full slot), 23 (92 B: FIFO), 1, 50 (FIFO), 20000 (80 KB:
    // single copy). Until every send/recv message carried a header (only an
    // op's first to a peer did) the full slot was 30.
    // The first kSlotOnly all fit a slot (a single-copy message would hold the
    // sender back until it is read; these do not), then the sizes mix.
    const size_t counts[] = {2, 22, 23, 1, 50, 20000};
    const int kSlotOnly = static_cast<int>(ShmTransport::slot_ring_size()) + 36;
    const int kMsgs = kSlotOnly + 60;
    auto count_of = [&](int i) { return i < kSlotOnly ? (i % 2 ? size_t{22} : size_t{2}) : counts[i % 6]; };
    const uint64_t before = ShmTransport::slot_messages();
    std::vector<std::string> err(2);
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] {
        Comm& c = *(*comms)[r];
        std::vector<std::vector<int32_t>> bufs(kMsgs);
        if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(3));
        c.group_start();
        for (int i = 0; i < kMsgs; ++i) {
          bufs[i].assign(count_of(i), -1);
          if (r == 0) {
            for (size_t k = 0; k < bufs[i].size(); ++k) bufs[i][k] = static_cast<int32_t>(i * 100000 + k);
            (void)c.send(bufs[i].data(), bufs[i].size(), DataType::kInt32, 1);
          } else {
            (void)c.recv(bufs[i].data(), bufs[i].size(), DataType::kInt32, 0);
          }
        }
        auto w = c.group_end();
        Status st = w.is_ok() ? w->wait() : w.status();
        if (!st.is_ok()) {
          err[r] = st.to_string();
          c.abort("test failure");
          return;
        }
        if (r == 1)
          for (int i = 0; i < kMsgs && err[r].empty(); ++i)
            for (size_t k = 0; k < bufs[i].size(); ++k)
              if (bufs[i][k] != static_cast<int32_t>(i * 100000 + k)) {
                err[r] = "message " + std::to_string(i) + " element " + std::to_string(k) + " wrong";
                break;
              }
      });
    for (auto& t : ts) t.join();
    for (int r = 0; r < 2; ++r) EXPECT_EQ(err[r], "") << "slots " << slots << ", rank " << r;
    if (std::string(slots) == "1")
      EXPECT_GE(ShmTransport::slot_messages() - before, static_cast<uint64_t>(kSlotOnly)) << "a slot-sized message missed its slot";
    else EXPECT_EQ(ShmTransport::slot_messages() - before, 0u) << "LOOM_SHM_SLOTS=0 still used slots";
  }
}

// The first small message of an op to a peer carries the op's fingerprint
// header; the two pieces go out as one message straight from the header and
// the user's buffer (Connection::send_gather), in a slot or in the FIFO,
// instead of being copied into a stage first. A message that would wrap
// the small FIFO falls back to the stage and send_some. The receiver cannot
// tell which way a message came: results, and a mismatch still named.
TEST(ShmPaths, SmallFingerprintedMessagesGoWithoutStaging) {
  setenv("LOOM_TIMEOUT", "30", 1);
  setenv("LOOM_SHM_FIFO_BYTES", "16K", 1);  // 4 KiB messages wrap it every few ops
  auto comms = Comm::init_all(2);
  unsetenv("LOOM_SHM_FIFO_BYTES");
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  std::vector<testing::Case> cases;
  // 8 and 64 B with the header fit a slot; 1 and 4 KiB go through the FIFO.
  for (size_t count : {size_t{2}, size_t{16}, size_t{256}, size_t{1000}, size_t{1024}})
    for (bool in_place : {false, true}) {
      testing::Case cs;
      cs.count = count;
      cs.in_place = in_place;
      cs.dt = count == 1000 ? DataType::kInt32 : DataType::kFloat32;
      cases.push_back(cs);
      cs.coll = Collective::kBroadcast;
      cs.root = static_cast<int>(count % 2);
      cases.push_back(cs);
    }
  const size_t distinct = cases.size();
  for (int rep = 0; rep < 6; ++rep)
    for (size_t i = 0; i < distinct; ++i) cases.push_back(cases[i]);
  const uint64_t before = ShmTransport::gathered_messages();
  run_all(*comms, cases);
  const uint64_t gathered = ShmTransport::gathered_messages() - before;
  // Each case sends at least one fingerprinted small message per rank (two
  // ranks); the counter is approximate with ranks as threads.
  EXPECT_GE(gathered, static_cast<uint64_t>(cases.size())) << "small fingerprinted messages were staged";

  // A mismatch travels in a gathered header like any other.
  std::vector<std::string> err(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      std::vector<float> buf(2, 1.0f);
      auto w = (*comms)[r]->allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32,
                                      r == 0 ? RedOp::kSum : RedOp::kMax);
      Status st = w.is_ok() ? w->wait() : w.status();
      err[r] = st.to_string();
    });
  for (auto& t : ts) t.join();
  unsetenv("LOOM_TIMEOUT");
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(err[r].find("mismatched operations"), std::string::npos) << "rank " << r << ": " << err[r];
    EXPECT_NE(err[r].find(r == 0 ? "allreduce(max, 2 x fp32)" : "allreduce(sum, 2 x fp32)"), std::string::npos)
        << "rank " << r << ": " << err[r];
  }

  // Without fingerprints nothing is gathered: there is no header to join.
  setenv("LOOM_FINGERPRINT", "0", 1);
  auto plain = Comm::init_all(2);
  unsetenv("LOOM_FINGERPRINT");
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  const uint64_t before_plain = ShmTransport::gathered_messages();
  run_all(*plain, std::vector<testing::Case>(cases.begin(), cases.begin() + static_cast<ptrdiff_t>(distinct)));
  EXPECT_EQ(ShmTransport::gathered_messages() - before_plain, 0u);
}

// A 2-rank allreduce is one exchange (RankSchedule::single_exchange); up to
// 2 KiB it runs on Executor::run_exchange's short path: taken in its own
// polls when the peer is there, handed to the general loop when the peer is
// late (here rank 1 comes 2 ms late every 10th op), right results either
// way, in and out of place, slot and FIFO messages; larger ones go to run(). A
// mismatch seen there fails both ranks naming it. (A peer that never comes:
// CallerRuns.FailureAtIssueIsReported, 16 B, through the hand-over; it
// checks the phase the timeout names too.)
TEST(ShmPaths, OneExchangeOpsTakeTheShortPath) {
  auto comms = init_with_env(2, {{"LOOM_TIMEOUT", "30"}});
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  const size_t counts[] = {2, 75, 512};  // int32: 8 B (slot), 300 B and 2 KiB (FIFO)
  constexpr int kOps = 40;                // per size and placement
  std::vector<std::string> err(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      Comm& c = *(*comms)[r];
      for (size_t count : counts)
        for (int in_place = 0; in_place < 2 && err[r].empty(); ++in_place)
          for (int i = 0; i < kOps && err[r].empty(); ++i) {
            if (r == 1 && i % 10 == 9) std::this_thread::sleep_for(std::chrono::milliseconds(2));
            std::vector<int32_t> send(count), recv(count, -1);
            for (size_t k = 0; k < count; ++k) send[k] = static_cast<int32_t>((r + 1) * 1000 + i + k);
            int32_t* out = in_place ? send.data() : recv.data();
            auto w = c.allreduce(send.data(), out, count, DataType::kInt32, RedOp::kSum);
            Status st = w.is_ok() ? w->wait() : w.status();
            for (size_t k = 0; st.is_ok() && k < count; ++k)
              if (out[k] != static_cast<int32_t>(3000 + 2 * (i + k)))
                st = Status(StatusCode::kInternal, fmt::format("count {} in place {} op {} element {}: {}", count,
                                                               in_place, i, k, out[k]));
            if (!st.is_ok()) {
              err[r] = st.to_string();
              c.abort("test failure");
            }
          }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) ASSERT_EQ(err[r], "") << "rank " << r;
  const int ops = 3 * 2 * kOps;
  for (int r = 0; r < 2; ++r) {
    const auto& n = (*comms)[r]->impl()->executor_for_test().exchange_counts();
    SCOPED_TRACE(fmt::format("rank {}: answered {}, handed over {}, general {}", r, n.answered, n.handed_over,
                             n.general));
    EXPECT_EQ(n.answered + n.handed_over + n.general, static_cast<uint64_t>(ops)) << "an op not run as an exchange";
    // A broken short path answers none. How many it answers depends on the
    // cores: under ctest -j3 next to other suites rank 1 found rank 0 there
    // for 119 of 240 (rank 0 off its core), and ops / 2 failed.
    EXPECT_GE(n.answered, static_cast<uint64_t>(ops / 8)) << "the short path's own polls took too few";
    EXPECT_LE(n.general, static_cast<uint64_t>(ops / 10)) << "messages the transport could not take whole";
  }
  // Rank 0 waits 2 ms for each late op of rank 1: far past its own polls
  // (unless it lost its core for that long after sending: half will do).
  EXPECT_GE((*comms)[0]->impl()->executor_for_test().exchange_counts().handed_over, static_cast<uint64_t>(ops / 20));

  // Beyond Executor::kExchangeMaxBytes: the general path (run()).
  uint64_t general_before[2];
  for (int r = 0; r < 2; ++r) general_before[r] = (*comms)[r]->impl()->executor_for_test().exchange_counts().general;
  ts.clear();
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      std::vector<int32_t> buf(Executor::kExchangeMaxBytes / sizeof(int32_t) + 1, r + 1);
      for (int i = 0; i < 5 && err[r].empty(); ++i) {
        auto w = (*comms)[r]->allreduce(buf.data(), buf.data(), buf.size(), DataType::kInt32, RedOp::kSum);
        Status st = w.is_ok() ? w->wait() : w.status();
        if (st.is_ok() && buf.back() != 3 << i) st = Status(StatusCode::kInternal, fmt::format("op {}: {}", i, buf.back()));
        if (!st.is_ok()) err[r] = st.to_string();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(err[r], "") << "rank " << r;
    EXPECT_EQ((*comms)[r]->impl()->executor_for_test().exchange_counts().general - general_before[r], 5u) << "rank " << r;
  }

  // Different calls (int32 against float): both ranks fail, naming the mismatch.
  std::vector<Status> st(2);
  ts.clear();
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      std::vector<int32_t> buf(2, 1);
      auto w = (*comms)[r]->allreduce(buf.data(), buf.data(), 2, r == 0 ? DataType::kInt32 : DataType::kFloat32,
                                      RedOp::kSum);
      st[r] = w.is_ok() ? w->wait() : w.status();
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(st[r].is_ok()) << "rank " << r;
    // The rank that fails second may learn of it from the other's failure instead.
    if (st[r].code() != StatusCode::kRemoteError) {
      EXPECT_NE(st[r].message().find("mismatch"), std::string::npos) << "rank " << r << ": " << st[r].to_string();
    }
  }
  EXPECT_TRUE(st[0].code() != StatusCode::kRemoteError || st[1].code() != StatusCode::kRemoteError)
      << "neither rank saw the mismatch: " << st[0].to_string() << " / " << st[1].to_string();
}

// Ops whose every transfer is its peer's only one (RankSchedule::short_path:
// binomial broadcast and reduce, the direct allreduce) run on
// Executor::run_short up to 2 KiB per message: each send written whole, each
// receive taken whole if it is there, a phase with transfers left handed
// to the general loop and the next one tried the short way again (rank 3
// comes 2 ms late every 10th op). Results right, in and out of
// place, slot and FIFO messages, every root; every op counted on every
// rank; larger messages go the general way.
TEST(ShmPaths, OneMessagePerPeerOpsTakeTheShortPath) {
  auto comms = init_with_env(4, {{"LOOM_TIMEOUT", "30"},
                                 {"LOOM_ALGO", "broadcast:binomial;reduce:binomial;allreduce:direct"}});
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  constexpr int kRanks = 4;
  const size_t counts[] = {2, 75, 512};  // int32: 8 B (slot), 300 B and 2 KiB (FIFO)
  constexpr int kOps = 24;                // per size, placement and collective
  std::vector<std::string> err(kRanks);
  auto check = [](int32_t got, int32_t want, const char* what, size_t count, int in_place, int i, size_t k) {
    if (got == want) return Status::ok();
    return Status(StatusCode::kInternal, fmt::format("{} count {} in place {} op {} element {}: {} (want {})", what,
                                                     count, in_place, i, k, got, want));
  };
  auto run = [&](int r, size_t count) {
    Comm& c = *(*comms)[r];
    for (int in_place = 0; in_place < 2 && err[r].empty(); ++in_place)
      for (int i = 0; i < kOps && err[r].empty(); ++i) {
          if (r == 3 && i % 10 == 9) std::this_thread::sleep_for(std::chrono::milliseconds(2));
          const int root = i % kRanks;
          std::vector<int32_t> send(count), recv(count, -1);
          for (size_t k = 0; k < count; ++k) send[k] = static_cast<int32_t>((r + 1) * 1000 + i + k);
          int32_t* out = in_place ? send.data() : recv.data();
          Status st;
          // broadcast: root's values everywhere
          auto w = c.broadcast(send.data(), out, count, DataType::kInt32, root);
          st = w.is_ok() ? w->wait() : w.status();
          for (size_t k = 0; st.is_ok() && k < count; ++k)
            st = check(out[k], static_cast<int32_t>((root + 1) * 1000 + i + k), "broadcast", count, in_place, i, k);
          // reduce: the sum at the root
          for (size_t k = 0; st.is_ok() && k < count; ++k) send[k] = static_cast<int32_t>((r + 1) * 1000 + i + k);
          if (st.is_ok()) {
            w = c.reduce(send.data(), out, count, DataType::kInt32, RedOp::kSum, root);
            st = w.is_ok() ? w->wait() : w.status();
          }
          for (size_t k = 0; st.is_ok() && r == root && k < count; ++k)
            st = check(out[k], static_cast<int32_t>(10000 + 4 * (i + k)), "reduce", count, in_place, i, k);
          // allreduce: the sum everywhere
          for (size_t k = 0; st.is_ok() && k < count; ++k) send[k] = static_cast<int32_t>((r + 1) * 1000 + i + k);
          if (st.is_ok()) {
            w = c.allreduce(send.data(), out, count, DataType::kInt32, RedOp::kSum);
            st = w.is_ok() ? w->wait() : w.status();
          }
          for (size_t k = 0; st.is_ok() && k < count; ++k)
            st = check(out[k], static_cast<int32_t>(10000 + 4 * (i + k)), "allreduce", count, in_place, i, k);
          if (!st.is_ok()) {
            err[r] = st.to_string();
            c.abort("test failure");
          }
        }
  };
  auto run_all_ranks = [&](size_t count) {
    std::vector<std::thread> ts;
    for (int r = 0; r < kRanks; ++r) ts.emplace_back(run, r, count);
    for (auto& t : ts) t.join();
    for (int r = 0; r < kRanks; ++r) ASSERT_EQ(err[r], "") << "rank " << r;
  };
  for (size_t count : counts) run_all_ranks(count);
  const uint64_t ops = 3 * 2 * kOps * 3;  // sizes x placements x ops x collectives
  uint64_t answered = 0, handed_over = 0, resumed = 0;
  for (int r = 0; r < kRanks; ++r) {
    const auto& n = (*comms)[r]->impl()->executor_for_test().short_counts();
    SCOPED_TRACE(fmt::format("rank {}: answered {}, handed over {}, resumed {}", r, n.answered, n.handed_over,
                             n.resumed));
    EXPECT_EQ(n.answered + n.handed_over, ops) << "an op not run on the short path";
    answered += n.answered;
    handed_over += n.handed_over;
    resumed += n.resumed;
  }
  // An inner rank of the trees that waited for its parent (or child) writes
  // its next phase's messages the short way again.
  EXPECT_GE(resumed, 1u);
  // A broken short path finishes none itself (a root's sends alone always can).
  EXPECT_GE(answered, ops / 4);
  // Ranks wait 2 ms for each late op of rank 3: far past one look.
  EXPECT_GE(handed_over, static_cast<uint64_t>(kOps / 10));

  // Beyond Executor::kExchangeMaxBytes: the general path (neither count moves).
  std::vector<Executor::ShortCounts> before;
  for (int r = 0; r < kRanks; ++r) before.push_back((*comms)[r]->impl()->executor_for_test().short_counts());
  run_all_ranks(Executor::kExchangeMaxBytes / sizeof(int32_t) + 1);
  for (int r = 0; r < kRanks; ++r) {
    const auto& n = (*comms)[r]->impl()->executor_for_test().short_counts();
    EXPECT_EQ(n.answered + n.handed_over, before[r].answered + before[r].handed_over) << "rank " << r;
  }

  // LOOM_SHORT_PATH=0: the general loop for every op.
  auto off = init_with_env(2, {{"LOOM_TIMEOUT", "30"}, {"LOOM_SHORT_PATH", "0"}});
  ASSERT_TRUE(off.is_ok()) << off.status().to_string();
  std::vector<std::thread> ts;
  std::vector<Status> st(2);
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      std::vector<int32_t> buf(2, r == 0 ? 7 : 0);
      for (int i = 0; i < 10 && st[r].is_ok(); ++i) {
        auto w = (*off)[r]->broadcast(buf.data(), buf.data(), 2, DataType::kInt32, 0);
        st[r] = w.is_ok() ? w->wait() : w.status();
        if (st[r].is_ok() && buf[1] != 7) st[r] = Status(StatusCode::kInternal, fmt::format("op {}: {}", i, buf[1]));
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(st[r].is_ok()) << "rank " << r << ": " << st[r].to_string();
    const auto& n = (*off)[r]->impl()->executor_for_test().short_counts();
    EXPECT_EQ(n.answered + n.handed_over, 0u) << "rank " << r;
  }
}

// A 2 KiB exchange through a FIFO of 16 KiB: every ~8th message would wrap
// it, so send_gather cannot write it whole and the op runs as run(), whose
// message arrives in two pieces at a peer that may be in run_exchange's
// polls (it hands the rest to the general loop, header first). Results
// right, every op counted, both kinds seen.
TEST(ShmPaths, ShortExchangeAcrossTheFifoWrap) {
  auto comms = init_with_env(2, {{"LOOM_SHM_FIFO_BYTES", "16K"}, {"LOOM_TIMEOUT", "30"}});
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  constexpr int kOps = 200;
  constexpr size_t kCount = Executor::kExchangeMaxBytes / sizeof(int32_t);
  std::vector<std::string> err(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      Comm& c = *(*comms)[r];
      std::vector<int32_t> send(kCount), recv(kCount);
      for (int i = 0; i < kOps && err[r].empty(); ++i) {
        for (size_t k = 0; k < kCount; ++k) send[k] = static_cast<int32_t>((r + 1) * 100000 + i * 7 + k);
        auto w = c.allreduce(send.data(), recv.data(), kCount, DataType::kInt32, RedOp::kSum);
        Status st = w.is_ok() ? w->wait() : w.status();
        for (size_t k = 0; st.is_ok() && k < kCount; ++k)
          if (recv[k] != static_cast<int32_t>(300000 + 2 * (i * 7 + k)))
            st = Status(StatusCode::kInternal, fmt::format("op {} element {}: {}", i, k, recv[k]));
        if (!st.is_ok()) {
          err[r] = st.to_string();
          c.abort("test failure");
        }
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(err[r], "") << "rank " << r;
    const auto& n = (*comms)[r]->impl()->executor_for_test().exchange_counts();
    SCOPED_TRACE(fmt::format("rank {}: answered {}, handed over {}, general {}", r, n.answered, n.handed_over,
                             n.general));
    EXPECT_EQ(n.answered + n.handed_over + n.general, static_cast<uint64_t>(kOps));
    EXPECT_GE(n.general, static_cast<uint64_t>(kOps / 10)) << "no message met the wrap";
    EXPECT_GE(n.answered + n.handed_over, static_cast<uint64_t>(kOps / 2));
  }
}

// An idle receiver waits on the word that announces its message (the slot's
// stamp, the FIFO's tail: Connection::recv_watch) instead of whole polls.
// Rank 1 sends each message ~20 us after rank 0 started waiting for it: the
// word must turn ready inside such a wait (a word that never did would leave
// the "ready" count at 0). Every 10th message comes ~400 us late, longer
// than such waits last: they must end unready ("expired" > 0; a word that
// always read ready would not). Slot, FIFO and two-piece FIFO messages,
// results checked.
TEST(ShmPaths, IdleReceiverWaitsOnTheArrivalWord) {
  setenv("LOOM_TIMEOUT", "30", 1);
  auto comms = Comm::init_all(2);
  unsetenv("LOOM_TIMEOUT");
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  const uint64_t ready0 = Executor::watch_waits_ready(), expired0 = Executor::watch_waits_expired();
  const size_t counts[] = {2, 75, 2048};  // int32: 8 B (slot), 300 B and 8 KiB (FIFO)
  constexpr int kMsgs = 150;
  // Rounds of kMsgs until both kinds of ending were seen: on a loaded host
  // (ctest -j2) a thread may lose its core for longer than a wait lasts, and
  // only ~1 wait in 10 ended ready in one round. Up to 200 rounds (~10 ms
  // each): 20 were not always enough beside a busy core (3 and 7 ready waits
  // seen, in ctest -j2 and beside a spinning shell, at this and the previous
  // commit alike; 2 failures in 10 runs of the old build that way).
  //
  // Rank 1 starts each message's delay only once rank 0 has posted its
  // receive: it used to run ahead (a send ends once the bytes are in the
  // FIFO), and whenever rank 0 lost its core it found every later message
  // already there, never waiting. Beside a core-hogging process (`yes`)
  // that left 1-3 ready waits in 200 rounds, failing 5 runs in 8.
  uint64_t ready = 0, expired = 0;
  for (int round = 0; round < 200 && (ready < 10 || expired == 0); ++round) {
    std::vector<std::string> err(2);
    std::vector<std::thread> ts;
    std::atomic<int> posted{-1};
    std::atomic<bool> failed{false};
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] {
        Comm& c = *(*comms)[r];
        for (int i = 0; i < kMsgs && err[r].empty(); ++i) {
          std::vector<int32_t> buf(counts[i % 3], -1);
          Status st;
          if (r == 1) {
            while (posted.load(std::memory_order_acquire) < i && !failed.load()) std::this_thread::yield();
            const auto delay = std::chrono::microseconds(i % 10 == 9 ? 400 : 20);
            for (auto t0 = std::chrono::steady_clock::now(); std::chrono::steady_clock::now() - t0 < delay;) {
            }
            for (size_t k = 0; k < buf.size(); ++k) buf[k] = static_cast<int32_t>(i * 10000 + k);
            auto w = c.send(buf.data(), buf.size(), DataType::kInt32, 0);
            st = w.is_ok() ? w->wait() : w.status();
          } else {
            auto w = c.recv(buf.data(), buf.size(), DataType::kInt32, 1);
            posted.store(i, std::memory_order_release);
            st = w.is_ok() ? w->wait() : w.status();
            for (size_t k = 0; st.is_ok() && k < buf.size(); ++k)
              if (buf[k] != static_cast<int32_t>(i * 10000 + k)) {
                st = Status(StatusCode::kInternal, "message " + std::to_string(i) + " element " + std::to_string(k));
                break;
              }
          }
          if (!st.is_ok()) {
            err[r] = st.to_string();
            failed.store(true);
            c.abort("test failure");
          }
        }
      });
    for (auto& t : ts) t.join();
    for (int r = 0; r < 2; ++r) ASSERT_EQ(err[r], "") << "rank " << r;
    ready = Executor::watch_waits_ready() - ready0;
    expired = Executor::watch_waits_expired() - expired0;
  }
  EXPECT_GE(ready, 10u) << "idle receives did not see their message arrive through the watch word";
  EXPECT_GT(expired, 0u) << "a watch word read ready before its message came";
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

// Every page of every FIFO is read once at setup, in this process's own
// mappings. Regression: prefault stopped at MADV_POPULATE_WRITE, which under a
// sandboxing kernel (gVisor, this project's CI machines) succeeds without
// mapping anything into the process, so the first touch of each page still
// cost ~6-11 us during the first operations (8 ranks on 2 cores: a 64 KiB
// allreduce 1.3-1.7 ms per op until every FIFO had wrapped, 0.14 ms after).
// The page-fault count above does not see those faults; this counts the reads.
TEST(ShmPaths, EveryFifoPageIsReadAtSetup) {
  const int n = 3;
  const size_t fifo = 256 << 10, page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  setenv("LOOM_SHM_FIFO_BYTES", "256K", 1);
  const uint64_t before = ShmTransport::prefaulted_pages();
  auto comms = Comm::init_all(n);
  unsetenv("LOOM_SHM_FIFO_BYTES");
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  // Each rank: its inbound FIFO from every peer and its outbound one to it.
  const uint64_t least = static_cast<uint64_t>(n) * 2 * (n - 1) * (fifo / page);
  EXPECT_GE(ShmTransport::prefaulted_pages() - before, least);
}

// Regression (seen as test_kill failing about once in 40 runs under load): a
// rank that failed because another one was killed announces why in its
// segment and exits. A peer whose check read the flags just before the
// announcement and the liveness just after the exit said "rank N died",
// blaming the wrong rank. The probe below makes rank 0 fail and vanish at
// exactly that point, between check_peer's reads, when the check runs on the
// test's thread (the op runs there: caller waits); other threads (the
// watchdog's checks) see rank 0 alive, so only the op's own check decides.
Comm* g_failing_rank = nullptr;
std::thread::id g_op_thread;
std::atomic<int> g_liveness_probes{0};
bool fail_then_vanish(int) {
  if (std::this_thread::get_id() != g_op_thread) return true;
  if (g_liveness_probes.fetch_add(1) == 0 && g_failing_rank) g_failing_rank->abort("it saw rank 2 die");
  return false;
}

TEST(ShmPaths, APeerThatFailedAndLeftIsNotReportedDead) {
  auto comms = Comm::init_all(2);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  g_failing_rank = (*comms)[0].get();
  g_op_thread = std::this_thread::get_id();
  g_liveness_probes = 0;
  ShmTransport::set_liveness_probe_for_test(fail_then_vanish);
  // Rank 1 runs an allreduce rank 0 never joins, on this thread (it waits at
  // once), and checks its peer while it waits.
  (*comms)[1]->set_caller_waits(true);
  std::vector<float> buf(1024, 1.0f);
  auto w = (*comms)[1]->allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, RedOp::kSum);
  Status st = w.is_ok() ? w->wait() : w.status();
  ShmTransport::set_liveness_probe_for_test(nullptr);
  g_failing_rank = nullptr;
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(g_liveness_probes.load(), 1);
  EXPECT_NE(st.message().find("rank 0 failed"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("it saw rank 2 die"), std::string::npos) << st.to_string();
  EXPECT_EQ(st.message().find("died"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace loom
