// GPU discovery through NVML and the CUDA runtime, on a machine without a
// GPU: the mocks in tests/gpu/mock pretend to be an 8-GPU NVSwitch machine
// (LOOM_MOCK_GPUS=8:nvswitch) or a 4-GPU NVLink mesh (4:mesh). Checks the
// loader, the GPU query, the graph discovery builds from it (GPU nodes, bus
// ids, SM, NVLink links, NVLink paths) and what loom-topo prints, and that a
// missing NVML leaves a working discovery that says why.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "common/test_util.h"
#include "cuda/cuda_loader.h"
#include "cuda/gpu_info.h"
#include "topology/discover.h"
#include "topology/paths.h"
#include "topology/topo_xml.h"

namespace loom {
namespace {

using topo::LinkType;
using topo::NodeType;

// The mocks read LOOM_MOCK_GPUS once, when first used in this process.
const bool kMockEnv = [] {
  setenv("LOOM_MOCK_GPUS", "8:nvswitch", 1);
  return true;
}();

const cuda::CudaLoader& mock_loader() {
  static cuda::CudaLoader l(cuda::LoaderPaths{LOOM_MOCK_CUDART_PATH, LOOM_MOCK_NVML_PATH});
  return l;
}

std::string gpu_busid(int i) {
  char b[32];
  std::snprintf(b, sizeof b, "0000:%02x:00.0", 0x10 + 0x10 * i);
  return b;
}

// loom-topo with the mocks (or other libraries) and `env` in front.
std::string run_topo(const std::string& env, const std::string& args = "") {
  return testing::run_command(env + " LOOM_TOPO_QUIET=1 " + testing::build_bin("loom-topo") + " " + args + " 2>&1");
}
std::string mock_env(const std::string& machine) {
  return std::string("LOOM_MOCK_GPUS=") + machine + " LOOM_NVML_LIBRARY=" + LOOM_MOCK_NVML_PATH +
         " LOOM_CUDART_LIBRARY=" + LOOM_MOCK_CUDART_PATH;
}

TEST(GpuDiscovery, LoaderFindsMockRuntimeAndNvml) {
  ASSERT_TRUE(kMockEnv);
  const cuda::CudaLoader& l = mock_loader();
  ASSERT_NE(l.runtime(), nullptr) << l.runtime_status();
  ASSERT_NE(l.nvml(), nullptr) << l.nvml_status();
  EXPECT_EQ(l.device_count(), 8);
  EXPECT_NE(l.runtime_status().find("8 device(s)"), std::string::npos) << l.runtime_status();
  EXPECT_NE(l.nvml_status().find("8 GPU(s)"), std::string::npos) << l.nvml_status();
}

TEST(GpuDiscovery, QueryNvSwitchMachine) {
  cuda::GpuQuery q = cuda::query_gpus(mock_loader());
  ASSERT_EQ(q.gpus.size(), 8u);
  EXPECT_TRUE(q.notes.empty());
  for (int i = 0; i < 8; ++i) {
    const cuda::GpuInfo& g = q.gpus[static_cast<size_t>(i)];
    EXPECT_EQ(g.busid, gpu_busid(i));
    EXPECT_EQ(g.dev, i);
    EXPECT_EQ(g.sm, 90);
    // 18 links over 4 switches: 5, 5, 4, 4 (link l goes to switch l % 4).
    ASSERT_EQ(g.links.size(), 4u);
    int total = 0;
    for (size_t s = 0; s < 4; ++s) {
      EXPECT_TRUE(g.links[s].nvswitch);
      EXPECT_EQ(g.links[s].count, s < 2 ? 5 : 4);
      total += g.links[s].count;
    }
    EXPECT_EQ(total, 18);
    EXPECT_EQ(g.links[0].busid, "0000:05:00.0");
  }
}

TEST(GpuDiscovery, GraphHasGpusNvSwitchAndNvLinkPaths) {
  topo::DiscoverOptions opt;
  opt.cuda = &mock_loader();
  auto r = topo::discover_topology(opt);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const topo::TopoGraph& g = r.value().graph;
  ASSERT_EQ(g.count(NodeType::kGpu), 8);
  ASSERT_EQ(g.count(NodeType::kNvSwitch), 1);
  const int nvs = g.nodes_of(NodeType::kNvSwitch)[0];
  std::vector<int> gpus(8, -1);
  for (int id : g.nodes_of(NodeType::kGpu)) {
    const topo::TopoNode& n = g.nodes[static_cast<size_t>(id)];
    ASSERT_GE(n.index, 0);
    ASSERT_LT(n.index, 8);
    gpus[static_cast<size_t>(n.index)] = id;
    EXPECT_EQ(n.busid, gpu_busid(n.index));
    EXPECT_EQ(n.sm, 90);
  }
  const double lane = topo::nvlink_lane_bw(90);
  for (int id : gpus) {
    int nvlinks = 0;
    for (const topo::TopoLink& l : g.links) {
      if (l.type != LinkType::kNvLink || (l.a != id && l.b != id)) continue;
      ++nvlinks;
      EXPECT_EQ(l.a == id ? l.b : l.a, nvs);
      EXPECT_EQ(l.count, 18);
      EXPECT_DOUBLE_EQ(l.bw, 18 * lane);
    }
    EXPECT_EQ(nvlinks, 1);
  }
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      if (a == b) continue;
      topo::Path p = topo::find_path(g, gpus[static_cast<size_t>(a)], gpus[static_cast<size_t>(b)]);
      EXPECT_EQ(p.type, topo::PathType::kNvLink) << a << "->" << b;
      EXPECT_DOUBLE_EQ(p.bw, 18 * lane);
    }
  }
}

TEST(GpuDiscovery, MissingNvmlStillDiscoversAndSaysWhy) {
  cuda::CudaLoader l(cuda::LoaderPaths{"/nonexistent/libcudart.so", "/nonexistent/libnvidia-ml.so"});
  EXPECT_EQ(l.runtime(), nullptr);
  EXPECT_EQ(l.nvml(), nullptr);
  EXPECT_NE(l.runtime_status().find("no CUDA"), std::string::npos) << l.runtime_status();
  EXPECT_NE(l.nvml_status().find("/nonexistent/libnvidia-ml.so"), std::string::npos) << l.nvml_status();
  EXPECT_TRUE(cuda::query_gpus(l).gpus.empty());
  topo::DiscoverOptions opt;
  opt.cuda = &l;
  auto r = topo::discover_topology(opt);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value().graph.count(NodeType::kGpu), 0);
  EXPECT_GE(r.value().graph.count(NodeType::kCpu), 1);

  // The tool works the same way and its INFO log says why there are no GPUs.
  std::string out = run_topo("LOOM_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1 "
                             "LOOM_CUDART_LIBRARY=/nonexistent/libcudart.so LOOM_DEBUG=INFO "
                             "LOOM_DEBUG_SUBSYS=INIT,TOPO");
  EXPECT_NE(out.find("Topology: discovered on"), std::string::npos) << out;
  EXPECT_NE(out.find("0 GPU"), std::string::npos) << out;
  EXPECT_NE(out.find("NVML: not loaded"), std::string::npos) << out;
  EXPECT_NE(out.find("/nonexistent/libnvidia-ml.so.1"), std::string::npos) << out;
}

TEST(LoomTopo, PrintsMockNvSwitchGpus) {
  std::string out = run_topo(mock_env("8:nvswitch"));
  EXPECT_NE(out.find("8 GPU"), std::string::npos) << out;
  EXPECT_NE(out.find("1 NVSwitch"), std::string::npos) << out;
  for (int i = 0; i < 8; ++i)
    EXPECT_NE(out.find("GPU" + std::to_string(i) + " " + gpu_busid(i) + " sm90"), std::string::npos) << out;
  // Ranks default to one per GPU; every pair is NVL at 18 lanes x 25 GB/s.
  EXPECT_NE(out.find("Ranks: 8"), std::string::npos) << out;
  EXPECT_NE(out.find("NVL/450.0"), std::string::npos) << out;
  EXPECT_EQ(out.find("PHB/"), std::string::npos) << out;
}

TEST(LoomTopo, MockMeshDumpsAndReimportsNvLinks) {
  char dir[] = "/tmp/loom-gpu-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string dump = std::string(dir) + "/mesh.xml";
  std::string out = run_topo(mock_env("4:mesh") + " LOOM_TOPO_DUMP_FILE=" + dump);
  EXPECT_NE(out.find("4 GPU"), std::string::npos) << out;
  EXPECT_NE(out.find("0 NVSwitch"), std::string::npos) << out;
  EXPECT_NE(out.find("NVL/100.0"), std::string::npos) << out;  // 4 links x 25 GB/s (sm 80)
  auto r = topo::load_topology_file(dump);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const topo::TopoGraph& g = r.value().graph;
  ASSERT_EQ(g.count(NodeType::kGpu), 4);
  int nvlinks = 0;
  for (const topo::TopoLink& l : g.links) {
    if (l.type != LinkType::kNvLink) continue;
    ++nvlinks;
    EXPECT_EQ(g.nodes[static_cast<size_t>(l.a)].type, NodeType::kGpu);
    EXPECT_EQ(g.nodes[static_cast<size_t>(l.b)].type, NodeType::kGpu);
    EXPECT_EQ(l.count, 4);
    EXPECT_DOUBLE_EQ(l.bw, 4 * topo::nvlink_lane_bw(80));
  }
  EXPECT_EQ(nvlinks, 6);  // every pair of 4
  std::vector<int> gpus = g.nodes_of(NodeType::kGpu);
  for (int a : gpus) {
    EXPECT_EQ(g.nodes[static_cast<size_t>(a)].sm, 80);
    for (int b : gpus) {
      if (a == b) continue;
      EXPECT_EQ(topo::find_path(g, a, b).type, topo::PathType::kNvLink);
    }
  }
  std::remove(dump.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace loom
