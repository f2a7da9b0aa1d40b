// Faults between "hosts" (network namespaces): a link cut in the middle of
// allreduces, a rank killed on a remote host, and delay + loss with tc netem
// (when the kernel has it). Every surviving rank ends with a clear error
// within the deadline (or, under netem, with correct results); nothing hangs,
// no shm segment and no namespace is left behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "netns_ranks.h"

namespace loom {
namespace {

using testing::NetnsLab;
using Secs = std::chrono::duration<double>;

#define SKIP_WITHOUT_LAB()                     \
  do {                                         \
    std::string why = NetnsLab::unavailable(); \
    if (!why.empty()) GTEST_SKIP() << why;     \
  } while (0)

// Loops allreduces until one fails; writes the error and exits 2. After the
// first allreduce succeeds, creates `busy_marker` + rank (when given).
int allreduce_until_error(Comm& comm, int r, int fd, int victim = -1, const std::string& busy_marker = "") {
  std::vector<float> buf(1 << 20, 1.0f);
  for (int it = 0;; ++it) {
    if (r == victim && it == 5) raise(SIGKILL);
    auto w = comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, RedOp::kSum);
    Status st = w.is_ok() ? w->wait() : w.status();
    if (!st.is_ok()) return testing::write_result(fd, st.to_string(), 2);
    if (it == 0 && !busy_marker.empty()) std::ofstream(busy_marker + std::to_string(r)) << "busy\n";
    std::fill(buf.begin(), buf.end(), 1.0f);
  }
}

TEST(NetnsFaults, LinkDownMidAllreduce) {
  SKIP_WITHOUT_LAB();
  std::string prefix;
  {
    NetnsLab lab(3);
    ASSERT_TRUE(lab.ok());
    prefix = lab.prefix();
    Config cfg;
    cfg.timeout_s = 5;
    std::atomic<bool> cut{false};
    // Cut host 1 off the bridge once the ranks are busy: every rank has
    // finished an allreduce (a marker file each), then 0.5 s more, so the cut
    // lands in the allreduces however long start-up takes (a fixed 1.5 s
    // after the start assumed a quick one). The cutter thread starts only
    // once the ranks are forked: started before, it could hold one of ASan's
    // allocator locks at a fork, and the rank's rendezvous root thread then
    // blocked on it forever (ranks 0 and 1 timed out at the rendezvous, the
    // root logged nothing; seen in runs 15, 16, 18 under ASan).
    const std::string marker = "/tmp/" + prefix + "busy-";
    std::thread cutter;
    auto cut_when_busy = [&] {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      auto all_busy = [&] {
        for (int r = 0; r < 3; ++r)
          if (!std::filesystem::exists(marker + std::to_string(r))) return false;
        return true;
      };
      while (!all_busy() && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      cut = lab.set_link(1, false);
    };
    const auto t0 = std::chrono::steady_clock::now();
    auto res = testing::run_on_hosts(
        lab, {0, 1, 2}, cfg, [&](Comm& c, int r, int fd) { return allreduce_until_error(c, r, fd, -1, marker); }, 90,
        [&] { cutter = std::thread(cut_when_busy); });
    if (cutter.joinable()) cutter.join();
    for (int r = 0; r < 3; ++r) std::filesystem::remove(marker + std::to_string(r));
    const double secs = Secs(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(cut.load()) << "could not take the link down";
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(WIFEXITED(res[r].status) && WEXITSTATUS(res[r].status) == 2) << "rank " << r << ": " << res[r].output;
      EXPECT_NE(res[r].output.find("allreduce"), std::string::npos) << res[r].output;
      EXPECT_NE(res[r].output.find("rank "), std::string::npos) << res[r].output;
    }
    // Start-up and 0.5 s of work, then at most one deadline (5 s) plus
    // detection slack.
    EXPECT_LT(secs, 25.0);
  }
  EXPECT_TRUE(testing::loom_shm_segments().empty());
  EXPECT_TRUE(NetnsLab::existing(prefix).empty());
}

TEST(NetnsFaults, RankKilledOnRemoteHost) {
  SKIP_WITHOUT_LAB();
  std::string prefix;
  {
    NetnsLab lab(2);
    ASSERT_TRUE(lab.ok());
    prefix = lab.prefix();
    Config cfg;
    cfg.timeout_s = 60;  // detection must be far quicker than the deadline
    const int victim = 3;  // second rank of host 1
    const auto t0 = std::chrono::steady_clock::now();
    auto res = testing::run_on_hosts(lab, {0, 0, 1, 1}, cfg,
                                     [&](Comm& c, int r, int fd) { return allreduce_until_error(c, r, fd, victim); }, 120);
    const double secs = Secs(std::chrono::steady_clock::now() - t0).count();
    for (int r = 0; r < 4; ++r) {
      if (r == victim) {
        EXPECT_TRUE(WIFSIGNALED(res[r].status)) << res[r].output;
        continue;
      }
      EXPECT_TRUE(WIFEXITED(res[r].status) && WEXITSTATUS(res[r].status) == 2) << "rank " << r << ": " << res[r].output;
      // Named directly, or through a peer that failed because of it.
      EXPECT_NE(res[r].output.find("rank " + std::to_string(victim)), std::string::npos) << res[r].output;
    }
    EXPECT_LT(secs, 30.0);
  }
  EXPECT_TRUE(testing::loom_shm_segments().empty());
  EXPECT_TRUE(NetnsLab::existing(prefix).empty());
}

TEST(NetnsFaults, NetemDelayAndLossStayCorrect) {
  SKIP_WITHOUT_LAB();
  NetnsLab lab(2);
  ASSERT_TRUE(lab.ok());
  if (!lab.run_in(0, "tc qdisc add dev eth0 root netem delay 2ms loss 1%") ||
      !lab.run_in(1, "tc qdisc add dev eth0 root netem delay 2ms loss 1%"))
    GTEST_SKIP() << "tc netem is not available in this kernel (modprobe sch_netem)";
  Config cfg;
  cfg.timeout_s = 60;
  auto res = testing::run_on_hosts(lab, {0, 1}, cfg, [](Comm& comm, int, int fd) {
    for (Collective coll : {Collective::kAllReduce, Collective::kAllGather, Collective::kSendRecv}) {
      testing::Case c;
      c.coll = coll;
      c.count = (1 << 20) + 3;
      Status st = testing::run_case(comm, c);
      if (!st.is_ok()) return testing::write_result(fd, c.name() + ": " + st.to_string(), 1);
    }
    return comm.destroy().is_ok() ? 0 : 2;
  }, 120);
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(WIFEXITED(res[r].status) && WEXITSTATUS(res[r].status) == 0) << res[r].output;
}

}  // namespace
}  // namespace loom
