// The communicator tells its tuner how ranks are spread over hosts (from the
// bootstrap's host hashes). Regression: the tuner was always built for one
// host holding every rank, so on several hosts it priced the links between
// them as shared memory and never saw that all ranks of a host cross at
// once (2 hosts x 2 ranks over TCP: Rabenseifner chosen at 4 MiB, 2.4x
// slower than the ring).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "common/test_util.h"
#include "core/comm_impl.h"

namespace loom {
namespace {

int report(int fd, const std::string& m, int rc) {
  (void)!write(fd, m.data(), m.size());
  return rc;
}

// Four processes; `hosts` fake host identities (ranks placed in blocks).
void expect_hosts(int hosts) {
  auto id = testing::unique_id();
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  auto res = testing::run_processes(4, [&](int r, int fd) {
    const int per = 4 / hosts;
    setenv("LOOM_HOST_ID", ("tuner-hosts-" + std::to_string(r / per)).c_str(), 1);
    auto comm = Comm::init_rank(*id, 4, r, Config{});
    if (!comm.is_ok()) return report(fd, comm.status().to_string(), 3);
    topo::CommCost c = (*comm)->impl()->tuner()->cost(4);
    if (c.nhosts != hosts)
      return report(fd, "tuner sees " + std::to_string(c.nhosts) + " host(s), want " + std::to_string(hosts), 4);
    // And the communicator still works across them.
    int v = r + 1;
    auto w = (*comm)->allreduce(&v, &v, 1, DataType::kInt32, RedOp::kSum);
    Status st = w.is_ok() ? w->wait() : w.status();
    if (!st.is_ok()) return report(fd, st.to_string(), 5);
    if (v != 10) return report(fd, "allreduce gave " + std::to_string(v), 6);
    (void)(*comm)->destroy();
    return report(fd, "ok", 0);
  }, 60);
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(WIFEXITED(res[r].status) && WEXITSTATUS(res[r].status) == 0) << "rank " << r << ": " << res[r].output;
    EXPECT_EQ(res[r].output, "ok") << "rank " << r;
  }
}

TEST(TunerHosts, TwoHostsOfTwoRanks) { expect_hosts(2); }
TEST(TunerHosts, OneHost) { expect_hosts(1); }

// One host whose topology has fewer GPUs than ranks (CPU collectives on a
// GPU machine, or a topology file): still one host. Regression: the tuner
// defaulted to one rank per GPU per host, so 4 ranks over 2 GPUs were
// priced as 2 hosts joined by a network.
TEST(TunerHosts, OneHostWithMoreRanksThanGpus) {
  const std::string file = "/tmp/loom-tuner-hosts-" + std::to_string(getpid()) + ".xml";
  {
    FILE* f = fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fputs("<system version=\"1\">\n"
          "  <cpu numaid=\"0\" arch=\"x86_64\">\n"
          "    <pci busid=\"0000:01:00.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">"
          "<gpu dev=\"0\" sm=\"90\" rank=\"0\" gdr=\"1\"/></pci>\n"
          "    <pci busid=\"0000:02:00.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">"
          "<gpu dev=\"1\" sm=\"90\" rank=\"1\" gdr=\"1\"/></pci>\n"
          "  </cpu>\n"
          "</system>\n", f);
    fclose(f);
  }
  setenv("LOOM_TOPO_FILE", file.c_str(), 1);
  expect_hosts(1);
  unsetenv("LOOM_TOPO_FILE");
  std::remove(file.c_str());
}

}  // namespace
}  // namespace loom
