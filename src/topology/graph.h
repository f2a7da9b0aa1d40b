// The topology graph of one host: what is connected to what, how fast.
//
// Nodes are CPUs (one per NUMA node), PCI switches/bridges, GPUs, NICs (one
// per network port) and NVSwitch fabrics; links carry a type, a bandwidth in
// GB/s (1e9 bytes/s, one direction) and a latency. The PCI hierarchy is also
// kept as a tree (TopoNode::parent) so the graph can be written back as
// NCCL-format XML; every tree edge is also a kPci link.
//
// The graph is plain data; it is built by topo_xml.cc (from a file or from
// the XML tree produced by discovery) and read by paths.cc and tuner.cc.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::topo {

enum class NodeType { kCpu, kPciSwitch, kGpu, kNic, kNvSwitch };
enum class LinkType { kNvLink, kPci, kSmp, kNet };

const char* node_type_name(NodeType t);  // "CPU", "PCI", "GPU", "NIC", "NVS"
const char* link_type_name(LinkType t);  // "NVL", "PCI", "SMP", "NET"

using AttrList = std::vector<std::pair<std::string, std::string>>;

struct TopoNode {
  NodeType type = NodeType::kCpu;
  int parent = -1;     // PCI-tree parent (a CPU or a switch); -1 for roots
  int index = -1;      // position among nodes of the same type (GPU0, NIC3, ...)
  int numa_id = -1;    // NUMA node of the CPU this node hangs under
  std::string busid;   // normalized "dddd:bb:dd.f"; empty when not a PCI device
  std::string name;    // NIC port name ("mlx5_0"), CPU/GPU label otherwise
  AttrList attrs;      // attributes of <cpu>/<pci>, as read, for export
  AttrList dev_attrs;  // attributes of <gpu>/<net>, as read, for export

  // GPU
  int sm = 0;          // compute capability x10 (80 = A100); 0 unknown
  // NIC
  bool is_ib = false;            // InfiniBand (class 0x0207 or an IB device)
  bool speed_known = false;      // net_bw came from a speed attribute
  bool from_net = false;         // from a <net> (unknown speed: 10 Gb/s); else a NIC <pci>/<nic>
                                 // without one (unknown speed: its PCI link)
  double net_bw = 0;             // GB/s of the port toward the network
  double net_latency_us = 0;
  // CPU
  std::string arch, vendor;
  int family = 0, model = 0;
};

struct TopoLink {
  int a = -1, b = -1;
  LinkType type = LinkType::kPci;
  double bw = 0;          // GB/s, per direction
  double latency_us = 0;
  int count = 1;          // NVLink lanes aggregated in this link
  std::string target;     // NVLink to a CPU: the far end's bus id as read (for export)
};

struct TopoGraph {
  std::vector<TopoNode> nodes;
  std::vector<TopoLink> links;
  std::string source;  // "file /path" or "discovered on host X"

  std::vector<int> nodes_of(NodeType t) const;
  int count(NodeType t) const;
  // The CPU at the root of `node`'s PCI tree, or -1.
  int root_cpu(int node) const;
  // Index of the node with this busid and type, or -1.
  int find_busid(std::string_view busid, NodeType t) const;
  // "GPU2", "NIC0", "CPU1", "PCI 0000:ff:01.0", "NVS".
  std::string label(int node) const;
  // A canonical, order-stable description used to compare graphs (round trip).
  std::string describe() const;
  void add_link(int a, int b, LinkType type, double bw, double latency_us = 0, int count = 1);
};

// Per-direction bandwidth of a PCIe link in GB/s from "16 GT/s" (or "16.0
// GT/s PCIe") and a width; 0 when the speed string is not understood.
double pcie_bw(std::string_view link_speed, int width);
// Per-direction bandwidth of one NVLink lane for a GPU generation (sm x10).
double nvlink_lane_bw(int sm);
// Bandwidth between two CPU sockets (SMP interconnect) for a CPU model.
double smp_bw(std::string_view vendor, int family, int model);

// Normalizes "0000:3B:00.0", "00000000:3b:00.0" or "3b:00.0" to
// "0000:3b:00.0" (domain by value, at least 4 digits); false if malformed.
bool normalize_busid(std::string_view in, std::string& out);

}  // namespace loom::topo
