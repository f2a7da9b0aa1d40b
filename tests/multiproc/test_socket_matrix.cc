// The correctness matrix with ranks as processes over the TCP socket
// transport on loopback (LOOM_TRANSPORT=socket), with default settings and
// with tiny slices and rings that force wrap-around, partial slices and a
// full receive ring on every message.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "common/test_util.h"

namespace loom {
namespace {

struct SocketCase {
  int nranks;
  bool big;       // include the 1M+3 cases
  bool stress;    // tiny slices / rings, three streams
  const char* name;
};

// TCP sockets this process holds (the transport must really be in use).
int count_sockets() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      char target[256] = {};
      std::string path = std::string("/proc/self/fd/") + e->d_name;
      ssize_t len = readlink(path.c_str(), target, sizeof(target) - 1);
      if (len > 0 && std::string(target, static_cast<size_t>(len)).rfind("socket:", 0) == 0) ++n;
    }
    closedir(d);
  }
  return n;
}

class SocketMatrix : public ::testing::TestWithParam<SocketCase> {};

TEST_P(SocketMatrix, AllCases) {
  const SocketCase sc = GetParam();
  const int n = sc.nranks;
  setenv("LOOM_TRANSPORT", "socket", 1);
  if (sc.stress) {
    setenv("LOOM_SOCKET_NSOCKS", "3", 1);
    setenv("LOOM_SOCKET_SLICE_BYTES", "4K", 1);
    setenv("LOOM_SOCKET_BUF_BYTES", "24K", 1);
    setenv("LOOM_SOCKET_NTHREADS", "2", 1);
  }
  auto id = testing::unique_id();
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  auto results = testing::run_processes(n, [&](int r, int fd) {
    auto fail = [&](const std::string& m) {
      (void)!write(fd, m.data(), m.size());
      return 1;
    };
    auto comm = Comm::init_rank(*id, n, r);
    if (!comm.is_ok()) return fail(comm.status().to_string());
    const int nsocks = sc.stress ? 3 : 2;
    // bootstrap (listener + ring) plus data and control streams per peer
    if (n > 1 && count_sockets() < (n - 1) * (nsocks + 1))
      return fail("socket transport not in use: only " + std::to_string(count_sockets()) + " sockets");
    auto cases = testing::correctness_matrix(n, sc.big);
    if (sc.stress) {
      // Messages many times the ring: every slice boundary and wrap is crossed.
      for (Collective coll : {Collective::kAllReduce, Collective::kAllGather, Collective::kAllToAll,
                              Collective::kSendRecv, Collective::kBroadcast}) {
        testing::Case c;
        c.coll = coll;
        c.count = 100003;
        c.root = 1;
        cases.push_back(c);
      }
    }
    for (const auto& c : cases) {
      Status st = testing::run_case(**comm, c);
      if (!st.is_ok()) {
        (*comm)->abort("test failure");
        return fail(c.name() + ": " + st.to_string());
      }
    }
    return (*comm)->destroy().is_ok() ? 0 : fail("destroy failed");
  }, 300);
  for (const char* v : {"LOOM_TRANSPORT", "LOOM_SOCKET_NSOCKS", "LOOM_SOCKET_SLICE_BYTES", "LOOM_SOCKET_BUF_BYTES",
                        "LOOM_SOCKET_NTHREADS"})
    unsetenv(v);
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(WIFEXITED(results[r].status) && WEXITSTATUS(results[r].status) == 0)
        << "rank " << r << ": " << results[r].output;
  EXPECT_TRUE(testing::loom_shm_segments().empty());
}

INSTANTIATE_TEST_SUITE_P(Loopback, SocketMatrix,
                         ::testing::Values(SocketCase{2, true, false, "n2_big"}, SocketCase{3, false, true, "n3_stress"},
                                           SocketCase{4, false, false, "n4"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace loom
