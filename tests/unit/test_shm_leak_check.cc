// testing::loom_shm_segments, the leak check of the multi-process tests:
// counts a Loom segment only once its creator has exited, so a communicator
// still running in another test (ctest -j) is not taken for a leak.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/test_util.h"

namespace loom {
namespace {

// A file shaped like a segment header: magic, then the creator's pid.
std::string fake_segment(const std::string& tag, int32_t creator) {
  const std::string name = "loom-leakcheck-" + std::to_string(getpid()) + "-" + tag;
  int fd = open(("/dev/shm/" + name).c_str(), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
  EXPECT_GE(fd, 0);
  uint64_t magic = 0x1;
  EXPECT_EQ(write(fd, &magic, sizeof magic), static_cast<ssize_t>(sizeof magic));
  EXPECT_EQ(write(fd, &creator, sizeof creator), static_cast<ssize_t>(sizeof creator));
  close(fd);
  return name;
}

bool listed(const std::string& name) {
  auto all = testing::loom_shm_segments();
  return std::find(all.begin(), all.end(), name) != all.end();
}

TEST(ShmLeakCheck, CountsSegmentsOfExitedCreatorsOnly) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // reaped: that pid is gone
  const std::string left = fake_segment("dead", static_cast<int32_t>(child));
  const std::string live = fake_segment("live", static_cast<int32_t>(getpid()));
  EXPECT_TRUE(listed(left)) << "a segment whose creator exited is left behind";
  EXPECT_FALSE(listed(live)) << "a segment whose creator runs is in use";
  unlink(("/dev/shm/" + left).c_str());
  unlink(("/dev/shm/" + live).c_str());
  EXPECT_FALSE(listed(left));
}

}  // namespace
}  // namespace loom
