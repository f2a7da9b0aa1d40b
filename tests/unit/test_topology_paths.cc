// Structure, paths, NIC affinity and transport choice on the shared Azure
// files. Expected values were read off the XML by hand:
//  ndv4: 4 AMD NUMA nodes, each with one PCI switch holding 2 GPUs + 2 IB NICs.
//  ndv2: 2 Intel NUMA nodes, GPUs 0001-0004 and NIC 0101 on NUMA 0, GPUs 0005-0008 on NUMA 1,
//        no PCI switch (everything hangs off the CPU host bridge).
#include <map>
#include <set>

#include <sys/resource.h>

#include "test_topology_util.h"
#include "topology/paths.h"
#include "topology/topo_xml.h"
#include "topology/transport_select.h"
#include "topology/tuner.h"

namespace loom::topo {
namespace {

using testing::shared_topology;

TopoGraph load(const char* name) {
  auto r = load_topology_file(shared_topology(name));
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? r.value().graph : TopoGraph{};
}

const TopoNode& node(const TopoGraph& g, int id) { return g.nodes[static_cast<size_t>(id)]; }

TEST(TopologyNdv4, Structure) {
  TopoGraph g = load("azure-ndv4.xml");
  EXPECT_EQ(g.count(NodeType::kCpu), 4);
  EXPECT_EQ(g.count(NodeType::kPciSwitch), 4);
  EXPECT_EQ(g.count(NodeType::kGpu), 8);
  EXPECT_EQ(g.count(NodeType::kNic), 8);
  EXPECT_EQ(g.count(NodeType::kNvSwitch), 0);  // the file has no NVLink information
  // GPUs in PCI bus order; their NUMA nodes as in the file.
  std::vector<std::string> busids = {"0001:00:00.0", "0002:00:00.0", "0003:00:00.0", "0004:00:00.0",
                                     "000b:00:00.0", "000c:00:00.0", "000d:00:00.0", "000e:00:00.0"};
  std::vector<int> numa = {1, 1, 0, 0, 3, 3, 2, 2};
  std::vector<int> gpus = g.nodes_of(NodeType::kGpu);
  for (size_t i = 0; i < gpus.size(); ++i) {
    EXPECT_EQ(node(g, gpus[i]).busid, busids[i]);
    EXPECT_EQ(node(g, gpus[i]).numa_id, numa[i]) << i;
    EXPECT_EQ(node(g, node(g, gpus[i]).parent).type, NodeType::kPciSwitch);
  }
  for (int nic : g.nodes_of(NodeType::kNic)) {
    EXPECT_TRUE(node(g, nic).is_ib);
    EXPECT_NEAR(node(g, nic).net_bw, 31.5, 0.1);  // no speed in the file: gen4 x16 bound
  }
  // Every switch holds 2 GPUs and 2 NICs.
  for (int sw : g.nodes_of(NodeType::kPciSwitch)) {
    int ng = 0, nn = 0;
    for (const TopoNode& n : g.nodes) {
      if (n.parent != sw) continue;
      ng += n.type == NodeType::kGpu;
      nn += n.type == NodeType::kNic;
    }
    EXPECT_EQ(ng, 2);
    EXPECT_EQ(nn, 2);
  }
  for (const TopoLink& l : g.links) {
    if (l.type == LinkType::kSmp) {
      EXPECT_DOUBLE_EQ(l.bw, 16.0);  // AMD socket link
    }
  }
}

TEST(TopologyNdv4, PathsAndAffinity) {
  TopoGraph g = load("azure-ndv4.xml");
  std::vector<int> gpus = g.nodes_of(NodeType::kGpu);
  Path same_switch = find_path(g, gpus[0], gpus[1]);
  EXPECT_EQ(same_switch.type, PathType::kPix);
  EXPECT_EQ(same_switch.hops, 2);
  EXPECT_NEAR(same_switch.bw, 31.5, 0.1);
  Path cross = find_path(g, gpus[0], gpus[2]);  // NUMA 1 -> NUMA 0
  EXPECT_EQ(cross.type, PathType::kSys);
  EXPECT_EQ(cross.hops, 5);  // GPU-switch-CPU-CPU-switch-GPU
  EXPECT_DOUBLE_EQ(cross.bw, 16.0);
  // Each GPU gets a NIC on its own switch, and the 8 NICs are spread 1:1.
  std::vector<int> aff = gpu_nic_affinity(g);
  ASSERT_EQ(aff.size(), 8u);
  std::set<int> used;
  for (size_t i = 0; i < aff.size(); ++i) {
    ASSERT_GE(aff[i], 0);
    EXPECT_EQ(node(g, aff[i]).parent, node(g, gpus[i]).parent) << "GPU" << i;
    EXPECT_EQ(find_path(g, gpus[i], aff[i]).type, PathType::kPix);
    used.insert(aff[i]);
  }
  EXPECT_EQ(used.size(), 8u);
}

TEST(TopologyNdv4, RanksTransportsAcrossHosts) {
  TopoGraph g = load("azure-ndv4.xml");
  RankTopology rt = map_ranks(g, 16);
  EXPECT_EQ(rt.nhosts, 2);
  EXPECT_EQ(rt.ranks_per_host, 8);
  EXPECT_EQ(rt.path(0, 1).type, PathType::kPix);
  EXPECT_EQ(rt.path(0, 2).type, PathType::kSys);
  EXPECT_EQ(rt.path(0, 8).type, PathType::kNet);
  EXPECT_EQ(rt.ranks[8].nic, rt.ranks[0].nic);  // same local slot, same NIC
  // AMD host: NCCL's default allows P2P up to SYS.
  EXPECT_EQ(default_p2p_level(g), PathType::kSys);
  TransportChoice t01 = choose_transport(g, rt, 0, 1);
  EXPECT_EQ(t01.kind, TransportKind::kCudaIpc);
  EXPECT_NE(t01.reason.find("same PCI switch"), std::string::npos) << t01.reason;
  EXPECT_EQ(choose_transport(g, rt, 0, 2).kind, TransportKind::kCudaIpc);
  TransportChoice t08 = choose_transport(g, rt, 0, 8);
  EXPECT_EQ(t08.kind, TransportKind::kIb);
  EXPECT_NE(t08.reason.find("0101:00:00.0"), std::string::npos) << t08.reason;
  TransportPolicy no_ib;
  no_ib.ib_usable = false;
  EXPECT_EQ(choose_transport(g, rt, 0, 8, no_ib).kind, TransportKind::kSocket);
  TransportPolicy strict;
  strict.p2p_level_auto = false;
  strict.p2p_level = PathType::kPix;
  EXPECT_EQ(choose_transport(g, rt, 0, 1, strict).kind, TransportKind::kCudaIpc);
  EXPECT_EQ(choose_transport(g, rt, 0, 2, strict).kind, TransportKind::kShm);
}

TEST(TopologyNdv2, StructureAndAffinity) {
  TopoGraph g = load("azure-ndv2.xml");
  EXPECT_EQ(g.count(NodeType::kCpu), 2);
  EXPECT_EQ(g.count(NodeType::kPciSwitch), 0);
  EXPECT_EQ(g.count(NodeType::kGpu), 8);
  EXPECT_EQ(g.count(NodeType::kNic), 1);
  std::vector<int> gpus = g.nodes_of(NodeType::kGpu);
  for (size_t i = 0; i < gpus.size(); ++i) EXPECT_EQ(node(g, gpus[i]).numa_id, i < 4 ? 0 : 1);
  int nic = g.nodes_of(NodeType::kNic)[0];
  EXPECT_EQ(node(g, nic).busid, "0101:00:00.0");
  EXPECT_EQ(node(g, nic).numa_id, 0);
  std::vector<int> aff = gpu_nic_affinity(g);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(aff[i], nic);
    EXPECT_EQ(find_path(g, gpus[i], nic).type, i < 4 ? PathType::kPhb : PathType::kSys) << i;
  }
  // Same NUMA: through the CPU (PHB); Intel: P2P only up to PXB -> shm.
  Path p01 = find_path(g, gpus[0], gpus[1]);
  EXPECT_EQ(p01.type, PathType::kPhb);
  Path p04 = find_path(g, gpus[0], gpus[4]);
  EXPECT_EQ(p04.type, PathType::kSys);
  EXPECT_DOUBLE_EQ(p04.bw, 10.0);  // Skylake UPI figure
  EXPECT_EQ(default_p2p_level(g), PathType::kPxb);
  RankTopology rt = map_ranks(g, 8);
  TransportChoice t = choose_transport(g, rt, 0, 1);
  EXPECT_EQ(t.kind, TransportKind::kShm);
  EXPECT_NE(t.reason.find("beyond the P2P level PXB"), std::string::npos) << t.reason;
}

TEST(TopologyPaths, NvLinkBeatsPciAndCpuRanksUseShm) {
  const char* xml = R"(<system version="1">
  <cpu numaid="0" vendor="GenuineIntel" familyid="6" modelid="143">
    <pci busid="0000:10:00.0" class="0x060400" link_speed="16 GT/s" link_width="16">
      <pci busid="0000:11:00.0" class="0x030200" link_speed="16 GT/s" link_width="16"><gpu sm="80">
        <nvlink target="0000:ff:00.0" count="12" tclass="0x068000"/></gpu></pci>
      <pci busid="0000:12:00.0" class="0x030200" link_speed="16 GT/s" link_width="16"><gpu sm="80">
        <nvlink target="0000:ff:00.0" count="12" tclass="0x068000"/></gpu></pci>
    </pci>
  </cpu>
</system>)";
  auto r = graph_from_xml_text(xml, "nvs");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const TopoGraph& g = r.value().graph;
  std::vector<int> gpus = g.nodes_of(NodeType::kGpu);
  Path p = find_path(g, gpus[0], gpus[1]);
  EXPECT_EQ(p.type, PathType::kNvLink);
  EXPECT_DOUBLE_EQ(p.bw, 300.0);  // 12 lanes x 25 GB/s, wider than the shared PCI switch
  RankTopology rt = map_ranks(g, 2);
  TransportChoice t = choose_transport(g, rt, 0, 1);
  EXPECT_EQ(t.kind, TransportKind::kCudaIpc);
  EXPECT_NE(t.reason.find("NVLink"), std::string::npos);

  auto cpu_only = graph_from_xml_text("<system><cpu numaid=\"0\"/><cpu numaid=\"1\"/></system>", "cpu");
  ASSERT_TRUE(cpu_only.is_ok());
  RankTopology c = map_ranks(cpu_only.value().graph, 4);
  EXPECT_EQ(c.nhosts, 1);
  EXPECT_EQ(c.path(0, 2).type, PathType::kPhb);  // ranks 0 and 2 share NUMA 0
  EXPECT_EQ(c.path(0, 1).type, PathType::kSys);
  EXPECT_EQ(choose_transport(cpu_only.value().graph, c, 0, 1).kind, TransportKind::kShm);
  // Two hosts without any NIC: socket, and the reason says why.
  RankTopology two = map_ranks(cpu_only.value().graph, 4, 2);
  EXPECT_EQ(two.nhosts, 2);
  TransportChoice s = choose_transport(cpu_only.value().graph, two, 0, 2);
  EXPECT_EQ(s.kind, TransportKind::kSocket);
  EXPECT_NE(s.reason.find("no NIC"), std::string::npos);
}

TEST(TopologyGraph, PcieBandwidthAndBusIds) {
  EXPECT_NEAR(pcie_bw("16 GT/s", 16), 31.5, 0.01);
  EXPECT_NEAR(pcie_bw("8.0 GT/s PCIe", 16), 15.75, 0.01);
  EXPECT_NEAR(pcie_bw("2.5 GT/s", 1), 0.25, 1e-9);
  EXPECT_EQ(pcie_bw("fast", 16), 0);
  EXPECT_EQ(pcie_bw("16 GT/s", 0), 0);
  std::string b;
  EXPECT_TRUE(normalize_busid("3B:00.0", b));
  EXPECT_EQ(b, "0000:3b:00.0");
  EXPECT_TRUE(normalize_busid("ffff:FF:01.0", b));
  EXPECT_EQ(b, "ffff:ff:01.0");
  EXPECT_FALSE(normalize_busid("0000:3b:00", b));
  EXPECT_FALSE(normalize_busid("123456789:00:00.0", b));
  EXPECT_FALSE(normalize_busid("", b));
}


// The cost a pair of ranks is priced at (Tuner::derive_cost): transport and path.
struct PairCost {
  TransportKind kind;
  PathType type;
  double bw, latency;
  bool operator==(const PairCost&) const = default;
};
PairCost pair_cost(const TopoGraph& g, const RankTopology& rt, int a, int b) {
  const Path& p = rt.path(a, b);
  return {choose_transport(g, rt, a, b).kind, p.type, p.bw, p.latency_us};
}
bool operator<(const PairCost& x, const PairCost& y) {
  return std::tie(x.kind, x.type, x.bw, x.latency) < std::tie(y.kind, y.type, y.bw, y.latency);
}

// Paths are kept per pair of slot classes: every pair of ranks gets what a
// path computed for it alone would be, and the representative ranks realise
// exactly the (same host, cross host) costs that all pairs do, partial last
// hosts and hosts with more ranks than GPUs included.
TEST(TopologyPaths, SlotClassesGiveEveryPairItsPath) {
  TopoGraph ndv4 = load("azure-ndv4.xml"), ndv2 = load("azure-ndv2.xml");
  auto cpu = graph_from_xml_text("<system><cpu numaid=\"0\"/><cpu numaid=\"1\"/></system>", "cpu");
  ASSERT_TRUE(cpu.is_ok());
  struct Case {
    const TopoGraph* g;
    int n, per_host;
  };
  for (const Case& c : {Case{&ndv4, 16, 0}, Case{&ndv4, 12, 0}, Case{&ndv4, 20, 6}, Case{&ndv4, 40, 12},
                        Case{&ndv2, 9, 4}, Case{&ndv2, 24, 0}, Case{&cpu.value().graph, 5, 0},
                        Case{&cpu.value().graph, 7, 3}}) {
    const TopoGraph& g = *c.g;
    RankTopology rt = map_ranks(g, c.n, c.per_host);
    std::set<std::pair<bool, PairCost>> all, reps;
    for (int a = 0; a < rt.nranks; ++a) {
      for (int b = 0; b < rt.nranks; ++b) {
        const RankInfo& ra = rt.ranks[static_cast<size_t>(a)];
        const RankInfo& rb = rt.ranks[static_cast<size_t>(b)];
        const Path& p = rt.path(a, b);
        // Against the path of the two endpoints, computed directly.
        if (ra.host != rb.host) {
          EXPECT_EQ(p.type, PathType::kNet);
        } else if (a == b) {
          EXPECT_EQ(p.type, PathType::kLocal);
        } else if (ra.device >= 0) {
          Path direct = find_path(g, ra.device, rb.device);
          EXPECT_EQ(p.type, direct.type) << a << "->" << b;
          EXPECT_EQ(p.bw, direct.bw) << a << "->" << b;
          EXPECT_EQ(p.nodes, direct.nodes) << a << "->" << b;
        }
        if (a != b) all.insert({ra.host == rb.host, pair_cost(g, rt, a, b)});
      }
    }
    const std::vector<int> r = rt.representatives();
    for (int a : r)
      for (int b : r)
        if (a != b) reps.insert({rt.ranks[static_cast<size_t>(a)].host == rt.ranks[static_cast<size_t>(b)].host,
                                 pair_cost(g, rt, a, b)});
    EXPECT_EQ(reps, all) << "n=" << c.n << " per host " << c.per_host;
  }
}

// A 4096-rank placement and its cost model stay small. Regression: map_ranks
// kept a path per pair of ranks (16.7 M paths, 2.9 GB) and derive_cost
// visited every pair twice (10 s at init on every rank).
TEST(TopologyPaths, ThousandsOfRanksCostWhatOneHostDoes) {
  TopoGraph g = load("azure-ndv4.xml");
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  RankTopology rt = map_ranks(g, 4096);
  EXPECT_EQ(rt.nhosts, 512);
  EXPECT_EQ(rt.path(3, 4000).type, PathType::kNet);
  EXPECT_EQ(rt.path(4000, 4001).type, rt.path(0, 1).type);
  EXPECT_LE(rt.representatives().size(), 24u);
  Tuner t(g);
  const CommCost c = t.cost(4096);
  EXPECT_EQ(c.nhosts, 512);
  EXPECT_GT(c.all.alpha_us, c.intra.alpha_us);  // the network is the worst pair
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 64L * 1024) << "KiB of peak memory for the placement";
}

}  // namespace
}  // namespace loom::topo
