// loom-stress under loomrun: short fixed plans (2, 3 and 4 ranks over shared
// memory, 3 over TCP sockets) pass with every byte checked, and the checker is
// proven able to fail: --self-test-corrupt damages one op's output, input or
// guard bytes on rank 0 and the run must end non-zero naming that op.
// The long soak is scripts/soak.sh.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>

#include "common/test_util.h"

namespace {

struct Outcome {
  int rc = -1;
  std::string out;  // stdout and stderr
};

// Runs loom-stress under loomrun with `env` prepended (VAR=value ...).
Outcome stress(int nranks, const std::string& args, const std::string& env = "") {
  const std::string cmd = "timeout 120 env " + env + " " + loom::testing::build_bin("loomrun") + " -n " +
                          std::to_string(nranks) + " -- " + loom::testing::build_bin("loom-stress") + " " + args +
                          " 2>&1";
  Outcome r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  return r;
}

void expect_pass(const Outcome& o, int nranks, const std::string& seed) {
  EXPECT_EQ(o.rc, 0) << o.out;
  const std::regex pass("PASS seed " + seed + ", " + std::to_string(nranks) + " ranks: [0-9]+ ops .*wrong 0");
  EXPECT_TRUE(std::regex_search(o.out, pass)) << o.out;
  EXPECT_EQ(o.out.find("FAIL"), std::string::npos) << o.out;
}

// Plans of a fixed length: every kind of op, async batches, splits, buffers
// up to 1 MiB (across the 256 KiB single-copy and FIFO-step sizes); each run
// takes 2-4 s on two cores.
TEST(Stress, ShmTwoRanks) { expect_pass(stress(2, "--seed 11 --ops 1200 --max-bytes 1M"), 2, "11"); }
TEST(Stress, ShmThreeRanks) { expect_pass(stress(3, "--seed 12 --ops 900 --max-bytes 1M"), 3, "12"); }
TEST(Stress, ShmFourRanks) { expect_pass(stress(4, "--seed 13 --ops 700 --max-bytes 1M"), 4, "13"); }
TEST(Stress, Socket) {
  expect_pass(stress(3, "--seed 14 --ops 600 --max-bytes 1M", "LOOM_TRANSPORT=socket"), 3, "14");
}
// --seconds: rank 0's clock decides and everyone agrees (no rank diverges).
TEST(Stress, SecondsBudget) {
  const Outcome o = stress(2, "--seed 15 --seconds 1.5 --max-bytes 64K --no-split");
  expect_pass(o, 2, "15");
}

// The checker fails where it must: one damaged byte, named by op.
void expect_caught(const std::string& kind, int from) {
  const Outcome o = stress(2, "--seed 21 --ops 40 --max-bytes 64K --no-split --self-test-corrupt " +
                                  std::to_string(from) + ":" + kind);
  EXPECT_EQ(o.rc, 1) << o.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(o.out, m, std::regex("self-test: corrupted the " + kind + " of op #([0-9]+)")))
      << o.out;
  const int op = std::stoi(m[1]);
  EXPECT_GE(op, from);
  EXPECT_NE(o.out.find("FAIL seed 21 rank 0/2"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("op #" + std::to_string(op) + " ["), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("--seed 21 --from " + std::to_string(op) + " --ops 1"), std::string::npos) << o.out;
}
TEST(Stress, CatchesWrongOutput) { expect_caught("output", 7); }
TEST(Stress, CatchesChangedInput) { expect_caught("input", 5); }
TEST(Stress, CatchesOverrun) { expect_caught("guard", 9); }

TEST(Stress, RejectsBadFlags) {
  EXPECT_EQ(stress(1, "--colls allreduce,bogus").rc, 3);
  EXPECT_EQ(stress(1, "--max-bytes lots").rc, 3);
}

// Nothing left in /dev/shm by the runs above (the failing ones included).
TEST(Stress, NoSegmentsLeft) { EXPECT_TRUE(loom::testing::loom_shm_segments().empty()); }

}  // namespace
