// LOOM_TUNE_CALIBRATE=1: each communicator measures its links and reduction
// at init (core/calibrate.h); every rank must end up with the same cost
// parameters (else their tuners could pick different algorithms and deadlock),
// the values must be physically sane, and collectives must still be correct.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "algorithms/algorithms.h"
#include "common/test_util.h"
#include "core/calibrate.h"
#include "core/comm_impl.h"
#include "core/config.h"
#include "core/schedule_args.h"

namespace loom {
namespace {

struct EnvGuard {
  explicit EnvGuard(const char* value) {
    if (value) setenv("LOOM_TUNE_CALIBRATE", value, 1);
    else unsetenv("LOOM_TUNE_CALIBRATE");
  }
  ~EnvGuard() { unsetenv("LOOM_TUNE_CALIBRATE"); }
};

std::vector<std::unique_ptr<Comm>> make_comms(int n, const char* calibrate) {
  EnvGuard env(calibrate);
  auto c = Comm::init_all(n);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return c.is_ok() ? std::move(c).value() : std::vector<std::unique_ptr<Comm>>{};
}

double ring_bw_GBps(const topo::CommCost& c) { return 1.0 / (c.ring.beta_us_per_byte * 1e3); }

const size_t kSizes[] = {8, 4096, size_t{1} << 20, size_t{64} << 20};
const Collective kColls[] = {Collective::kAllReduce, Collective::kAllGather, Collective::kBroadcast};

// Every case on every rank (a thread each); each rank's result must be ok.
void run_cases(std::vector<std::unique_ptr<Comm>>& comms, const std::vector<testing::Case>& cases) {
  const int n = static_cast<int>(comms.size());
  for (const testing::Case& cs : cases) {
    std::vector<Status> st(static_cast<size_t>(n));
    std::vector<std::thread> th;
    for (int r = 0; r < n; ++r) th.emplace_back([&, r] { st[r] = testing::run_case(*comms[r], cs); });
    for (auto& t : th) t.join();
    for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].is_ok()) << cs.name() << " rank " << r << ": " << st[r].to_string();
  }
}

void check_calibrated(int n) {
  auto base = make_comms(n, nullptr);
  auto cal = make_comms(n, "1");
  ASSERT_EQ(base.size(), static_cast<size_t>(n));
  ASSERT_EQ(cal.size(), static_cast<size_t>(n));

  topo::CommCost c0 = cal[0]->impl()->tuner()->cost(n);
  topo::CommCost b0 = base[0]->impl()->tuner()->cost(n);
  // Measured values: a message costs something, and shared memory on one
  // host moves between 10 MB/s and 1 TB/s.
  EXPECT_GT(c0.ring.alpha_us, 0.0);
  EXPECT_LT(c0.ring.alpha_us, 1e5);
  EXPECT_GT(ring_bw_GBps(c0), 0.01);
  EXPECT_LT(ring_bw_GBps(c0), 1000.0);
  EXPECT_GT(c0.gamma_us_per_byte, 0.0);
  // Replaced, not kept: measured doubles never equal the topology's constants.
  EXPECT_NE(c0.ring.alpha_us, b0.ring.alpha_us);
  EXPECT_NE(c0.ring.beta_us_per_byte, b0.ring.beta_us_per_byte);
  EXPECT_NE(c0.gamma_us_per_byte, b0.gamma_us_per_byte);

  bool any_prediction_differs = false;
  for (int r = 0; r < n; ++r) {
    topo::CommCost c = cal[r]->impl()->tuner()->cost(n);
    // Bit-identical on every rank: all ranks combine the same allgathered data.
    EXPECT_EQ(c.ring.alpha_us, c0.ring.alpha_us) << "rank " << r;
    EXPECT_EQ(c.ring.beta_us_per_byte, c0.ring.beta_us_per_byte) << "rank " << r;
    EXPECT_EQ(c.gamma_us_per_byte, c0.gamma_us_per_byte) << "rank " << r;
    for (Collective coll : kColls) {
      for (size_t bytes : kSizes) {
        auto p = cal[r]->predict_us(coll, bytes);
        auto p0 = cal[0]->predict_us(coll, bytes);
        auto pb = base[r]->predict_us(coll, bytes);
        ASSERT_TRUE(p.is_ok() && p0.is_ok() && pb.is_ok());
        EXPECT_EQ(*p, *p0) << collective_name(coll) << " " << bytes << " B, rank " << r;
        EXPECT_GT(*p, 0.0);
        if (*p != *pb) any_prediction_differs = true;
      }
    }
  }
  EXPECT_TRUE(any_prediction_differs) << "calibration did not change any prediction";

  // Collectives still run and are correct after the calibration traffic
  // (whose messages must all have been consumed).
  std::vector<testing::Case> cases = {
      {Collective::kAllReduce, DataType::kFloat32, RedOp::kSum, 1000, false, 0},
      {Collective::kAllReduce, DataType::kInt32, RedOp::kMax, (size_t{1} << 18) + 3, true, 0},
      {Collective::kAllGather, DataType::kFloat64, RedOp::kSum, 777, false, 0},
      {Collective::kBroadcast, DataType::kUint8, RedOp::kSum, 100000, false, n - 1},
  };
  run_cases(cal, cases);
}

TEST(TuneCalibrate, TwoRanks) { check_calibrated(2); }
TEST(TuneCalibrate, ThreeRanks) { check_calibrated(3); }  // odd: the closing pair gets its own round
TEST(TuneCalibrate, FourRanks) { check_calibrated(4); }

TEST(TuneCalibrate, OneRankKeepsTopology) {
  auto base = make_comms(1, nullptr);
  auto cal = make_comms(1, "1");
  ASSERT_EQ(cal.size(), 1u);
  topo::CommCost c = cal[0]->impl()->tuner()->cost(1);
  topo::CommCost b = base[0]->impl()->tuner()->cost(1);
  // No link to measure: calibrate() is not called, so the reduction cost stays the topology's too.
  EXPECT_EQ(c.gamma_us_per_byte, b.gamma_us_per_byte);
}

// LOOM_TUNE_HAND_OFF (default on): with more ranks than the host's CPUs each
// communicator times rounds of exchanges across and within cores at init;
// every rank must get the same hand-off costs, measured ones (not the
// defaults), and collectives must still be correct after the probe's
// traffic. LOOM_TUNE_HAND_OFF=0 keeps the defaults.
TEST(TuneHandOff, OversubscribedCommsProbeAndAgree) {
  const int n = params::host_cores() + 2;
  std::vector<std::unique_ptr<Comm>> comms, plain;
  {
    unsetenv("LOOM_TUNE_HAND_OFF");
    auto c = Comm::init_all(n);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    comms = std::move(c).value();
  }
  {
    setenv("LOOM_TUNE_HAND_OFF", "0", 1);
    auto c = Comm::init_all(n);
    unsetenv("LOOM_TUNE_HAND_OFF");
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    plain = std::move(c).value();
  }
  const topo::CommCost defaults;
  topo::CommCost c0 = comms[0]->impl()->tuner()->cost(n);
  ASSERT_TRUE(c0.oversubscribed);
  EXPECT_NE(c0.hand_off_us, defaults.hand_off_us);
  EXPECT_NE(c0.hand_off_cross_us, defaults.hand_off_cross_us);
  EXPECT_GE(c0.hand_off_us, 0.0);
  EXPECT_GE(c0.hand_off_cross_us, 0.0);
  EXPECT_LT(c0.hand_off_us, 1e6);
  for (int r = 0; r < n; ++r) {
    topo::CommCost c = comms[r]->impl()->tuner()->cost(n);
    EXPECT_EQ(c.hand_off_us, c0.hand_off_us) << "rank " << r;
    EXPECT_EQ(c.hand_off_cross_us, c0.hand_off_cross_us) << "rank " << r;
    topo::CommCost d = plain[r]->impl()->tuner()->cost(n);
    EXPECT_EQ(d.hand_off_us, defaults.hand_off_us) << "rank " << r;
    EXPECT_EQ(d.hand_off_cross_us, defaults.hand_off_cross_us) << "rank " << r;
  }
  // LOOM_TUNE_PROBE_ALGOS (default on, with the hand-off probe): the small
  // allreduce's and all_gather's candidates were timed (all_gather's output
  // is nranks blocks: the probe's buffers must hold them, which ASan checks
  // here), at least two each, and every rank prices them alike
  // (bit-identical figures: the ranks must choose the same algorithm).
  for (Collective coll : {Collective::kAllReduce, Collective::kAllGather}) {
    SCOPED_TRACE(collective_name(coll));
    const size_t bytes = 8 * static_cast<size_t>(n);
    auto s0 = comms[0]->impl()->tuner()->select(coll, bytes, n, {});
    ASSERT_TRUE(s0.is_ok());
    EXPECT_EQ(s0->source, "model + probe");
    for (int r = 0; r < n; ++r) {
      auto s = comms[r]->impl()->tuner()->select(coll, bytes, n, {});
      ASSERT_TRUE(s.is_ok());
      EXPECT_EQ(s->algorithm, s0->algorithm) << "rank " << r;
      EXPECT_EQ(s->predicted_us, s0->predicted_us) << "rank " << r;
      EXPECT_EQ(s->runner_up_us, s0->runner_up_us) << "rank " << r;
      EXPECT_EQ(plain[r]->impl()->tuner()->select(coll, bytes, n, {})->source, "model") << "rank " << r;
    }
  }
  // Every candidate the model prices within 4x of its best at the probe's
  // size was probed: an unprobed one would keep the model's fixed cost
  // against its rivals' measured ones (regression: with only the best three
  // probed, 4 ranks' 16 KiB allreduce went to an unprobed Rabenseifner).
  // Alone in the list, a probed algorithm's estimate says "model + probe".
  {
    topo::Tuner* t = comms[0]->impl()->tuner();
    for (Collective coll : {Collective::kAllReduce, Collective::kAllGather}) {
      const size_t bytes = sizeof(float) * static_cast<size_t>(n);  // the probe's: a float per rank
      const std::vector<topo::Estimate> est = t->estimate_all(coll, bytes, n);  // the model alone, fastest first
      ASSERT_FALSE(est.empty());
      CollArgs args;
      args.coll = coll;
      args.nranks = n;
      args.count = coll == Collective::kAllReduce ? static_cast<size_t>(n) : 1;
      set_job_args(args, std::vector<int>(static_cast<size_t>(n), 0));  // one host, as the communicator's
      const std::vector<std::string> runnable = runnable_algorithms(args);
      // The probe's list (CommImpl::probe_algorithms): the runnable ones
      // within 4x of the best runnable one, and at least the best two. The
      // count covers the whole list: with the measured hand-off cost only
      // one may lie within 4x (regression: counting those alone failed 1 run
      // in 10-40 on a loaded host, "probed 1 vs 2").
      int probed = 0, rank_in_model = 0;
      double best_us = -1;
      for (const topo::Estimate& e : est) {
        const std::string name = topo::algo_name(e.algo);
        if (std::find(runnable.begin(), runnable.end(), name) == runnable.end()) continue;
        if (best_us < 0) best_us = e.us;
        const bool listed = e.us <= 4 * best_us || rank_in_model < 2;
        ++rank_in_model;
        const bool was = t->select(coll, bytes, n, {name})->source == "model + probe";
        if (listed) {
          EXPECT_TRUE(was) << collective_name(coll) << " " << name << " was not probed";
        }
        probed += was;
      }
      EXPECT_GE(probed, 2) << collective_name(coll);
    }
  }
  EXPECT_EQ(comms[0]->impl()->tuner()->select(Collective::kReduceScatter, 64, n, {})->source, "model");
  std::vector<testing::Case> cases = {
      {Collective::kAllReduce, DataType::kFloat32, RedOp::kSum, 1000, false, 0},
      {Collective::kAllReduce, DataType::kFloat32, RedOp::kSum, 2, true, 0},
      {Collective::kReduceScatter, DataType::kInt32, RedOp::kMax, 4099, false, 0},
      {Collective::kAllGather, DataType::kFloat64, RedOp::kSum, 777, true, 0},
  };
  run_cases(comms, cases);
}

// probe_schedules times each schedule it is given, in turns, and every rank
// gets the same figures (the mean over ranks, summed in rank order): here an
// 8 B and a 64 MiB allreduce on 2 ranks. Only their order is asserted: under
// ctest -j2 a 4 MiB allreduce measured 570 us against 203 for 8 B (a rank
// off its core for whole blocks), where a quiet run reads 300 against 1.
TEST(AlgorithmProbe, TimesEachScheduleAndEveryRankAgrees) {
  auto comms = make_comms(2, nullptr);
  ASSERT_EQ(comms.size(), 2u);
  constexpr size_t kBig = size_t{16} << 20;  // floats: 64 MiB
  std::vector<Result<AlgoProbe>> got(2, Result<AlgoProbe>(internal_error("not run")));
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      std::vector<RankSchedule> scheds;
      for (size_t count : {size_t{2}, kBig}) {
        CollArgs a;
        a.coll = Collective::kAllReduce;
        a.count = count;
        a.nranks = 2;
        a.rank = r;
        auto s = make_schedule(a, "ring");
        if (!s.is_ok()) {
          got[r] = s.status();
          return;
        }
        scheds.push_back(std::move(s).value());
      }
      std::vector<float> send(kBig, 1.0f), recv(kBig);
      auto* impl = comms[r]->impl();
      got[r] = probe_schedules(impl->executor_for_test(), impl->bootstrap(), {&scheds[0], &scheds[1]},
                               {reinterpret_cast<std::byte*>(send.data()), reinterpret_cast<std::byte*>(recv.data())},
                               DataType::kFloat32, RedOp::kSum, deadline_after(60));
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(got[r].is_ok()) << "rank " << r << ": " << got[r].status().to_string();
    ASSERT_EQ(got[r]->us.size(), 2u);
    EXPECT_EQ(got[r]->us, got[0]->us) << "rank " << r;  // bit-identical
  }
  EXPECT_GT(got[0]->us[0], 0.0);
  EXPECT_GT(got[0]->us[1], got[0]->us[0]) << "64 MiB " << got[0]->us[1] << " us, 8 B " << got[0]->us[0] << " us";
}

// A calibration run fails (here: rank 1 never echoes, so rank 0's ping-pong
// hits its deadline). Its buffers are calibrate_comm's own and go when it
// returns, so the executor must have fenced the transport by then, and the
// failure must reach the peers (their idle watchdog then fails them).
// Regression: only CommImpl::execute announced failures; a failed
// calibration returned with a socket window or a single-copy read still on
// its buffers, and the peers never heard of it (helper review, session 31).
void failed_calibration_is_announced(const char* transport) {
  setenv("LOOM_TRANSPORT", transport, 1);
  Config cfg;
  cfg.timeout_s = 60;
  auto comms = Comm::init_all(2, cfg);
  unsetenv("LOOM_TRANSPORT");
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  auto* impl0 = (*comms)[0]->impl();
  auto cal = calibrate_comm(impl0->executor_for_test(), impl0->bootstrap(), 0, 2, deadline_after(1.0));
  ASSERT_FALSE(cal.is_ok()) << "rank 1 never took part";
  Status peer;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((peer = (*comms)[1]->async_error()).is_ok() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(peer.is_ok()) << transport << ": rank 1 never learned of rank 0's failed calibration";
  EXPECT_NE(peer.message().find("rank 0"), std::string::npos) << peer.to_string();
  for (auto& c : *comms) c->abort("test over");
}

TEST(Calibration, AFailedRunTellsThePeersShm) { failed_calibration_is_announced("shm"); }
TEST(Calibration, AFailedRunTellsThePeersSocket) { failed_calibration_is_announced("socket"); }

}  // namespace
}  // namespace loom
