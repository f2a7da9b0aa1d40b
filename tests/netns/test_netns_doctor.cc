// Issue 7, case 6: the network link between two hosts is cut in the middle of
// an allreduce loop. Two "hosts" (network namespaces) with two ranks each;
// every process stays alive, each rank times out (LOOM_TIMEOUT=3) and dumps
// on its own (the coordinated dump cannot cross the cut link), and
// `loom-doctor analyze` must say LINK_DOWN, naming both hosts and the ranks on
// each side, within LOOM_TIMEOUT + 5 s of the cut.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/test_util.h"
#include "netns_ranks.h"

namespace loom {
namespace {

std::string bin(const std::string& name) { return loom::testing::build_bin(name); }
std::string run(const std::string& cmd) { return loom::testing::run_command(cmd); }

using testing::NetnsLab;
using Clock = std::chrono::steady_clock;
using Secs = std::chrono::duration<double>;

constexpr int kTimeoutS = 3;


// Allreduces until one fails; after a few good ones, leaves a marker file so
// the parent cuts the link while the ranks are busy. Writes the error, exits 2.
int allreduce_until_error(Comm& comm, int r, int fd, const std::string& dir) {
  std::vector<float> buf(1 << 18, 1.0f);
  for (int it = 0;; ++it) {
    if (it == 20) std::ofstream(dir + "/busy-" + std::to_string(r));
    auto w = comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, RedOp::kSum);
    Status st = w.is_ok() ? w->wait() : w.status();
    if (!st.is_ok()) return testing::write_result(fd, st.to_string(), 2);
    std::fill(buf.begin(), buf.end(), 1.0f);
  }
}

TEST(NetnsDoctor, LinkCutBetweenHostsIsLinkDown) {
  std::string why = NetnsLab::unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  const std::string dir = "/tmp/loom-netns-doctor-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string prefix, verdict;
  {
    NetnsLab lab(2);
    ASSERT_TRUE(lab.ok());
    prefix = lab.prefix();
    // Children inherit these (Config.timeout_s = 0 takes LOOM_TIMEOUT).
    setenv("LOOM_TIMEOUT", std::to_string(kTimeoutS).c_str(), 1);
    setenv("LOOM_DUMP_DIR", dir.c_str(), 1);
    std::atomic<bool> cut{false};
    Clock::time_point t_cut{};
    std::thread cutter;
    auto cut_when_busy = [&] {
      // Once every rank has done 20 allreduces (or after 30 s: then the test fails).
      for (int i = 0; i < 300; ++i) {
        bool all = true;
        for (int r = 0; r < 4; ++r) all = all && std::filesystem::exists(dir + "/busy-" + std::to_string(r));
        if (all) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      t_cut = Clock::now();
      cut = lab.set_link(1, false);  // host 1 off the bridge: h0 <-> h1 is cut
    };
    // The cutter thread starts once the ranks are forked (run_processes).
    auto res = testing::run_on_hosts(
        lab, {0, 0, 1, 1}, Config{}, [&](Comm& c, int r, int fd) { return allreduce_until_error(c, r, fd, dir); }, 90,
        [&] { cutter = std::thread(cut_when_busy); });
    if (cutter.joinable()) cutter.join();
    unsetenv("LOOM_TIMEOUT");
    unsetenv("LOOM_DUMP_DIR");
    ASSERT_TRUE(cut.load()) << "could not take the link down";
    for (int r = 0; r < 4; ++r)
      EXPECT_TRUE(WIFEXITED(res[r].status) && WEXITSTATUS(res[r].status) == 2) << "rank " << r << ": " << res[r].output;
    verdict = run(bin("loom-doctor") + " analyze " + dir + " 2>&1");
    const double secs = Secs(Clock::now() - t_cut).count();
    std::printf("verdict %.1f s after the cut:\n%s", secs, verdict.c_str());
    const std::string first = verdict.substr(0, verdict.find('\n'));
    EXPECT_EQ(first.rfind("LINK_DOWN:", 0), 0u) << verdict;
    EXPECT_NE(first.find("host " + lab.host(0) + " (ranks 0 and 1)"), std::string::npos) << verdict;
    EXPECT_NE(first.find("host " + lab.host(1) + " (ranks 2 and 3)"), std::string::npos) << verdict;
    EXPECT_LT(secs, kTimeoutS + 5.0) << verdict;
  }
  // Both hosts wrote their dumps independently: one file per rank.
  int dumps = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) dumps += e.path().extension() == ".json";
  EXPECT_EQ(dumps, 4) << verdict;
  if (HasFailure()) std::printf("dumps kept in %s\n", dir.c_str());
  else std::filesystem::remove_all(dir);
  EXPECT_TRUE(testing::loom_shm_segments().empty());
  EXPECT_TRUE(NetnsLab::existing(prefix).empty());
}

}  // namespace
}  // namespace loom
