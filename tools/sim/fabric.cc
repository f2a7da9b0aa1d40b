// The fabric of a placement (simulator.h, fabric_for): routes through the
// host graph and its NICs, capacities, names.
#include "simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <unordered_map>

#include "topology/paths.h"
#include "topology/tuner.h"

namespace loom::sim {

namespace {

// One resource of a route, relative to the two ranks' hosts.
struct Hop {
  bool at_dst = false;  // on the receiver's host (else the sender's)
  bool nic = false;     // a NIC's network port (else a link of the graph)
  uint32_t index = 0;   // the NIC's or the link's index
  uint8_t dir = 0;      // link: 0 = from its end a to b; NIC: 0 = out
};

struct Routes {
  const topo::TopoGraph* g = nullptr;
  const topo::RankTopology* rt = nullptr;
  int n = 0, nhosts = 1, nnic = 0, nlinks = 0;
  std::vector<int> rank_nic;  // per slot class: the NIC index it leaves by
  // Per slot class: its send (receive) side need not be priced apart, as
  // every route from (to) it crosses one link first (last) that is no
  // faster (a GPU's PCI link): one resource fewer per message.
  std::vector<char> skip_send, skip_recv;
  std::unordered_map<uint64_t, std::pair<uint32_t, uint8_t>> link_of;  // (u, v) -> (link, direction u -> v)
  mutable std::vector<std::optional<std::vector<Hop>>> memo;         // per (same host, class a, class b)

  uint32_t nic_res(int host, int nic, int dir) const {
    return static_cast<uint32_t>(2 * n + 2 * (host * nnic + nic) + dir);
  }
  uint32_t link_res(int host, uint32_t link, int dir) const {
    return static_cast<uint32_t>(2 * n + 2 * nhosts * nnic + 2 * (host * nlinks + static_cast<int>(link)) + dir);
  }
  // The links along `nodes`, in the order traffic crosses them (reversed:
  // from the last node back to the first).
  void links(const std::vector<int>& nodes, bool reversed, bool at_dst, std::vector<Hop>& out) const {
    for (size_t j = 0; j + 1 < nodes.size(); ++j) {
      const size_t i = reversed ? nodes.size() - 2 - j : j;
      int u = nodes[i], v = nodes[i + 1];
      if (reversed) std::swap(u, v);
      auto it = link_of.find((static_cast<uint64_t>(u) << 32) | static_cast<uint32_t>(v));
      if (it != link_of.end()) out.push_back({at_dst, false, it->second.first, it->second.second});
    }
  }
  const std::vector<Hop>& hops(int a, int b) const {
    const bool same = rt->ranks[static_cast<size_t>(a)].host == rt->ranks[static_cast<size_t>(b)].host;
    const size_t nc = static_cast<size_t>(rt->nclasses());
    const size_t ca = static_cast<size_t>(rt->slot_class(a)), cb = static_cast<size_t>(rt->slot_class(b));
    std::optional<std::vector<Hop>>& m = memo[(same ? nc * nc : 0) + ca * nc + cb];
    if (!m) {
      m.emplace();
      if (same) {
        links(rt->path(a, b).nodes, false, false, *m);
      } else {
        const topo::RankInfo& ra = rt->ranks[static_cast<size_t>(a)];
        const topo::RankInfo& rb = rt->ranks[static_cast<size_t>(b)];
        links(ra.nic_path.nodes, false, false, *m);
        m->push_back({false, true, static_cast<uint32_t>(rank_nic[ca]), 0});
        m->push_back({true, true, static_cast<uint32_t>(rank_nic[cb]), 1});
        links(rb.nic_path.nodes, true, true, *m);
      }
    }
    return *m;
  }
};

}  // namespace

Fabric fabric_for(const topo::TopoGraph& g, const topo::RankTopology& rt, const topo::PairCosts& pairs,
                  double gamma_us_per_byte, double gap_us) {
  auto routes = std::make_shared<Routes>();
  Routes& R = *routes;
  R.g = &g;
  R.rt = &rt;
  R.n = rt.nranks;
  R.nhosts = std::max(rt.nhosts, 1);
  R.nlinks = static_cast<int>(g.links.size());
  const size_t nc = static_cast<size_t>(rt.nclasses());
  R.memo.resize(2 * nc * nc);
  auto GBps_of = [](const topo::LinkCost& l) {
    return l.beta_us_per_byte > 0 ? 1e-3 / l.beta_us_per_byte : std::numeric_limits<double>::infinity();
  };

  // NICs: one per NIC node at its network speed; ranks without one (or of
  // unknown speed: the path's bandwidth then) share a stand-in per host.
  const std::vector<int> nic_nodes = g.nodes_of(topo::NodeType::kNic);
  std::vector<double> nic_GBps;
  std::vector<std::string> nic_names;
  std::vector<int> index_of(g.nodes.size(), -1);
  for (size_t i = 0; i < nic_nodes.size(); ++i) {
    index_of[static_cast<size_t>(nic_nodes[i])] = static_cast<int>(i);
    const topo::TopoNode& node = g.nodes[static_cast<size_t>(nic_nodes[i])];
    nic_GBps.push_back(node.net_bw);
    nic_names.push_back(node.name.empty() ? g.label(nic_nodes[i]) : node.name);
  }
  const int standin = static_cast<int>(nic_nodes.size());
  double standin_GBps = 0;
  bool need_standin = false;
  R.rank_nic.assign(nc, standin);
  for (int s = 0; s < rt.ranks_per_host && s < rt.nranks; ++s) {
    const topo::RankInfo& ri = rt.ranks[static_cast<size_t>(s)];
    int nic = ri.nic >= 0 ? index_of[static_cast<size_t>(ri.nic)] : -1;
    if (nic >= 0 && !(nic_GBps[static_cast<size_t>(nic)] > 0)) nic = -1;
    if (nic < 0) {
      nic = standin;
      need_standin = true;
      if (rt.nhosts > 1) standin_GBps = std::max(standin_GBps, GBps_of(pairs(s, s + rt.ranks_per_host)));
    }
    R.rank_nic[static_cast<size_t>(rt.slot_class(s))] = nic;
  }
  if (need_standin) {
    nic_GBps.push_back(standin_GBps > 0 ? standin_GBps : std::numeric_limits<double>::infinity());
    nic_names.push_back("network");
  }
  R.nnic = static_cast<int>(nic_GBps.size());
  // Links, by their two ends; parallel links count as the widest of them.
  for (size_t i = 0; i < g.links.size(); ++i) {
    const topo::TopoLink& l = g.links[i];
    for (int d = 0; d < 2; ++d) {
      const int u = d ? l.b : l.a, v = d ? l.a : l.b;
      const uint64_t key = (static_cast<uint64_t>(u) << 32) | static_cast<uint32_t>(v);
      auto it = R.link_of.find(key);
      if (it == R.link_of.end() || g.links[it->second.first].bw < l.bw)
        R.link_of[key] = {static_cast<uint32_t>(i), static_cast<uint8_t>(d)};
    }
  }

  Fabric f;
  f.nranks = rt.nranks;
  f.gamma_us_per_byte = gamma_us_per_byte;
  f.gap_us = gap_us;
  const size_t nres = 2 * static_cast<size_t>(R.n) + 2 * static_cast<size_t>(R.nhosts) * static_cast<size_t>(R.nnic) +
                      2 * static_cast<size_t>(R.nhosts) * static_cast<size_t>(R.nlinks);
  f.capacity_GBps.assign(nres, std::numeric_limits<double>::infinity());
  f.kind.assign(nres, Limit::kLink);
  // A rank's ports: the fastest of its paths, never below what the cost
  // model lets one of its messages reach.
  std::vector<double> class_port(nc, 0);
  for (size_t a = 0; a < nc; ++a)
    for (size_t b = 0; b < nc; ++b)
      for (const topo::Path* p : {&rt.local_paths_[a * nc + b], &rt.remote_paths_[a * nc + b]})
        if (std::isfinite(p->bw) && p->bw > 0) class_port[a] = std::max(class_port[a], p->bw);
  for (int r = 0; r < R.n; ++r) {
    double port = class_port[static_cast<size_t>(rt.slot_class(r))];
    for (int peer : {(r + 1) % R.n, (r + rt.ranks_per_host) % R.n})
      if (peer != r) port = std::max(port, GBps_of(pairs(r, peer)));
    if (!(port > 0)) port = topo::kHostMemBw;
    f.capacity_GBps[static_cast<size_t>(r)] = f.capacity_GBps[static_cast<size_t>(R.n + r)] = port;
    f.kind[static_cast<size_t>(r)] = Limit::kSendPort;
    f.kind[static_cast<size_t>(R.n + r)] = Limit::kRecvPort;
  }
  for (int h = 0; h < R.nhosts; ++h) {
    for (int i = 0; i < R.nnic; ++i)
      for (int d = 0; d < 2; ++d) {
        f.capacity_GBps[R.nic_res(h, i, d)] = nic_GBps[static_cast<size_t>(i)];
        f.kind[R.nic_res(h, i, d)] = d ? Limit::kNicIn : Limit::kNicOut;
      }
    for (int l = 0; l < R.nlinks; ++l) {
      const double bw = g.links[static_cast<size_t>(l)].bw;
      for (int d = 0; d < 2; ++d)
        f.capacity_GBps[R.link_res(h, static_cast<uint32_t>(l), d)] =
            std::isfinite(bw) && bw > 0 ? bw : std::numeric_limits<double>::infinity();
    }
  }
  // Ports a single first (last) link stands for.
  R.skip_send.assign(nc, 1);
  R.skip_recv.assign(nc, 1);
  {
    std::vector<std::optional<std::pair<bool, uint32_t>>> first(nc), last(nc);  // the link seen so far
    const int rph = std::min(rt.ranks_per_host, rt.nranks);
    for (int a = 0; a < rph; ++a)
      for (int b = 0; b < std::min(rt.nranks, 2 * rph); ++b) {
        if (a == b) continue;
        const size_t ca = static_cast<size_t>(rt.slot_class(a)), cb = static_cast<size_t>(rt.slot_class(b));
        const std::vector<Hop>& h = R.hops(a, b);
        auto id = [&](const Hop& x) { return R.link_res(0, x.index, x.dir); };
        auto note = [&](std::optional<std::pair<bool, uint32_t>>& seen, char& skip, const Hop* x, uint32_t port) {
          if (!x || x->nic || !(f.capacity_GBps[id(*x)] <= f.capacity_GBps[port])) {
            skip = 0;
            return;
          }
          if (seen && seen->second != id(*x)) skip = 0;
          seen = std::make_pair(true, id(*x));
        };
        note(first[ca], R.skip_send[ca], h.empty() ? nullptr : &h.front(), static_cast<uint32_t>(a));
        note(last[cb], R.skip_recv[cb], h.empty() ? nullptr : &h.back(), static_cast<uint32_t>(R.n + b));
      }
  }
  f.link = [&pairs](int a, int b) { return pairs(a, b); };
  f.route = [routes](int a, int b, std::vector<uint32_t>& out) {
    const Routes& R = *routes;
    if (!R.skip_send[static_cast<size_t>(R.rt->slot_class(a))]) out.push_back(static_cast<uint32_t>(a));
    if (!R.skip_recv[static_cast<size_t>(R.rt->slot_class(b))]) out.push_back(static_cast<uint32_t>(R.n + b));
    const int ha = R.rt->ranks[static_cast<size_t>(a)].host, hb = R.rt->ranks[static_cast<size_t>(b)].host;
    for (const Hop& h : R.hops(a, b)) {
      const int host = h.at_dst ? hb : ha;
      out.push_back(h.nic ? R.nic_res(host, static_cast<int>(h.index), h.dir) : R.link_res(host, h.index, h.dir));
    }
  };
  f.name = [routes, nic_names](uint32_t id) -> std::string {
    const Routes& R = *routes;
    const int n = R.n;
    if (id < static_cast<uint32_t>(n)) return fmt::format("send side of rank {}", id);
    if (id < static_cast<uint32_t>(2 * n)) return fmt::format("receive side of rank {}", id - static_cast<uint32_t>(n));
    uint32_t k = id - static_cast<uint32_t>(2 * n);
    const auto nic_total = static_cast<uint32_t>(2 * R.nhosts * R.nnic);
    if (k < nic_total) {
      const uint32_t dir = k % 2, slot = k / 2;
      return fmt::format("NIC {} {} of host {}", nic_names[slot % static_cast<uint32_t>(R.nnic)], dir ? "in" : "out",
                         slot / static_cast<uint32_t>(R.nnic));
    }
    k -= nic_total;
    const uint32_t dir = k % 2, slot = k / 2;
    const topo::TopoLink& l = R.g->links[slot % static_cast<uint32_t>(R.nlinks)];
    return fmt::format("{} link {} -> {} of host {}", topo::link_type_name(l.type), R.g->label(dir ? l.b : l.a),
                       R.g->label(dir ? l.a : l.b), slot / static_cast<uint32_t>(R.nlinks));
  };
  return f;
}

}  // namespace loom::sim
