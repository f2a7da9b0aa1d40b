// LOOM_TOPO_DUMP_FILE is written by one rank of a job, as NCCL's
// NCCL_TOPO_DUMP_FILE (NCCL_TOPO_DUMP_FILE_RANK, default 0). Regression:
// every process wrote it (from loading the topology), each truncating and
// rewriting the same file while the others wrote theirs.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "common/test_util.h"
#include "unit/test_topology_util.h"
#include "topology/topo_xml.h"

namespace loom {
namespace {

TEST(TopoDump, OnlyTheChosenRankWritesIt) {
  const std::string dump = ::testing::TempDir() + "/loom_topo_dump_rank_" + std::to_string(getpid()) + ".xml";
  const std::string topo = topo::testing::shared_topology("azure-ndv2.xml");
  setenv("LOOM_TOPO_FILE", topo.c_str(), 1);  // the same graph for every rank, no discovery
  setenv("LOOM_TOPO_DUMP_FILE", dump.c_str(), 1);
  auto exists = [&] { return std::ifstream(dump).good(); };
  std::remove(dump.c_str());
  {
    // No rank 5 in a job of 2: nobody writes.
    setenv("LOOM_TOPO_DUMP_FILE_RANK", "5", 1);
    auto comms = Comm::init_all(2);
    ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
    EXPECT_FALSE(exists()) << dump << " was written though no rank is 5";
  }
  {
    unsetenv("LOOM_TOPO_DUMP_FILE_RANK");  // default: rank 0
    auto comms = Comm::init_all(2);
    ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
    ASSERT_TRUE(exists());
    auto back = topo::load_topology_file(dump);
    auto want = topo::load_topology_file(topo);
    ASSERT_TRUE(back.is_ok() && want.is_ok());
    EXPECT_EQ(back.value().graph.describe(), want.value().graph.describe());
  }
  std::remove(dump.c_str());
  unsetenv("LOOM_TOPO_DUMP_FILE");
  unsetenv("LOOM_TOPO_FILE");
}

}  // namespace
}  // namespace loom
