// Ranks of one host in different pid namespaces: containers that share
// /dev/shm and the host name (the containers of a Kubernetes pod), each
// rank often pid 1 of its own namespace. A pid then means nothing to the
// peer: the shm transport must not take two pid-1 ranks for threads of one
// process (it memcpy'd from addresses of the other's address space), must
// not process_vm_readv or kill(pid, 0) a pid of another namespace, and
// must still notice a peer that died (its segment's flock).
//
// Each rank here runs as pid 1 of a new pid namespace (unshare + fork, as
// root). Where that is not permitted the tests skip, saying so.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/test_util.h"

namespace loom {
namespace {

constexpr int kSkip = 77;

int report(int fd, const std::string& m, int rc) {
  (void)!write(fd, m.data(), m.size());
  return rc;
}

// Runs body as pid 1 of a new pid namespace; its exit status, or kSkip.
int as_pid_1(int fd, const std::function<int()>& body) {
  if (unshare(CLONE_NEWPID) != 0)
    return report(fd, std::string("unshare(CLONE_NEWPID): ") + std::strerror(errno), kSkip);
  const pid_t child = fork();
  if (child < 0) return report(fd, "fork failed", 9);
  if (child == 0) {
    if (getpid() != 1) _exit(report(fd, "not pid 1 in the new namespace", 9));
    _exit(body());
  }
  int st = 0;
  while (waitpid(child, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

bool skipped(const std::vector<testing::ChildResult>& res, std::string* why) {
  for (const auto& r : res)
    if (WIFEXITED(r.status) && WEXITSTATUS(r.status) == kSkip) {
      *why = r.output;
      return true;
    }
  return false;
}

// Two ranks, each pid 1 of its own namespace, each running body(rank, fd,
// its communicator) after init; the children's results.
std::vector<testing::ChildResult> two_pid_1_ranks(const std::function<int(int, int, Comm&)>& body) {
  auto id = testing::unique_id();
  EXPECT_TRUE(id.is_ok()) << id.status().to_string();
  if (!id.is_ok()) return {};
  return testing::run_processes(2, [&](int r, int fd) {
    return as_pid_1(fd, [&]() -> int {
      Config cfg;
      cfg.timeout_s = 60;
      auto comm = Comm::init_rank(*id, 2, r, cfg);
      if (!comm.is_ok()) return report(fd, comm.status().to_string(), 3);
      return body(r, fd, **comm);
    });
  }, 120);
}

uint8_t pattern(size_t i, int salt) { return static_cast<uint8_t>((i * 131u) ^ (i >> 13) ^ static_cast<size_t>(salt)); }

// Two pid-1 ranks move data through every shm path: small messages, the
// FIFO, and sizes past every single-copy threshold (which must now stay in
// the FIFO: process_vm_readv cannot name a process of another namespace).
// Old code: the ranks took each other for threads of one process and read
// the peer's buffers at their addresses in their own address space.
TEST(ShmPidNamespaces, TwoPidOneRanksMoveDataCorrectly) {
  auto res = two_pid_1_ranks([](int r, int fd, Comm& comm) -> int {
    for (size_t count : {size_t{2}, size_t{3000}, size_t{1} << 18, size_t{1} << 22}) {
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>((i % 97) + r);
      auto w = comm.allreduce(v.data(), v.data(), count, DataType::kFloat32, RedOp::kSum);
      Status st = w.is_ok() ? w->wait() : w.status();
      if (!st.is_ok()) return report(fd, "allreduce: " + st.to_string(), 4);
      for (size_t i = 0; i < count; ++i)
        if (v[i] != static_cast<float>(2 * (i % 97) + 1))
          return report(fd, "allreduce of " + std::to_string(count) + ": element " + std::to_string(i) + " is " +
                                std::to_string(v[i]),
                        5);
    }
    const size_t bytes = size_t{32} << 20;  // rank 1 -> rank 0, then back
    std::vector<uint8_t> buf(bytes);
    for (int dir = 0; dir < 2; ++dir) {
      const int sender = dir == 0 ? 1 : 0;
      Result<Work> w = Status::ok();
      if (r == sender) {
        for (size_t i = 0; i < bytes; ++i) buf[i] = pattern(i, dir);
        w = comm.send(buf.data(), bytes, DataType::kUint8, 1 - r);
      } else {
        std::fill(buf.begin(), buf.end(), 0xee);
        w = comm.recv(buf.data(), bytes, DataType::kUint8, 1 - r);
      }
      Status st = w.is_ok() ? w->wait() : w.status();
      if (!st.is_ok()) return report(fd, "send/recv: " + st.to_string(), 6);
      if (r != sender)
        for (size_t i = 0; i < bytes; ++i)
          if (buf[i] != pattern(i, dir)) return report(fd, "received byte " + std::to_string(i) + " wrong", 7);
    }
    Status st = comm.destroy();
    return st.is_ok() ? report(fd, "ok", 0) : report(fd, "destroy: " + st.to_string(), 8);
  });
  ASSERT_EQ(res.size(), 2u);
  std::string why;
  if (skipped(res, &why)) GTEST_SKIP() << "pid namespaces not permitted here: " << why;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(WIFEXITED(res[r].status) && WEXITSTATUS(res[r].status) == 0)
        << "rank " << r << " status " << res[r].status << ": " << res[r].output;
    EXPECT_EQ(res[r].output, "ok") << "rank " << r;
  }
}

// Rank 1 (pid 1 of its namespace) dies without a word while rank 0 waits
// for its message: rank 0 must say that rank 1 died, promptly. Old code:
// kill(1, 0) found rank 0's own namespace's pid 1 (itself) alive, and the
// recv ran into its 60 s deadline.
TEST(ShmPidNamespaces, APeerThatDiedInItsOwnNamespaceIsReportedDead) {
  const auto t0 = std::chrono::steady_clock::now();
  auto res = two_pid_1_ranks([](int r, int fd, Comm& comm) -> int {
    int x = 1;
    auto w = comm.allreduce(&x, &x, 1, DataType::kInt32, RedOp::kSum);  // both are up
    Status st = w.is_ok() ? w->wait() : w.status();
    if (!st.is_ok()) return report(fd, "allreduce: " + st.to_string(), 4);
    if (r == 1) _exit(report(fd, "exiting without destroy", 0));  // a crash, as far as rank 0 can tell
    std::vector<uint8_t> buf(1 << 20);
    w = comm.recv(buf.data(), buf.size(), DataType::kUint8, 1);
    st = w.is_ok() ? w->wait() : w.status();
    if (st.is_ok()) return report(fd, "a recv from the dead rank 1 succeeded", 5);
    return report(fd, st.to_string(), 2);
  });
  ASSERT_EQ(res.size(), 2u);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string why;
  if (skipped(res, &why)) GTEST_SKIP() << "pid namespaces not permitted here: " << why;
  EXPECT_TRUE(WIFEXITED(res[1].status) && WEXITSTATUS(res[1].status) == 0) << res[1].output;
  ASSERT_TRUE(WIFEXITED(res[0].status) && WEXITSTATUS(res[0].status) == 2) << res[0].output;
  EXPECT_NE(res[0].output.find("rank 1"), std::string::npos) << res[0].output;
  EXPECT_NE(res[0].output.find("died"), std::string::npos) << res[0].output;
  EXPECT_NE(res[0].output.find("another pid namespace"), std::string::npos) << res[0].output;
  EXPECT_LT(secs, 30.0) << res[0].output;
}

}  // namespace
}  // namespace loom
