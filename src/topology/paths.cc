#include "topology/paths.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <tuple>

namespace loom::topo {

const char* path_type_name(PathType t) {
  switch (t) {
    case PathType::kLocal: return "LOC";
    case PathType::kNvLink: return "NVL";
    case PathType::kPix: return "PIX";
    case PathType::kPxb: return "PXB";
    case PathType::kPhb: return "PHB";
    case PathType::kSys: return "SYS";
    case PathType::kNet: return "NET";
  }
  return "?";
}

const char* path_type_description(PathType t) {
  switch (t) {
    case PathType::kLocal: return "same device";
    case PathType::kNvLink: return "NVLink";
    case PathType::kPix: return "same PCI switch";
    case PathType::kPxb: return "several PCI switches";
    case PathType::kPhb: return "same NUMA node (via CPU)";
    case PathType::kSys: return "across the SMP interconnect";
    case PathType::kNet: return "across the network";
  }
  return "?";
}

namespace {

bool is_transit(NodeType t) { return t == NodeType::kCpu || t == NodeType::kPciSwitch || t == NodeType::kNvSwitch; }

PathType classify(const TopoGraph& g, const std::vector<int>& nodes, const std::vector<const TopoLink*>& links) {
  if (nodes.size() <= 1) return PathType::kLocal;
  bool all_nvl = true, smp = false;
  int cpus = 0, switches = 0;
  for (const TopoLink* l : links) {
    if (l->type != LinkType::kNvLink) all_nvl = false;
    if (l->type == LinkType::kSmp) smp = true;
  }
  for (int n : nodes) {
    if (g.nodes[n].type == NodeType::kCpu) ++cpus;
    if (g.nodes[n].type == NodeType::kPciSwitch) ++switches;
  }
  if (all_nvl) return PathType::kNvLink;
  if (smp) return PathType::kSys;
  if (cpus > 0) return PathType::kPhb;
  return switches <= 1 ? PathType::kPix : PathType::kPxb;
}

}  // namespace

Path find_path(const TopoGraph& g, int src, int dst) {
  Path out;
  const size_t n = g.nodes.size();
  if (src < 0 || dst < 0 || static_cast<size_t>(src) >= n || static_cast<size_t>(dst) >= n) return out;
  if (src == dst) {
    out.nodes = {src};
    out.bw = std::numeric_limits<double>::infinity();
    return out;
  }
  std::vector<std::vector<const TopoLink*>> adj(n);
  for (const TopoLink& l : g.links) {
    adj[static_cast<size_t>(l.a)].push_back(&l);
    adj[static_cast<size_t>(l.b)].push_back(&l);
  }
  // Label-setting search on (hops asc, bottleneck bw desc): both criteria
  // are monotone along a path, so the first settle of dst is the best.
  constexpr int kInf = std::numeric_limits<int>::max();
  std::vector<int> hops(n, kInf);
  std::vector<double> bw(n, 0);
  std::vector<const TopoLink*> via(n, nullptr);
  std::vector<bool> done(n, false);
  hops[static_cast<size_t>(src)] = 0;
  bw[static_cast<size_t>(src)] = std::numeric_limits<double>::infinity();
  for (;;) {
    int u = -1;
    for (size_t i = 0; i < n; ++i) {
      if (done[i] || hops[i] == kInf) continue;
      if (u < 0 || hops[i] < hops[static_cast<size_t>(u)] ||
          (hops[i] == hops[static_cast<size_t>(u)] && bw[i] > bw[static_cast<size_t>(u)])) {
        u = static_cast<int>(i);
      }
    }
    if (u < 0 || u == dst) break;
    done[static_cast<size_t>(u)] = true;
    if (u != src && !is_transit(g.nodes[static_cast<size_t>(u)].type)) continue;
    for (const TopoLink* l : adj[static_cast<size_t>(u)]) {
      int v = l->a == u ? l->b : l->a;
      size_t vi = static_cast<size_t>(v);
      if (done[vi]) continue;
      int h = hops[static_cast<size_t>(u)] + 1;
      double b = std::min(bw[static_cast<size_t>(u)], l->bw);
      if (h < hops[vi] || (h == hops[vi] && b > bw[vi])) {
        hops[vi] = h;
        bw[vi] = b;
        via[vi] = l;
      }
    }
  }
  if (hops[static_cast<size_t>(dst)] == kInf) return out;
  std::vector<const TopoLink*> links;
  for (int v = dst; v != src;) {
    const TopoLink* l = via[static_cast<size_t>(v)];
    out.nodes.push_back(v);
    links.push_back(l);
    out.latency_us += l->latency_us;
    v = l->a == v ? l->b : l->a;
  }
  out.nodes.push_back(src);
  std::reverse(out.nodes.begin(), out.nodes.end());
  out.hops = hops[static_cast<size_t>(dst)];
  out.bw = bw[static_cast<size_t>(dst)];
  out.type = classify(g, out.nodes, links);
  return out;
}

namespace {

// Picks the best NIC for `from`, counting prior picks in `usage`.
int best_nic(const TopoGraph& g, int from, std::map<int, int>& usage, Path* path_out) {
  int best = -1;
  Path best_path;
  auto key = [&](int nic, const Path& p) {
    return std::make_tuple(static_cast<int>(p.type), -p.bw, p.hops, usage[nic], g.nodes[static_cast<size_t>(nic)].index);
  };
  for (int nic : g.nodes_of(NodeType::kNic)) {
    Path p = find_path(g, from, nic);
    if (!p.reachable()) continue;
    if (best < 0 || key(nic, p) < key(best, best_path)) {
      best = nic;
      best_path = p;
    }
  }
  if (best >= 0) {
    ++usage[best];
    if (path_out != nullptr) *path_out = best_path;
  }
  return best;
}

}  // namespace

std::vector<int> gpu_nic_affinity(const TopoGraph& g) {
  std::map<int, int> usage;
  std::vector<int> out;
  for (int gpu : g.nodes_of(NodeType::kGpu)) out.push_back(best_nic(g, gpu, usage, nullptr));
  return out;
}

namespace {

bool same_slot(const RankInfo& a, const RankInfo& b) {
  return a.device == b.device && a.cpu == b.cpu && a.nic == b.nic && a.nic_path.type == b.nic_path.type &&
         a.nic_path.bw == b.nic_path.bw && a.nic_path.hops == b.nic_path.hops &&
         a.nic_path.latency_us == b.nic_path.latency_us && a.nic_path.nodes == b.nic_path.nodes;
}

// The path between two ranks described by their slots, on one host or two.
Path rank_path(const TopoGraph& g, const RankInfo& ra, const RankInfo& rb, bool same_host, bool same_rank) {
  Path p;
  if (!same_host) {
    p.type = PathType::kNet;
    if (ra.nic < 0 || rb.nic < 0) {
      p.bw = 0;  // no NIC known: the network is a guess
      p.latency_us = kNetDefaultLatencyUs;
      return p;
    }
    const TopoNode& na = g.nodes[static_cast<size_t>(ra.nic)];
    const TopoNode& nb = g.nodes[static_cast<size_t>(rb.nic)];
    p.bw = std::min({ra.nic_path.bw, na.net_bw, nb.net_bw, rb.nic_path.bw});
    p.hops = ra.nic_path.hops + 1 + rb.nic_path.hops;
    double lat = std::max(na.net_latency_us, nb.net_latency_us);
    p.latency_us = (lat > 0 ? lat : kNetDefaultLatencyUs) + ra.nic_path.latency_us + rb.nic_path.latency_us;
    p.nodes = {ra.device >= 0 ? ra.device : ra.cpu, ra.nic, rb.nic, rb.device >= 0 ? rb.device : rb.cpu};
  } else if (ra.device >= 0) {
    p = find_path(g, ra.device, rb.device);
  } else if (ra.cpu == rb.cpu) {
    // Two processes on one NUMA node talk through its memory.
    p.type = same_rank ? PathType::kLocal : PathType::kPhb;
    p.bw = kHostMemBw;
    p.nodes = {ra.cpu};
  } else {
    p = find_path(g, ra.cpu, rb.cpu);
    p.bw = std::min(p.bw, kHostMemBw);
  }
  return p;
}

}  // namespace

const Path& RankTopology::path(int a, int b) const {
  const size_t ca = static_cast<size_t>(slot_class(a)), cb = static_cast<size_t>(slot_class(b));
  if (a == b) return self_paths_[ca];
  const size_t k = ca * static_cast<size_t>(nclasses_) + cb;
  return ranks[static_cast<size_t>(a)].host == ranks[static_cast<size_t>(b)].host ? local_paths_[k] : remote_paths_[k];
}

std::vector<int> RankTopology::representatives() const {
  std::vector<int> out;
  std::vector<int> seen(static_cast<size_t>(nclasses_), 0);
  const int host0 = std::min(ranks_per_host, nranks);
  for (int r = 0; r < host0; ++r) {
    int& n = seen[static_cast<size_t>(slot_class(r))];
    if (n++ < 2) out.push_back(r);
  }
  std::fill(seen.begin(), seen.end(), 0);
  for (int r = ranks_per_host; r < std::min(2 * ranks_per_host, nranks); ++r) {
    if (seen[static_cast<size_t>(slot_class(r))]++ == 0) out.push_back(r);
  }
  return out;
}

RankTopology map_ranks(const TopoGraph& g, int nranks, int ranks_per_host) {
  RankTopology rt;
  rt.nranks = std::max(nranks, 1);
  std::vector<int> gpus = g.nodes_of(NodeType::kGpu);
  std::vector<int> cpus = g.nodes_of(NodeType::kCpu);
  if (ranks_per_host <= 0) ranks_per_host = gpus.empty() ? rt.nranks : static_cast<int>(gpus.size());
  rt.ranks_per_host = std::min(ranks_per_host, rt.nranks);
  rt.nhosts = (rt.nranks + rt.ranks_per_host - 1) / rt.ranks_per_host;

  // NIC choice per local slot is the same on every host.
  std::map<int, int> usage;
  std::vector<RankInfo> slot(static_cast<size_t>(rt.ranks_per_host));
  std::vector<RankInfo> class_slot;  // one slot of each class
  rt.slot_class_.resize(slot.size());
  for (int s = 0; s < rt.ranks_per_host; ++s) {
    RankInfo& ri = slot[static_cast<size_t>(s)];
    if (!gpus.empty()) {
      ri.device = gpus[static_cast<size_t>(s) % gpus.size()];
      ri.cpu = g.root_cpu(ri.device);
    } else {
      ri.cpu = cpus.empty() ? -1 : cpus[static_cast<size_t>(s) % cpus.size()];
    }
    int from = ri.device >= 0 ? ri.device : ri.cpu;
    if (from >= 0) ri.nic = best_nic(g, from, usage, &ri.nic_path);
    size_t c = 0;
    while (c < class_slot.size() && !same_slot(class_slot[c], ri)) ++c;
    if (c == class_slot.size()) class_slot.push_back(ri);
    rt.slot_class_[static_cast<size_t>(s)] = static_cast<int>(c);
  }
  rt.ranks.reserve(static_cast<size_t>(rt.nranks));
  for (int r = 0; r < rt.nranks; ++r) {
    RankInfo ri = slot[static_cast<size_t>(r % rt.ranks_per_host)];
    ri.rank = r;
    ri.host = r / rt.ranks_per_host;
    rt.ranks.push_back(ri);
  }

  const size_t nc = class_slot.size();
  rt.nclasses_ = static_cast<int>(nc);
  rt.self_paths_.resize(nc);
  rt.local_paths_.resize(nc * nc);
  rt.remote_paths_.resize(nc * nc);
  for (size_t a = 0; a < nc; ++a) {
    rt.self_paths_[a] = rank_path(g, class_slot[a], class_slot[a], true, true);
    for (size_t b = 0; b < nc; ++b) {
      rt.local_paths_[a * nc + b] = rank_path(g, class_slot[a], class_slot[b], true, false);
      rt.remote_paths_[a * nc + b] = rank_path(g, class_slot[a], class_slot[b], false, false);
    }
  }
  return rt;
}

std::string describe_path(const TopoGraph& g, const Path& p) {
  char head[96];
  if (p.bw == std::numeric_limits<double>::infinity()) {
    std::snprintf(head, sizeof head, "%s", path_type_name(p.type));
  } else {
    std::snprintf(head, sizeof head, "%s %.1f GB/s %d hop%s", path_type_name(p.type), p.bw, p.hops, p.hops == 1 ? "" : "s");
  }
  std::string s = head;
  if (p.type == PathType::kNet) {
    if (p.nodes.size() == 4) {
      s += " via " + g.nodes[static_cast<size_t>(p.nodes[1])].name + " -> " + g.nodes[static_cast<size_t>(p.nodes[2])].name;
    } else {
      s += " (no NIC known)";
    }
    return s;
  }
  if (p.nodes.size() > 2) {
    s += " via";
    for (size_t i = 1; i + 1 < p.nodes.size(); ++i) s += (i == 1 ? " " : ", ") + g.label(p.nodes[i]);
  }
  return s;
}

}  // namespace loom::topo
