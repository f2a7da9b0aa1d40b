// Paths between devices and between ranks, and NIC affinity.
//
// A path is the best route through the host graph: fewest hops, then the
// widest bottleneck; GPUs and NICs are endpoints only (traffic does not hop
// through a device), switches, NVSwitches and CPUs may be crossed. Its type
// is the worst kind of hop on it, with NCCL's names:
//   LOC same device | NVL NVLink (direct or via NVSwitch) | PIX one PCI switch
//   PXB several PCI switches | PHB through the CPU host bridge (same NUMA)
//   SYS across the SMP interconnect | NET across the network (other host)
//
// Ranks map to GPUs in index order, ranks_per_host per host (default: all
// GPUs of the graph); every host is assumed to have the same graph. A
// CPU-only graph places all ranks on one host, spread over NUMA nodes.
// Paths are kept per pair of slot classes, not per pair of ranks: a 4096-rank
// placement costs what one host's does (it was 16.7 M paths, 2.9 GB).
#pragma once

#include <string>
#include <vector>

#include "topology/graph.h"

namespace loom::topo {

enum class PathType { kLocal = 0, kNvLink, kPix, kPxb, kPhb, kSys, kNet };
const char* path_type_name(PathType t);         // "LOC", "NVL", ...
const char* path_type_description(PathType t);  // "same PCI switch", ...

struct Path {
  PathType type = PathType::kLocal;
  double bw = 0;            // bottleneck GB/s
  int hops = 0;
  double latency_us = 0;
  std::vector<int> nodes;   // src ... dst; empty when unreachable
  bool reachable() const { return !nodes.empty(); }
};

// Best path between two nodes of the graph; unreachable -> empty nodes.
Path find_path(const TopoGraph& g, int src, int dst);

// Host memory bandwidth assumed for shm between processes on one NUMA node.
inline constexpr double kHostMemBw = 10.0;
// Latency added when a path leaves the host and the NIC gives none.
inline constexpr double kNetDefaultLatencyUs = 2.0;

struct RankInfo {
  int rank = 0;
  int host = 0;
  int device = -1;  // GPU node, or -1 for a CPU rank
  int cpu = -1;     // CPU node (NUMA) the rank is close to
  int nic = -1;     // NIC node the rank uses to leave the host, -1 if none
  Path nic_path;    // device (or CPU) -> nic
};

struct RankTopology {
  int nranks = 0;
  int ranks_per_host = 0;
  int nhosts = 0;
  std::vector<RankInfo> ranks;

  // The path from rank a to rank b; NET paths hold both NIC ends.
  const Path& path(int a, int b) const;
  // The class of a rank's local slot: slots of one class have the same
  // device, CPU, NIC and NIC path, so every path and transport between two
  // ranks is a function of their classes and of whether they share a host.
  int slot_class(int r) const { return slot_class_[static_cast<size_t>(r % ranks_per_host)]; }
  int nclasses() const { return nclasses_; }
  // Ranks that realise every (class, class, same host or not) combination of
  // the placement: the first rank of each class on host 0, a second one where
  // the class has more than one slot, and the first of each class on host 1.
  // A worst case over all pairs of ranks equals the worst over pairs of these
  // (tuner.cc), at O(classes^2) instead of O(nranks^2).
  std::vector<int> representatives() const;

  // Filled by map_ranks: tables of [class a * nclasses + class b].
  std::vector<int> slot_class_;
  int nclasses_ = 0;
  std::vector<Path> self_paths_;    // [class]: a rank to itself
  std::vector<Path> local_paths_;   // two ranks of one host
  std::vector<Path> remote_paths_;  // two hosts
};

// ranks_per_host <= 0: automatic (number of GPUs, or all ranks when there are none).
RankTopology map_ranks(const TopoGraph& g, int nranks, int ranks_per_host = 0);

// GPU node -> NIC node chosen for it: best path type, then bandwidth, then
// the NIC least used so far, so GPUs sharing a switch with two NICs get one each.
std::vector<int> gpu_nic_affinity(const TopoGraph& g);

// "PIX 31.5 GB/s 2 hops via PCI 0000:ff:01.0"
std::string describe_path(const TopoGraph& g, const Path& p);

}  // namespace loom::topo
