// Multi-host runs on one machine: ranks in network namespaces joined by a
// bridge, 1-2 ranks per "host" (shared memory inside a host, TCP between
// hosts), running the correctness matrix; plus configuration errors that only
// exist across hosts (LOOM_TRANSPORT=shm, an unreachable root).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>

#include "bootstrap/bootstrap.h"
#include "netns_ranks.h"

namespace loom {
namespace {

using testing::NetnsLab;

#define SKIP_WITHOUT_LAB()                                               \
  do {                                                                   \
    std::string why = NetnsLab::unavailable();                           \
    if (!why.empty()) GTEST_SKIP() << why;                               \
  } while (0)

struct Layout {
  std::vector<int> hosts;  // host of each rank
  bool big;
  const char* name;
};

class NetnsMatrix : public ::testing::TestWithParam<Layout> {};

TEST_P(NetnsMatrix, AcrossHosts) {
  SKIP_WITHOUT_LAB();
  const Layout lay = GetParam();
  int nhosts = 0;
  for (int h : lay.hosts) nhosts = std::max(nhosts, h + 1);
  std::string prefix;
  {
    NetnsLab lab(nhosts);
    prefix = lab.prefix();
    ASSERT_TRUE(lab.ok()) << "could not build the namespace lab";
    const int n = static_cast<int>(lay.hosts.size());
    auto res = testing::run_on_hosts(lab, lay.hosts, Config{}, [&](Comm& comm, int r, int fd) {
      // Every rank has a peer on another host: its socket streams must exist.
      int remote = 0;
      for (int h : lay.hosts) remote += h != lay.hosts[r];
      if (testing::count_own_sockets() < remote * 3)
        return testing::write_result(fd, "too few sockets for " + std::to_string(remote) + " remote peers", 5);
      for (const auto& c : testing::correctness_matrix(n, lay.big)) {
        Status st = testing::run_case(comm, c);
        if (!st.is_ok()) {
          comm.abort("test failure");
          return testing::write_result(fd, c.name() + ": " + st.to_string(), 1);
        }
      }
      return comm.destroy().is_ok() ? 0 : 2;
    }, 300);
    for (int r = 0; r < n; ++r)
      EXPECT_TRUE(WIFEXITED(res[r].status) && WEXITSTATUS(res[r].status) == 0)
          << "rank " << r << " on " << lab.host(lay.hosts[r]) << ": " << res[r].output;
  }
  EXPECT_TRUE(testing::loom_shm_segments().empty());
  EXPECT_TRUE(NetnsLab::existing(prefix).empty()) << "namespaces left behind";
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, NetnsMatrix,
    ::testing::Values(Layout{{0, 1}, true, "h2_1x1_big"}, Layout{{0, 0, 1, 1}, false, "h2_2x2"},
                      Layout{{0, 1, 1, 2}, false, "h3_1_2_1"}, Layout{{0, 1, 2, 3}, false, "h4_1each"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(NetnsConfig, ForcedShmAcrossHostsIsAClearError) {
  SKIP_WITHOUT_LAB();
  NetnsLab lab(2);
  ASSERT_TRUE(lab.ok());
  setenv("LOOM_TRANSPORT", "shm", 1);
  Config cfg;
  cfg.timeout_s = 20;
  auto res = testing::run_on_hosts(lab, {0, 1}, cfg, [](Comm&, int, int) { return 0; }, 60);
  unsetenv("LOOM_TRANSPORT");
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(WIFEXITED(res[r].status) && WEXITSTATUS(res[r].status) == 91) << res[r].output;
    EXPECT_NE(res[r].output.find("LOOM_TRANSPORT=shm"), std::string::npos) << res[r].output;
    EXPECT_NE(res[r].output.find("rank " + std::to_string(1 - r) + " on host"), std::string::npos) << res[r].output;
  }
}

TEST(NetnsConfig, UnreachableRootIsAClearTimeout) {
  SKIP_WITHOUT_LAB();
  NetnsLab lab(1);
  ASSERT_TRUE(lab.ok());
  // 203.0.113.0/24 has no route inside the lab: connect fails at once, locally.
  auto res = testing::run_processes(1, [&](int, int fd) {
    if (!lab.enter(0)) return 90;
    UidContents uid{random_secret(), {}};
    auto root = parse_sockaddr("203.0.113.7:29999");
    if (!root.is_ok()) return 92;
    uid.root = *root;
    Config cfg;
    cfg.timeout_s = 2;
    auto t0 = std::chrono::steady_clock::now();
    auto comm = Comm::init_rank(encode_uid(uid), 2, 1, cfg);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (comm.is_ok()) return 93;
    std::string m = comm.status().to_string() + " after " + std::to_string(secs) + " s";
    return testing::write_result(fd, m, secs < 8 ? 0 : 94);
  }, 60);
  ASSERT_TRUE(WIFEXITED(res[0].status)) << res[0].output;
  EXPECT_EQ(WEXITSTATUS(res[0].status), 0) << res[0].output;
  EXPECT_NE(res[0].output.find("203.0.113.7:29999"), std::string::npos) << res[0].output;
  EXPECT_NE(res[0].output.find("Network is unreachable"), std::string::npos) << res[0].output;
}

// A split's (and a shrink's) new rendezvous root listens where the rank's
// bootstrap listens (the interface its peers already reached), not on
// get_unique_id's default: with LOOM_SOCKET_IFNAME unset that was loopback,
// and ranks on other hosts timed out connecting to their own 127.0.0.1.
Status allreduce_ranks_sum(Comm& c, int parent_rank, int64_t expect) {
  std::vector<int64_t> v(1000, parent_rank), out(1000, -1);
  auto w = c.allreduce(v.data(), out.data(), v.size(), DataType::kInt64, RedOp::kSum);
  if (!w.is_ok()) return w.status();
  LOOM_RETURN_IF_ERROR(w->wait());
  for (int64_t x : out)
    if (x != expect) return internal_error("allreduce gave " + std::to_string(x) + ", want " + std::to_string(expect));
  return Status::ok();
}

TEST(NetnsSubComms, SplitAndShrinkAcrossHostsWithoutSocketIfname) {
  SKIP_WITHOUT_LAB();
  NetnsLab lab(2);
  ASSERT_TRUE(lab.ok());
  unsetenv("LOOM_SOCKET_IFNAME");
  Config cfg;
  cfg.timeout_s = 10;
  auto res = testing::run_on_hosts(lab, {0, 0, 1, 1}, cfg, [](Comm& comm, int r, int fd) {
    // Groups {0,2} and {1,3}: each spans both hosts; leaders 0 and 1 on host 0.
    auto sub = comm.split(r % 2, r);
    if (!sub.is_ok() || !*sub) return testing::write_result(fd, "split: " + sub.status().to_string(), 3);
    Status st = allreduce_ranks_sum(**sub, r, r % 2 == 0 ? 0 + 2 : 1 + 3);
    if (!st.is_ok()) return testing::write_result(fd, "split allreduce: " + st.to_string(), 4);
    if (!(*sub)->destroy().is_ok()) return testing::write_result(fd, "split destroy failed", 5);
    if (r == 0) {  // excluded from the shrink: rank 1 (host 0) coordinates it
      comm.abort("excluded by the test");
      return 0;
    }
    auto shrunk = comm.shrink({0}, true, Config{});
    if (!shrunk.is_ok()) return testing::write_result(fd, "shrink: " + shrunk.status().to_string(), 6);
    st = allreduce_ranks_sum(**shrunk, r, 1 + 2 + 3);
    if (!st.is_ok()) return testing::write_result(fd, "shrink allreduce: " + st.to_string(), 7);
    return (*shrunk)->destroy().is_ok() ? 0 : 8;
  }, 120);
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(WIFEXITED(res[r].status) && WEXITSTATUS(res[r].status) == 0) << "rank " << r << ": " << res[r].output;
}

// ncclGetUniqueId's way: rank 0 makes the id, the launcher carries it to the
// other hosts. With LOOM_SOCKET_IFNAME unset the root listened on loopback,
// unreachable from the other host; now it listens on the host's interface.
TEST(NetnsSubComms, UniqueIdFromOneHostIsUsableFromAnother) {
  SKIP_WITHOUT_LAB();
  NetnsLab lab(2);
  ASSERT_TRUE(lab.ok());
  unsetenv("LOOM_SOCKET_IFNAME");
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  auto res = testing::run_processes(2, [&](int r, int fd) {
    if (!lab.enter(r)) return testing::write_result(fd, "cannot join namespace", 90);
    setenv("LOOM_HOST_ID", lab.host(r).c_str(), 1);
    UniqueId id;
    if (r == 0) {
      auto made = get_unique_id();
      if (!made.is_ok()) return testing::write_result(fd, made.status().to_string(), 91);
      id = *made;
      if (write(pipefd[1], id.bytes, sizeof(id.bytes)) != static_cast<ssize_t>(sizeof(id.bytes))) return 92;
    } else if (read(pipefd[0], id.bytes, sizeof(id.bytes)) != static_cast<ssize_t>(sizeof(id.bytes))) {
      return 93;
    }
    auto uid = decode_uid(id);
    if (!uid.is_ok() || uid->root.is_loopback())
      return testing::write_result(fd, "the id names a loopback root", 94);
    Config cfg;
    cfg.timeout_s = 10;
    auto comm = Comm::init_rank(id, 2, r, cfg);
    if (!comm.is_ok()) return testing::write_result(fd, comm.status().to_string(), 95);
    Status st = allreduce_ranks_sum(**comm, r, 1);
    if (!st.is_ok()) return testing::write_result(fd, st.to_string(), 96);
    return (*comm)->destroy().is_ok() ? 0 : 97;
  }, 60);
  close(pipefd[0]);
  close(pipefd[1]);
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(WIFEXITED(res[r].status) && WEXITSTATUS(res[r].status) == 0) << "rank " << r << ": " << res[r].output;
}

}  // namespace
}  // namespace loom
