#include "topology/graph.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>

namespace loom::topo {

const char* node_type_name(NodeType t) {
  switch (t) {
    case NodeType::kCpu: return "CPU";
    case NodeType::kPciSwitch: return "PCI";
    case NodeType::kGpu: return "GPU";
    case NodeType::kNic: return "NIC";
    case NodeType::kNvSwitch: return "NVS";
  }
  return "?";
}

const char* link_type_name(LinkType t) {
  switch (t) {
    case LinkType::kNvLink: return "NVL";
    case LinkType::kPci: return "PCI";
    case LinkType::kSmp: return "SMP";
    case LinkType::kNet: return "NET";
  }
  return "?";
}

std::vector<int> TopoGraph::nodes_of(NodeType t) const {
  std::vector<int> out;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].type == t) out.push_back(static_cast<int>(i));
  }
  std::sort(out.begin(), out.end(), [&](int a, int b) { return nodes[a].index < nodes[b].index; });
  return out;
}

int TopoGraph::count(NodeType t) const {
  return static_cast<int>(std::count_if(nodes.begin(), nodes.end(), [t](const TopoNode& n) { return n.type == t; }));
}

int TopoGraph::root_cpu(int node) const {
  // Bounded walk: a malformed parent chain must not loop forever.
  for (size_t steps = 0; node >= 0 && steps <= nodes.size(); ++steps) {
    if (nodes[node].type == NodeType::kCpu) return node;
    node = nodes[node].parent;
  }
  return -1;
}

int TopoGraph::find_busid(std::string_view busid, NodeType t) const {
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].type == t && nodes[i].busid == busid) return static_cast<int>(i);
  }
  return -1;
}

std::string TopoGraph::label(int node) const {
  const TopoNode& n = nodes[node];
  switch (n.type) {
    case NodeType::kPciSwitch: return std::string("PCI ") + n.busid;
    case NodeType::kNvSwitch: return "NVS";
    default: return std::string(node_type_name(n.type)) + std::to_string(n.index);
  }
}

namespace {
std::string fmt_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}
std::string attrs_text(const AttrList& a) {
  std::string s;
  for (const auto& [k, v] : a) s += " " + k + "=" + v;
  return s;
}
}  // namespace

std::string TopoGraph::describe() const {
  std::string out;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const TopoNode& n = nodes[i];
    out += label(static_cast<int>(i)) + " type=" + node_type_name(n.type) + " busid=" + n.busid +
           " parent=" + (n.parent >= 0 ? label(n.parent) : "-") + " numa=" + std::to_string(n.numa_id) +
           " name=" + n.name + " sm=" + std::to_string(n.sm) + " ib=" + std::to_string(n.is_ib) +
           " net_bw=" + fmt_double(n.net_bw) + " lat=" + fmt_double(n.net_latency_us) + " |" +
           attrs_text(n.attrs) + " |" + attrs_text(n.dev_attrs) + "\n";
  }
  std::vector<std::string> ls;
  for (const TopoLink& l : links) {
    std::string a = label(l.a), b = label(l.b);
    if (b < a) std::swap(a, b);
    ls.push_back(a + " <-> " + b + " " + link_type_name(l.type) + " bw=" + fmt_double(l.bw) +
                 " lat=" + fmt_double(l.latency_us) + " count=" + std::to_string(l.count));
  }
  std::sort(ls.begin(), ls.end());
  for (const auto& l : ls) out += l + "\n";
  return out;
}

void TopoGraph::add_link(int a, int b, LinkType type, double bw, double latency_us, int count) {
  links.push_back(TopoLink{a, b, type, bw, latency_us, count, {}});
}

double pcie_bw(std::string_view link_speed, int width) {
  if (width <= 0) return 0;
  // Leading number, e.g. "16 GT/s", "8.0 GT/s PCIe", "2.5 GT/s".
  std::string num;
  size_t i = 0;
  while (i < link_speed.size() && link_speed[i] == ' ') ++i;
  while (i < link_speed.size() && (std::isdigit(static_cast<unsigned char>(link_speed[i])) || link_speed[i] == '.')) {
    num += link_speed[i++];
  }
  if (num.empty() || num.size() > 8) return 0;
  double gts = std::strtod(num.c_str(), nullptr);
  if (!(gts > 0 && gts <= 256)) return 0;
  // Line encoding: 8b/10b up to gen2, 128b/130b for gen3-5, FLIT (242/256) from gen6.
  double efficiency = gts <= 5.0 ? 0.8 : (gts < 64.0 ? 128.0 / 130.0 : 242.0 / 256.0);
  return gts * efficiency / 8.0 * width;
}

double nvlink_lane_bw(int sm) {
  // Per-direction GB/s of one NVLink: NVLink1 (P100) 20, NVLink2-4 25, NVLink5 50.
  if (sm >= 100) return 50.0;
  if (sm >= 70) return 25.0;
  return 20.0;
}

double smp_bw(std::string_view vendor, int family, int model) {
  // Rough socket-to-socket figures; the same order NCCL uses for its model.
  if (vendor == "AuthenticAMD") return 16.0;
  if (vendor == "GenuineIntel") return (family == 6 && model >= 0x55) ? 10.0 : 6.0;
  return 10.0;
}

bool normalize_busid(std::string_view in, std::string& out) {
  // Accept "dddd:bb:dd.f" (domain 1-8 hex digits) or "bb:dd.f".
  std::string s;
  for (char c : in) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto hex_run = [&](size_t pos, size_t len) {
    if (pos + len > s.size()) return false;
    for (size_t i = pos; i < pos + len; ++i) {
      if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
    }
    return true;
  };
  size_t first = s.find(':');
  if (first == std::string::npos) return false;
  std::string domain = "0000";
  std::string rest = s;
  if (s.find(':', first + 1) != std::string::npos) {
    if (first == 0 || first > 8 || !hex_run(0, first)) return false;
    // Bus ids compare by value (as NCCL's do): NVML writes 8-digit domains
    // ("00000000:2a:00.0"), sysfs 4 ("0000:2a:00.0"). Leading zeros go, then
    // the domain is padded back to 4 digits.
    size_t nz = 0;
    while (nz + 1 < first && s[nz] == '0') ++nz;
    domain = s.substr(nz, first - nz);
    if (domain.size() < 4) domain.insert(0, 4 - domain.size(), '0');
    rest = s.substr(first + 1);
  }
  // rest must be bb:dd.f
  if (rest.size() != 7 || rest[2] != ':' || rest[5] != '.') return false;
  s = rest;
  if (!hex_run(0, 2) || !hex_run(3, 2) || !hex_run(6, 1)) return false;
  out = domain + ":" + rest;
  return true;
}

}  // namespace loom::topo
