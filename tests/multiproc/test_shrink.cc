// Error recovery across processes: a rank is SIGKILLed in the middle of an
// allreduce; the survivors see the error, shrink with abort_first excluding
// the dead rank, and reduce correctly on the smaller communicator. /dev/shm
// holds no Loom segment afterwards.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "common/test_util.h"

namespace loom {
namespace {

TEST(ShrinkProcs, SurvivorsRecoverFromAKilledRank) {
  const int n = 4, victim = 1;
  auto id = testing::unique_id();
  ASSERT_TRUE(id.is_ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto results = testing::run_processes(n, [&](int r, int fd) {
    auto say = [fd](const std::string& m) { (void)!write(fd, m.data(), m.size()); };
    Config cfg;
    cfg.timeout_s = 60;
    auto comm = Comm::init_rank(*id, n, r, cfg);
    if (!comm.is_ok()) {
      say("init: " + comm.status().to_string());
      return 3;
    }
    std::vector<float> buf(1 << 20, 1.0f);
    Status failure;
    for (int it = 0; failure.is_ok(); ++it) {
      if (r == victim && it == 3) raise(SIGKILL);  // dies while the others are inside allreduce #3
      auto w = (*comm)->allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, RedOp::kSum);
      failure = w.is_ok() ? w->wait() : w.status();
      for (float& x : buf) x = 1.0f;
      if (it > 1000) {
        say("the allreduce never failed");
        return 4;
      }
    }
    say("saw: " + failure.to_string() + "\n");
    auto shrunk = (*comm)->shrink({victim}, /*abort_first=*/true);
    if (!shrunk.is_ok()) {
      say("shrink: " + shrunk.status().to_string());
      return 5;
    }
    Comm& c = **shrunk;
    const int expect_rank = r < victim ? r : r - 1;
    if (c.size() != n - 1 || c.rank() != expect_rank) {
      say("shrunk comm is rank " + std::to_string(c.rank()) + " of " + std::to_string(c.size()));
      return 6;
    }
    // Old rank r contributes (r+1)*100 + i; survivors 0,2,3 -> 800 + 3i.
    std::vector<int32_t> data(4096);
    for (size_t i = 0; i < data.size(); ++i) data[i] = (r + 1) * 100 + static_cast<int32_t>(i);
    auto w = c.allreduce(data.data(), data.data(), data.size(), DataType::kInt32, RedOp::kSum);
    Status st = w.is_ok() ? w->wait() : w.status();
    if (!st.is_ok()) {
      say("allreduce after shrink: " + st.to_string());
      return 7;
    }
    for (size_t i = 0; i < data.size(); ++i)
      if (data[i] != 800 + 3 * static_cast<int32_t>(i)) {
        say("wrong value at " + std::to_string(i) + ": " + std::to_string(data[i]));
        return 8;
      }
    if (!c.destroy().is_ok()) return 9;
    (void)(*comm)->destroy();
    return 0;
  }, 120);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int r = 0; r < n; ++r) {
    if (r == victim) {
      EXPECT_TRUE(WIFSIGNALED(results[r].status) && WTERMSIG(results[r].status) == SIGKILL);
      continue;
    }
    EXPECT_TRUE(WIFEXITED(results[r].status) && WEXITSTATUS(results[r].status) == 0)
        << "rank " << r << " status " << results[r].status << ": " << results[r].output;
    EXPECT_NE(results[r].output.find("saw: "), std::string::npos) << results[r].output;
  }
  EXPECT_LT(secs, 40.0) << "recovery took too long";
  EXPECT_TRUE(testing::loom_shm_segments().empty());
}

}  // namespace
}  // namespace loom
