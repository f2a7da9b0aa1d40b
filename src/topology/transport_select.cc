#include "topology/transport_select.h"

#include <cstdio>

namespace loom::topo {

const char* transport_name(TransportKind k) {
  switch (k) {
    case TransportKind::kShm: return "shm";
    case TransportKind::kCudaIpc: return "cuda_ipc";
    case TransportKind::kSocket: return "socket";
    case TransportKind::kIb: return "ib";
  }
  return "?";
}

PathType default_p2p_level(const TopoGraph& g) {
  // P2P writes through an AMD host bridge / Infinity Fabric perform well;
  // through Intel root complexes and ARM CPUs they often do not.
  for (int cpu : g.nodes_of(NodeType::kCpu)) {
    if (g.nodes[static_cast<size_t>(cpu)].vendor != "AuthenticAMD") return PathType::kPxb;
  }
  return g.count(NodeType::kCpu) > 0 ? PathType::kSys : PathType::kPxb;
}

TransportChoice choose_transport(const TopoGraph& g, const RankTopology& rt, int a, int b,
                                 const TransportPolicy& policy) {
  const RankInfo& ra = rt.ranks[static_cast<size_t>(a)];
  const RankInfo& rb = rt.ranks[static_cast<size_t>(b)];
  const Path& p = rt.path(a, b);
  TransportChoice c;
  if (ra.host != rb.host) {
    if (ra.nic < 0) {
      c.kind = TransportKind::kSocket;
      c.reason = "other host; no NIC in the topology, TCP over the default route";
      return c;
    }
    const TopoNode& nic = g.nodes[static_cast<size_t>(ra.nic)];
    char buf[192];
    std::snprintf(buf, sizeof buf, "other host; NIC %s (%s, %.1f GB/s) is %s from %s", nic.name.c_str(),
                  nic.is_ib ? "verbs" : "Ethernet", nic.net_bw, path_type_name(ra.nic_path.type),
                  ra.device >= 0 ? g.label(ra.device).c_str() : g.label(ra.cpu).c_str());
    c.reason = buf;
    if (nic.is_ib && policy.ib_usable) {
      c.kind = TransportKind::kIb;
    } else {
      c.kind = TransportKind::kSocket;
      if (nic.is_ib) c.reason += "; verbs not usable, using TCP";
    }
    return c;
  }
  if (ra.device < 0 || rb.device < 0) {
    c.kind = TransportKind::kShm;
    c.reason = a == b ? "same process" : std::string("same host, host memory (") + path_type_description(p.type) + ")";
    return c;
  }
  PathType level = policy.p2p_level_auto ? default_p2p_level(g) : policy.p2p_level;
  if (p.type == PathType::kLocal) {
    c.kind = TransportKind::kCudaIpc;
    c.reason = "same GPU";
  } else if (p.type == PathType::kNvLink || (p.reachable() && p.type <= level)) {
    c.kind = TransportKind::kCudaIpc;
    c.reason = std::string("GPU peer-to-peer over ") + path_type_description(p.type) + " (" + path_type_name(p.type) +
               ", P2P allowed up to " + path_type_name(level) + ")";
  } else {
    c.kind = TransportKind::kShm;
    c.reason = std::string("path is ") + path_type_name(p.type) + " (" + path_type_description(p.type) +
               "), beyond the P2P level " + path_type_name(level) + "; staged through host memory";
  }
  return c;
}

}  // namespace loom::topo
