// A caller that waits for every op at once (Comm::set_caller_waits: the perf
// suite's -z 1, the shim's blocking communicators) runs an op at issue when
// nothing is queued or running, without the queue and the work object. These
// tests check that it does, that results and errors are the same as through
// the queue, and that an op never overtakes one issued before it.
#include <gtest/gtest.h>
#include <sched.h>
#include <time.h>

#include <atomic>
#include <cstdlib>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <fstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "core/comm_impl.h"
#include "core/threads.h"
#include "diag/hub.h"

namespace loom {
namespace {

// Thread `tid`'s scheduler state ('R', 'S', ...) from /proc, '?' if unknown.
char thread_state(long tid) {
  std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  std::getline(stat, line);
  // "tid (comm) S ...": the state follows the last ')'.
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() ? line[paren + 2] : '?';
}

// Pins the calling thread to the first CPU it may run on, until restore()
// (or the end of the scope) puts its affinity back.
struct OneCpu {
  cpu_set_t old_set;
  bool ok = false, pinned = false;
  OneCpu() {
    if (sched_getaffinity(0, sizeof old_set, &old_set) != 0) return;
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &old_set)) ++cpu;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ok = pinned = cpu < CPU_SETSIZE && sched_setaffinity(0, sizeof one, &one) == 0;
  }
  bool restore() {
    if (!pinned) return true;
    pinned = false;
    return sched_setaffinity(0, sizeof old_set, &old_set) == 0;
  }
  ~OneCpu() { (void)restore(); }
};

// Whether /proc tells a sleeping thread apart here: a thread blocked on a
// condition variable for a while must read 'S' (a sandboxing kernel may not
// keep thread states).
bool proc_reports_sleep() {
  std::mutex m;
  std::condition_variable cv;
  bool go = false;
  std::atomic<long> tid{0};
  std::thread t([&] {
    tid.store(current_thread_id());
    std::unique_lock<std::mutex> lk(m);
    cv.wait(lk, [&] { return go; });
  });
  while (tid.load() == 0) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const char state = thread_state(tid.load());
  {
    std::lock_guard<std::mutex> lk(m);
    go = true;
  }
  cv.notify_all();
  t.join();
  return state == 'S';
}

std::vector<testing::Case> mixed_cases(int n) {
  std::vector<testing::Case> cases;
  int k = 0;
  // Slot, FIFO and single-copy sizes; every collective that moves data.
  for (size_t count : {size_t{2}, size_t{1000}, size_t{100003}})
    for (Collective c : {Collective::kAllReduce, Collective::kAllGather, Collective::kBroadcast,
                         Collective::kReduceScatter, Collective::kAllToAll, Collective::kSendRecv}) {
      testing::Case cs;
      cs.coll = c;
      cs.count = count;
      cs.root = k++ % n;
      cases.push_back(cs);
    }
  return cases;
}

void run_cases(std::vector<std::unique_ptr<Comm>>& comms, bool caller_waits, std::vector<uint64_t>* inline_ops) {
  const int n = static_cast<int>(comms.size());
  const auto cases = mixed_cases(n);
  std::vector<std::string> err(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      Comm& c = *comms[r];
      c.set_caller_waits(caller_waits);
      const uint64_t before = c.impl()->inline_ops();
      for (int round = 0; round < 3 && err[r].empty(); ++round)
        for (const auto& cs : cases) {
          Status st = testing::run_case(c, cs);
          if (!st.is_ok()) {
            err[r] = cs.name() + ": " + st.to_string();
            c.abort("test failure");
            break;
          }
        }
      (*inline_ops)[r] = c.impl()->inline_ops() - before;
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(err[r], "") << "rank " << r;
}

TEST(CallerRuns, BlockingCallersRunOpsAtIssue) {
  auto comms = Comm::init_all(3);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  std::vector<uint64_t> inline_ops(3);
  run_cases(*comms, true, &inline_ops);
  const uint64_t ops = 3 * mixed_cases(3).size();
  for (int r = 0; r < 3; ++r) EXPECT_GE(inline_ops[r], ops) << "rank " << r << " queued ops it waited for at once";
}

TEST(CallerRuns, AsyncCallersQueue) {
  auto comms = Comm::init_all(3);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  std::vector<uint64_t> inline_ops(3);
  run_cases(*comms, false, &inline_ops);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(inline_ops[r], 0u) << "rank " << r;
}

// A loop of non-blocking calls queues at most LOOM_MAX_QUEUED_OPS ops: the
// issuer waits for half of them to run. Rank 1 comes 50 ms late, so nothing
// of rank 0's runs meanwhile. Regression: with no bound the queue held every
// op of the loop (all_reduce_perf -n 1000000 without -z: 420 MB per rank, and
// 8 B ops at 2.3-3.6 us instead of 1.0 for the heap's page faults).
std::vector<size_t> high_water_of_async_loop(const char* max_queued, std::vector<uint64_t>* waits) {
  setenv("LOOM_MAX_QUEUED_OPS", max_queued, 1);
  auto comms = Comm::init_all(2);
  unsetenv("LOOM_MAX_QUEUED_OPS");
  EXPECT_TRUE(comms.is_ok()) << comms.status().to_string();
  if (!comms.is_ok()) return {};
  constexpr int kOps = 100;
  const bool bounded = std::string(max_queued) != "0";
  std::vector<size_t> high(2);
  std::vector<std::string> err(2);
  std::atomic<int> issued{0};
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      Comm& c = *(*comms)[r];
      if (r == 1) {
        // Rank 1 comes late: once rank 0 has filled its bounded queue and
        // waits for room, or has queued its whole unbounded loop (up to 10
        // s). Regression (of the test): a fixed 50 ms, in which a rank 0
        // kept off its core on a loaded machine issued too few ops.
        auto& c0 = *(*comms)[0]->impl();
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while ((bounded ? c0.queue_full_waits() == 0 : issued.load() < kOps) &&
               std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      std::vector<float> in(4, static_cast<float>(r + 1)), out(4 * kOps, 0.f);
      Work last;
      for (int i = 0; i < kOps; ++i) {
        auto w = c.allreduce(in.data(), out.data() + 4 * i, 4, DataType::kFloat32, RedOp::kSum);
        if (!w.is_ok()) {
          err[r] = w.status().to_string();
          return;
        }
        last = *w;
        if (r == 0) issued.fetch_add(1);
      }
      Status st = last.wait();
      if (!st.is_ok()) err[r] = st.to_string();
      for (float v : out)
        if (v != 3.f && err[r].empty()) err[r] = "wrong result " + std::to_string(v);
      high[r] = c.impl()->queue_high_water();
      (*waits)[r] = c.impl()->queue_full_waits();
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(err[r], "") << "rank " << r;
  return high;
}

TEST(CallerRuns, AsyncQueueIsBounded) {
  std::vector<uint64_t> waits(2);
  auto high = high_water_of_async_loop("8", &waits);
  ASSERT_EQ(high.size(), 2u);
  EXPECT_LE(high[0], 8u);
  EXPECT_GE(waits[0], 1u) << "rank 0 filled its queue while rank 1 slept";
  high = high_water_of_async_loop("0", &waits);
  ASSERT_EQ(high.size(), 2u);
  EXPECT_GE(high[0], 90u) << "unbounded (0): rank 0 queued its whole loop";
  EXPECT_EQ(waits[0], 0u);
}

// Rank 0 issues a large allreduce without waiting (queued; the engine runs it
// and waits for rank 1, which comes 50 ms late), then a small blocking one.
// The small one must not run first: rank 1 issues both through the queue, in
// the same order, and the in-band fingerprints would report the mismatch.
TEST(CallerRuns, BlockingOpDoesNotOvertakeQueuedOne) {
  auto comms = Comm::init_all(2);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  std::vector<std::string> err(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      Comm& c = *(*comms)[r];
      std::vector<float> big(1 << 20, 1.0f), small(4, 2.0f);
      if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      c.set_caller_waits(false);
      auto a = c.allreduce(big.data(), big.data(), big.size(), DataType::kFloat32, RedOp::kSum);
      c.set_caller_waits(r == 0);
      auto b = c.allreduce(small.data(), small.data(), small.size(), DataType::kFloat32, RedOp::kSum);
      Status sb = b.is_ok() ? b->wait() : b.status();
      Status sa = a.is_ok() ? a->wait() : a.status();
      if (!sa.is_ok() || !sb.is_ok()) err[r] = sa.to_string() + " / " + sb.to_string();
      else if (big[12345] != 2.0f || small[3] != 4.0f) err[r] = "wrong result";
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(err[r], "") << "rank " << r;
}

// Work handles may be waited on from any thread. Rank 0 issues A (queued)
// and a second thread waits on it, so that thread, not the engine, may hold
// the engine gate running A while rank 1 is late; the engine then sleeps
// with an empty queue. Rank 0 issues B as a caller that waits (queued
// without waking the engine: its caller runs it) and waits on B with a
// timeout, which does not run ops itself. When A ends, its waiter must hand
// B to the engine. Regression: it only signalled the engine's gate variable,
// which the sleeping engine was not waiting on, and B never ran.
TEST(CallerRuns, AnOpQueuedBehindAnotherThreadsWaitIsRun) {
  auto comms = Comm::init_all(2);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  for (int round = 0; round < 30; ++round) {
    std::vector<std::string> err(2);
    std::thread late([&] {
      Comm& c = *(*comms)[1];
      std::vector<float> a(4096, 1.0f), b(4, 2.0f);
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
      c.set_caller_waits(true);
      auto wa = c.allreduce(a.data(), a.data(), a.size(), DataType::kFloat32, RedOp::kSum);
      auto wb = c.allreduce(b.data(), b.data(), b.size(), DataType::kFloat32, RedOp::kSum);
      Status sa = wa.is_ok() ? wa->wait(std::chrono::seconds(10)) : wa.status();
      Status sb = wb.is_ok() ? wb->wait(std::chrono::seconds(10)) : wb.status();
      if (!sa.is_ok() || !sb.is_ok()) err[1] = sa.to_string() + " / " + sb.to_string();
    });
    Comm& c = *(*comms)[0];
    std::vector<float> a(4096, 1.0f), b(4, 2.0f);
    c.set_caller_waits(false);
    auto wa = c.allreduce(a.data(), a.data(), a.size(), DataType::kFloat32, RedOp::kSum);
    ASSERT_TRUE(wa.is_ok());
    Status sa;
    std::thread waiter([&] { sa = wa->wait(); });
    std::this_thread::sleep_for(std::chrono::microseconds(500));
    c.set_caller_waits(true);
    auto wb = c.allreduce(b.data(), b.data(), b.size(), DataType::kFloat32, RedOp::kSum);
    ASSERT_TRUE(wb.is_ok());
    Status sb = wb->wait(std::chrono::seconds(10));
    waiter.join();
    late.join();
    c.set_caller_waits(false);
    if (!sa.is_ok() || !sb.is_ok() || !err[1].empty()) {
      for (auto& x : *comms) x->abort("test failed");  // not a 300 s destroy of a stuck op
      FAIL() << "round " << round << ": " << sa.to_string() << " / " << sb.to_string() << "; rank 1: " << err[1];
    }
    EXPECT_EQ(a[7], 2.0f);
    EXPECT_EQ(b[3], 4.0f);
  }
}

// An op run at issue that fails returns a failed Work with the error, and
// marks the communicator failed as it would through the queue. Rank 1 never
// joins and the op fails at its deadline. (It used to be failed by aborting
// rank 1 first; rank 0's idle watchdog could see that abort before the op was
// issued and fail the communicator itself, so the call, not the op, reported
// it: 1 run in 12 under TSan.)
TEST(CallerRuns, FailureAtIssueIsReported) {
  Config cfg;
  cfg.timeout_s = 0.5;
  auto comms = Comm::init_all(2, cfg);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  Comm& c = *(*comms)[0];
  c.set_caller_waits(true);
  std::vector<float> v(4, 1.0f);
  auto w = c.allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, RedOp::kSum);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_TRUE(w->test()) << "an op run at issue is complete when the call returns";
  Status st = w->wait();
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("LOOM_TIMEOUT"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.to_string();
  // This 2-rank 16 B allreduce ran Executor::run_exchange and timed out in
  // the general loop it handed over to, naming the phase among the
  // schedule's (in place: the exchange, then the copy out of scratch, so
  // 1/2; regression: the hand-over said 1/1).
  EXPECT_EQ(c.impl()->executor_for_test().exchange_counts().handed_over, 1u);
  EXPECT_NE(st.message().find("phase 1/2 waiting on 'recv_reduce 4 from rank 1"), std::string::npos)
      << st.to_string();
  auto again = c.allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, RedOp::kSum);
  ASSERT_FALSE(again.is_ok());
  EXPECT_NE(again.status().message().find("failed earlier"), std::string::npos) << again.status().to_string();
}

// While an op runs at issue the communicator is not quiescent (revoke waits
// for it), and once it returned, its Work is finished and ok. Rank 0 blocks
// in an allreduce at issue until rank 1 joins 100 ms later; a third thread
// watches rank 0's quiescent() meanwhile. Regression guard for the op-at-issue
// flag that replaced the counter of unfinished ops on that path.
TEST(CallerRuns, OpAtIssueIsNotQuiescentAndEndsOk) {
  auto comms = Comm::init_all(2);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  Comm& c0 = *(*comms)[0];
  Comm& c1 = *(*comms)[1];
  c0.set_caller_waits(true);
  EXPECT_TRUE(c0.quiescent());
  std::atomic<bool> entered{false}, done{false};
  std::atomic<int> busy_seen{0};
  std::vector<float> v0(4, 1.0f), v1(4, 2.0f);
  Status s0, s1;
  bool test0 = false;
  std::thread t0([&] {
    entered = true;
    auto w = c0.allreduce(v0.data(), v0.data(), v0.size(), DataType::kFloat32, RedOp::kSum);
    if (w.is_ok()) {
      test0 = w->test();
      s0 = w->status();
      if (s0.is_ok()) s0 = w->wait();
    } else {
      s0 = w.status();
    }
    done = true;
  });
  std::thread watch([&] {
    while (!entered) std::this_thread::yield();
    while (!done) {
      if (!c0.quiescent()) ++busy_seen;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  // Rank 1 joins once the watcher has looked 11 times while rank 0's op ran
  // (or after 10 s). Regression (of the test): a fixed 100 ms, in which a
  // watcher started late on a loaded machine could look fewer times.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (busy_seen.load() <= 10 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto w1 = c1.allreduce(v1.data(), v1.data(), v1.size(), DataType::kFloat32, RedOp::kSum);
  s1 = w1.is_ok() ? w1->wait() : w1.status();
  t0.join();
  watch.join();
  EXPECT_TRUE(s0.is_ok()) << s0.to_string();
  EXPECT_TRUE(s1.is_ok()) << s1.to_string();
  EXPECT_TRUE(test0) << "an op run at issue is finished when the call returns";
  EXPECT_EQ(v0[3], 3.0f);
  EXPECT_GT(busy_seen.load(), 10) << "quiescent() said yes while rank 0 ran an op at issue";
  EXPECT_TRUE(c0.quiescent());
  EXPECT_GE(c0.impl()->inline_ops(), 1u);
}

// destroy() with an op queued while another thread holds the gate (a
// thread in Work::wait runs ops under it, here stood in for by the test
// holding it) waits for that thread. The engine must wait too, not spin: it
// found the gate taken, and its wait on gate_cv_ returned at once because
// stopping_ was set, over and over, a core at 100% until the other thread
// let go (a hung op: up to LOOM_TIMEOUT). CPU time of the process over one
// second of that wait: ~0.5-1 s spinning, ~0.03 s after.
TEST(CallerRuns, DestroyBehindAnotherThreadHoldingTheGateDoesNotSpin) {
  Config cfg;
  cfg.timeout_s = 60;
  auto comms = Comm::init_all(2, cfg);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  Comm& c0 = *(*comms)[0];
  detail::GateLock& gate = c0.impl()->gate_lock_for_test();
  gate.lock();
  std::vector<float> b(16, 1.0f);
  auto wb = c0.allreduce(b.data(), b.data(), b.size(), DataType::kFloat32, RedOp::kSum);  // queued
  ASSERT_TRUE(wb.is_ok());
  std::thread destroyer([&] { (void)c0.destroy(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto cpu = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  const double cpu0 = cpu();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double used = cpu() - cpu0;
  c0.abort("test over");  // the queued op then fails at once
  gate.unlock();
  destroyer.join();
  EXPECT_FALSE(wb->wait().is_ok());
  (*comms)[1]->abort("test over");
  EXPECT_LT(used, 0.2) << "CPU seconds used in one second while destroy waited";
}

// An op run at issue is written to the flight recorder once it waits for its
// peers (off the path to its first send), or at its end if it never waits.
// Rank 0 blocks in an allreduce until rank 1 joins 100 ms later: meanwhile
// its state must show the op as current and started, with a start time (the
// doctor's "in op #N for X s"); afterwards both ranks' records are complete
// and in time order. Rank 1 finds rank 0's data there at once and may never
// wait: its record comes from the end of the op.
TEST(CallerRuns, OpAtIssueIsRecordedWhileItWaits) {
  auto comms = Comm::init_all(2);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  Comm& c0 = *(*comms)[0];
  Comm& c1 = *(*comms)[1];
  c0.set_caller_waits(true);
  c1.set_caller_waits(true);
  std::vector<float> v0(4, 1.0f), v1(4, 2.0f);
  // One op first, so that the one watched is not the communicator's first.
  std::thread warm([&] { (void)c1.allreduce(v1.data(), v1.data(), v1.size(), DataType::kFloat32, RedOp::kSum); });
  ASSERT_TRUE(c0.allreduce(v0.data(), v0.data(), v0.size(), DataType::kFloat32, RedOp::kSum).is_ok());
  warm.join();
  std::atomic<bool> done{false};
  Status s0;
  std::thread t0([&] {
    auto w = c0.allreduce(v0.data(), v0.data(), v0.size(), DataType::kFloat32, RedOp::kSum);
    s0 = w.is_ok() ? w->wait() : w.status();
    done = true;
  });
  nlohmann::json seen;
  for (int i = 0; i < 80 && !done; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    nlohmann::json st = c0.impl()->diag_state();
    if (st.contains("current") && st["current"].contains("op")) seen = st;
  }
  auto w1 = c1.allreduce(v1.data(), v1.data(), v1.size(), DataType::kFloat32, RedOp::kSum);
  Status s1 = w1.is_ok() ? w1->wait() : w1.status();
  t0.join();
  ASSERT_TRUE(s0.is_ok()) << s0.to_string();
  ASSERT_TRUE(s1.is_ok()) << s1.to_string();
  EXPECT_EQ(v0[0], 6.0f);  // (1 + 2) + (2 + 1)
  ASSERT_FALSE(seen.is_null()) << "rank 0's state never showed the op it waited in";
  const auto& cur = seen["current"];
  EXPECT_EQ(cur.value("seq", ~0ull), 1u);
  EXPECT_EQ(cur["op"].value("state", ""), "started");
  EXPECT_EQ(cur["op"].value("coll", ""), "allreduce");
  EXPECT_GT(cur.value("started_ns", int64_t{0}), 0) << cur.dump();
  for (Comm* c : {&c0, &c1}) {
    const nlohmann::json ops = c->impl()->diag_state()["ops"];
    ASSERT_EQ(ops.size(), 2u) << ops.dump();
    for (uint64_t k = 0; k < 2; ++k) {
      const auto& o = ops[k];
      EXPECT_EQ(o.value("seq", ~0ull), k);
      EXPECT_EQ(o.value("state", ""), "completed") << o.dump();
      const int64_t enq = o.value("enqueued_ns", int64_t{0}), start = o.value("started_ns", int64_t{0}),
                    end = o.value("ended_ns", int64_t{0});
      EXPECT_GT(enq, 0) << o.dump();
      EXPECT_LE(enq, start) << o.dump();
      EXPECT_LE(start, end) << o.dump();
    }
  }
  // Rank 0 waited ~100 ms in op #1, and its record says so.
  const nlohmann::json o = c0.impl()->diag_state()["ops"][1];
  EXPECT_GT(o.value("ended_ns", int64_t{0}) - o.value("started_ns", int64_t{0}), 50'000'000) << o.dump();
}

// An op run at issue that ends before it waits long (here: one rank, a
// local copy) is recorded whole at its end, with one clock read: enqueued,
// started and ended at one time, completed, with its algorithm. Before,
// its record took two clock reads (with the first-poll entry write, ~10% of
// a 2-rank 8 B allreduce in the host's fast phase, performance.md Run 48),
// so its end came after its start.
TEST(CallerRuns, AnOpThatNeverWaitsIsRecordedWithOneTime) {
  auto comms = Comm::init_all(1);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  Comm& c = *(*comms)[0];
  c.set_caller_waits(true);
  std::vector<float> in(16, 1.0f), out(16, 0.0f);
  for (int i = 0; i < 3; ++i) {
    auto w = c.allreduce(in.data(), out.data(), in.size(), DataType::kFloat32, RedOp::kSum);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    ASSERT_TRUE(w->wait().is_ok());
  }
  EXPECT_EQ(out[15], 1.0f);
  const nlohmann::json ops = c.impl()->diag_state()["ops"];
  ASSERT_EQ(ops.size(), 3u) << ops.dump();
  int64_t last = 0;
  for (const auto& o : ops) {
    EXPECT_EQ(o.value("state", ""), "completed") << o.dump();
    EXPECT_FALSE(o.value("algo", "").empty()) << o.dump();
    const int64_t enq = o.value("enqueued_ns", int64_t{0});
    EXPECT_GT(enq, last) << o.dump();
    EXPECT_EQ(o.value("started_ns", int64_t{0}), enq) << o.dump();
    EXPECT_EQ(o.value("ended_ns", int64_t{0}), enq) << o.dump();
    last = enq;
  }
}

// The watchdog must not take an op run at issue, in the moment before its
// record is written (its start time still 0), for one running since 1970:
// a thread ticks the watchdogs without pause while both ranks run small
// allreduces at issue. A watchdog that did would abort the communicator.
TEST(CallerRuns, WatchdogLeavesUnrecordedOpAlone) {
  auto comms = Comm::init_all(2);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  std::atomic<bool> done{false};
  std::atomic<uint64_t> ticks{0};
  std::thread watchdog([&] {
    while (!done) {
      diag::Hub::get().tick();  // every communicator's watchdog, serialized with the hub's thread
      ++ticks;
    }
  });
  std::vector<std::string> err(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      Comm& c = *(*comms)[r];
      c.set_caller_waits(true);
      std::vector<float> v(2, 1.0f);
      for (int i = 0; i < 20000 && err[r].empty(); ++i) {
        auto w = c.allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, RedOp::kMax);
        Status st = w.is_ok() ? w->wait() : w.status();
        if (!st.is_ok()) err[r] = st.to_string();
      }
    });
  for (auto& t : ts) t.join();
  done = true;
  watchdog.join();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(err[r], "") << "rank " << r;
  EXPECT_GT(ticks.load(), 1000u);
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// The schedule cache remembers its last hit (a loop of one op skips the map
// search) and is cleared past 512 entries: the remembered schedule must be
// forgotten with it. Alternate two sizes (each a hit), overflow the cache
// with 600 distinct ones, then use the two again; every result is checked.
// When init returns, the engine thread has run and sleeps. Created last on
// the caller's core (ranks are pinned), it used to first run whenever the
// kernel preempted the caller: a scheduler trace put that inside the first
// timed loop of all_reduce_perf (performance.md Run 47). Here the caller is
// pinned to one CPU and a one-rank communicator is created: its engine must
// already have a thread id and be asleep.
TEST(CallerRuns, TheEngineSleepsWhenInitReturns) {
  if (!proc_reports_sleep()) GTEST_SKIP() << "/proc/self/task/*/stat does not show a sleeping thread as 'S' here";
  OneCpu pinned;
  ASSERT_TRUE(pinned.ok);
  auto id = get_unique_id();
  auto comm = id.is_ok() ? Comm::init_rank(*id, 1, 0) : Result<std::unique_ptr<Comm>>(id.status());
  long tid = 0;
  char state = '?';
  if (comm.is_ok()) {
    tid = (*comm)->impl()->engine_tid();
    state = thread_state(tid);
  }
  ASSERT_TRUE(pinned.restore());
  ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
  EXPECT_NE(tid, 0) << "the engine thread had not run yet";
  EXPECT_EQ(state, 'S') << "engine thread " << tid;
}

// start_thread_asleep (the engine's and the diagnostics hub's threads):
// with the caller and the new thread on one CPU, the thread has run up to its
// first sleep when the call returns.
TEST(CallerRuns, StartThreadAsleepReturnsOnceTheThreadSleeps) {
  if (!proc_reports_sleep()) GTEST_SKIP() << "/proc/self/task/*/stat does not show a sleeping thread as 'S' here";
  OneCpu pinned;
  ASSERT_TRUE(pinned.ok);
  std::mutex m;
  std::condition_variable cv;
  bool go = false;
  std::atomic<int> ran{0};
  long tid = 0;
  std::thread t = start_thread_asleep(
      [&] {
        ran.store(1);
        std::unique_lock<std::mutex> lk(m);
        cv.wait(lk, [&] { return go; });
      },
      &tid);
  const int ran_before_return = ran.load();
  const char state = thread_state(tid);
  ASSERT_TRUE(pinned.restore());
  {
    std::lock_guard<std::mutex> lk(m);
    go = true;
  }
  cv.notify_all();
  t.join();
  EXPECT_NE(tid, 0);
  EXPECT_EQ(ran_before_return, 1);
  EXPECT_EQ(state, 'S');
}

// A stream-ordered op's gate (the shim's CUDA streams): the waits poll for
// spin_us (LOOM_ENGINE_SPIN_US) and then sleep, and see open/finish and
// abort either way.
TEST(StartGate, PollingThenSleepingWaitsSeeOpenFinishAndAbort) {
  const Deadline far = deadline_after(30.0);
  std::atomic<bool> no_abort{false};
  for (int spin_us : {0, 1000, 200000}) {  // none; shorter than the 20 ms the opener takes; longer
    detail::StartGate g;
    std::thread opener([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      g.open();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      g.finish(Status(StatusCode::kTimeout, "op failed"));
    });
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(g.wait_open(far, no_abort, spin_us)) << spin_us;
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(15)) << "returned before open()";
    Status st = g.wait_finished(spin_us);
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << spin_us << ": " << st.to_string();
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(35)) << "returned before finish()";
    opener.join();
    EXPECT_TRUE(g.wait_open(far, no_abort, spin_us)) << "an open gate stays open";
  }
  detail::StartGate never;
  std::atomic<bool> aborted{true};
  EXPECT_FALSE(never.wait_open(far, aborted, 1000));
  EXPECT_FALSE(never.wait_open(deadline_after(0.05), no_abort, 1000));
}

TEST(ScheduleCache, LastHitForgottenWhenTheCacheIsCleared) {
  auto comms = Comm::init_all(2);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  std::vector<size_t> counts = {7, 1000, 7, 1000};
  for (size_t c = 1; c <= 600; ++c) counts.push_back(2000 + c);
  for (size_t c : {size_t{7}, size_t{1000}, size_t{7}}) counts.push_back(c);
  std::vector<testing::Case> cases;
  for (size_t count : counts) {
    testing::Case cs;
    cs.coll = Collective::kAllReduce;
    cs.count = count;
    cases.push_back(cs);
  }
  const auto err = testing::run_cases_on_threads(*comms, cases);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(err[r], "") << "rank " << r;
}

}  // namespace
}  // namespace loom
