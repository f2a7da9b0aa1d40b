#include "topology/topo_xml.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "topology/topo_log.h"

namespace loom::topo {
namespace {

constexpr int kClassBridge = 0x0604;
constexpr int kClass3d = 0x0302;
constexpr int kClassIb = 0x0207;
constexpr int kMaxNvLinks = 64;
constexpr double kDefaultPciBw = 15.75;  // PCIe gen3 x16, used when the link is not described
// A <net> whose speed is not given (or is -1, 0, not a number): NCCL takes
// 10 Gb/s, as discovery does for an Ethernet port of unknown speed.
constexpr double kUnknownNetMbps = 10000;

// The far end of an NVLink as NCCL's dumps give it when it is not visible
// (inside a VM).
constexpr const char* kVmNvLinkSentinel = "fffffff:ffff:ff";

bool is_vm_nvlink_sentinel(const std::string& s) {
  if (s.size() != 15) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != kVmNvLinkSentinel[i]) return false;
  }
  return true;
}

bool parse_long(const std::string& s, long lo, long hi, long& out, int base = 10) {
  if (s.empty() || s.size() > 24) return false;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, base);
  while (end != nullptr && *end == ' ') ++end;
  if (errno != 0 || end == s.c_str() || *end != '\0' || v < lo || v > hi) return false;
  out = v;
  return true;
}

bool parse_real(const std::string& s, double lo, double hi, double& out) {
  if (s.empty() || s.size() > 32) return false;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  while (end != nullptr && *end == ' ') ++end;
  if (end == s.c_str() || *end != '\0' || !std::isfinite(v) || v < lo || v > hi) return false;
  out = v;
  return true;
}

// "0x030200" (class, subclass, prog-if) or "0x0302" (no prog-if) -> the
// 24-bit value (0x030200 for both); -1 unless "0x" and 4 or 6 hex digits.
long parse_class24(const std::string& s) {
  if (s.size() != 6 && s.size() != 8) return -1;
  if (s[0] != '0' || (s[1] != 'x' && s[1] != 'X')) return -1;
  for (size_t i = 2; i < s.size(); ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return -1;
  }
  long v = std::strtol(s.c_str() + 2, nullptr, 16);
  return s.size() == 6 ? v << 8 : v;
}

// What the far end of an <nvlink> is, from its tclass, as NCCL decides it:
// 0x068001 is a POWER9 CPU's NVLink port, any display class (0x03xxxx) a GPU,
// and everything else (0x068000 and, e.g., bridges) an NVSwitch.
enum class NvLinkPeer { kGpu, kNvSwitch, kCpu };
NvLinkPeer nvlink_peer_of(long tclass24) {
  if (tclass24 == 0x068001) return NvLinkPeer::kCpu;
  if ((tclass24 >> 16) == 0x03) return NvLinkPeer::kGpu;
  return NvLinkPeer::kNvSwitch;
}

// "0x030200" (24-bit class+prog-if) or "0x0302" -> 0x0302; -1 if malformed
// (strtol alone read "0x0x0302" as 0x302 and so as class 0x0003).
int parse_pci_class(const std::string& s) {
  long v = parse_class24(s);
  return v < 0 ? -1 : static_cast<int>(v >> 8);
}

struct PendingNvLink {
  int gpu;
  std::string target;
  int count;
  NvLinkPeer peer;
  int line;
};

bool is_hex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

class Importer {
 public:
  explicit Importer(std::string source) : source_(std::move(source)) {}

  Result<ImportResult> run(const XmlElement& root) {
    if (root.name != "system") {
      return invalid_argument(source_ + ": line " + std::to_string(root.line) + ": root element is <" +
                              root.name + ">, expected <system>");
    }
    if (const std::string* v = root.attr("version"); v != nullptr && *v != "1") {
      warn(root, "topology version '" + *v + "' is not 1; reading it as version 1");
    }
    for (const XmlElement& c : root.children) {
      if (c.name == "cpu") import_cpu(c);
      else warn(c, "unknown element <" + c.name + "> under <system> skipped");
    }
    if (g_.count(NodeType::kCpu) == 0) {
      // A usable graph needs a host; files with no (valid) CPU still describe one.
      TopoNode cpu;
      cpu.type = NodeType::kCpu;
      cpu.numa_id = 0;
      cpu.attrs = {{"numaid", "0"}};
      g_.nodes.push_back(cpu);
    }
    finish();
    ImportResult r;
    r.graph = std::move(g_);
    r.graph.source = source_;
    r.warnings = std::move(warnings_);
    r.notes = std::move(notes_);
    return r;
  }

 private:
  void warn(const XmlElement& el, const std::string& what) {
    std::string m = source_ + ": line " + std::to_string(el.line) + ": " + what;
    topo_warn(m);
    warnings_.push_back(std::move(m));
  }

  int add_node(TopoNode n) {
    g_.nodes.push_back(std::move(n));
    return static_cast<int>(g_.nodes.size() - 1);
  }

  void import_cpu(const XmlElement& el) {
    // NCCL keeps at most 256 nodes of a type. Every pair of CPUs gets an SMP
    // link, so a hostile file of thousands of <cpu> lines cost minutes and
    // gigabytes at init (4096 of them, 8 ranks: 23 s). Regression test:
    // TopologyImport.TooManyCpusAreCapped.
    if (static_cast<int>(numa_seen_.size()) >= kMaxCpus) {
      if (!cpu_cap_warned_) warn(el, "more than " + std::to_string(kMaxCpus) + " <cpu> elements; the rest skipped");
      cpu_cap_warned_ = true;
      return;
    }
    long numa = 0;
    const std::string* v = el.attr("numaid");
    // numaid -1: NUMA node unknown, as NCCL writes it where sysfs has none
    // (virtual machines). Regression: such a <cpu> was skipped with every
    // GPU and NIC under it. All -1 CPUs are one node.
    if (v == nullptr || !parse_long(*v, -1, 4095, numa)) {
      warn(el, v == nullptr ? "<cpu> without numaid skipped" : "<cpu> numaid '" + *v + "' invalid; skipped");
      return;
    }
    if (numa == -1 && unknown_numa_cpu_ >= 0) {
      import_cpu_children(el, unknown_numa_cpu_);
      return;
    }
    if (!numa_seen_.insert(numa).second) {
      warn(el, "duplicate <cpu numaid=\"" + *v + "\"> skipped");
      return;
    }
    TopoNode cpu;
    cpu.type = NodeType::kCpu;
    cpu.numa_id = static_cast<int>(numa);
    cpu.attrs = el.attrs;
    normalize_affinity(el, cpu.attrs);
    if (const std::string* a = el.attr("arch")) cpu.arch = *a;
    if (const std::string* a = el.attr("vendor")) cpu.vendor = *a;
    long x = 0;
    if (const std::string* a = el.attr("familyid")) {
      if (parse_long(*a, 0, 1 << 20, x)) cpu.family = static_cast<int>(x);
      else warn(el, "<cpu> familyid '" + *a + "' invalid; ignored");
    }
    if (const std::string* a = el.attr("modelid")) {
      if (parse_long(*a, 0, 1 << 20, x)) cpu.model = static_cast<int>(x);
      else warn(el, "<cpu> modelid '" + *a + "' invalid; ignored");
    }
    int id = add_node(std::move(cpu));
    if (numa == -1) unknown_numa_cpu_ = id;
    import_cpu_children(el, id);
  }

  // Keeps <cpu affinity> in the cpumap form NCCL reads: hwloc's "0x..." form
  // (written by older Loom) is rewritten, anything else dropped with a warning.
  void normalize_affinity(const XmlElement& el, AttrList& attrs) {
    for (auto it = attrs.begin(); it != attrs.end(); ++it) {
      if (it->first != "affinity") continue;
      std::vector<uint32_t> words;
      if (!parse_cpu_affinity(it->second, words)) {
        warn(el, "<cpu> affinity '" + it->second + "' is not a CPU mask (e.g. \"ffffffff,0000ffff\"); ignored");
        attrs.erase(it);
        return;
      }
      if (it->second.find('x') != std::string::npos || it->second.find('X') != std::string::npos) {
        it->second = cpumap_string(words);
      }
      return;
    }
  }

  void import_cpu_children(const XmlElement& el, int id) {
    for (const XmlElement& c : el.children) {
      if (c.name == "pci") import_pci(c, id);
      else if (c.name == "nic") import_nic(c, id, "", {});
      else warn(c, "unknown element <" + c.name + "> under <cpu> skipped");
    }
  }

  // Bandwidth of the PCI link described by el's link_speed/link_width.
  double pci_link_bw(const XmlElement& el) {
    const std::string* sp = el.attr("link_speed");
    const std::string* wd = el.attr("link_width");
    if (wd == nullptr) return kDefaultPciBw;
    long width = 0;
    if (!parse_long(*wd, 0, 32, width)) {
      warn(el, "<pci> link_width '" + *wd + "' invalid; assuming PCIe gen3 x16");
      return kDefaultPciBw;
    }
    // NCCL writes link_width="0" when the upstream port has no max_link_width
    // (a device on a root port) and reads it as x16 at the given speed.
    if (width == 0) width = 16;
    // A speed NCCL does not know is gen3's rate per lane at the given width
    // (x8 stays x8). sysfs says "Unknown" (older kernels "Unknown speed")
    // when it cannot tell: that is no reason to warn.
    const double unknown_speed_bw = kDefaultPciBw / 16 * static_cast<double>(width);
    if (sp == nullptr || sp->empty() || sp->rfind("Unknown", 0) == 0) return unknown_speed_bw;
    double bw = pcie_bw(*sp, static_cast<int>(width));
    if (bw <= 0) {
      warn(el, "<pci> link_speed '" + *sp + "' not understood; assuming PCIe gen3 x" + std::to_string(width));
      return unknown_speed_bw;
    }
    return bw;
  }

  void import_pci(const XmlElement& el, int parent) {
    const std::string* b = el.attr("busid");
    std::string busid;
    if (b == nullptr || !normalize_busid(*b, busid)) {
      warn(el, b == nullptr ? "<pci> without busid skipped" : "<pci> busid '" + *b + "' malformed; skipped");
      return;
    }
    if (!busid_seen_.insert(busid).second) {
      warn(el, "duplicate <pci busid=\"" + busid + "\"> skipped");
      return;
    }
    int cls = -1;
    if (const std::string* c = el.attr("class")) {
      cls = parse_pci_class(*c);
      if (cls < 0) warn(el, "<pci> class '" + *c + "' malformed (expected 0x and 6 hex digits, e.g. 0x030200); ignored");
    }
    bool has_pci_children = std::any_of(el.children.begin(), el.children.end(),
                                        [](const XmlElement& c) { return c.name == "pci" || c.name == "nic"; });
    bool has_gpu_child = std::any_of(el.children.begin(), el.children.end(),
                                     [](const XmlElement& c) { return c.name == "gpu"; });
    TopoNode n;
    n.parent = parent;
    n.busid = busid;
    n.attrs = el.attrs;
    double bw = pci_link_bw(el);
    // NCCL makes a GPU of any display class (0x03xx) with a <gpu> child:
    // 0x0300 VGA, 0x0302 3D, and 0x0380 "other display controller", which some
    // GPUs report. A 0x0302 without <gpu> is still one (hand-written files).
    const bool display = cls >= 0 && (cls >> 8) == 0x03;
    if (cls == kClass3d || (display && has_gpu_child) || (cls < 0 && has_gpu_child)) {
      n.type = NodeType::kGpu;
      int id = add_node(std::move(n));
      g_.add_link(id, parent, LinkType::kPci, bw);
      for (const XmlElement& c : el.children) {
        if (c.name == "gpu") import_gpu(c, id);
        else warn(c, "unexpected <" + c.name + "> inside a GPU's <pci> skipped");
      }
      return;
    }
    if (cls >= 0 && (cls >> 8) == 0x02) {
      bool ib = cls == kClassIb;
      bool any = false;
      for (const XmlElement& c : el.children) {
        if (c.name == "nic") {
          import_nic(c, parent, busid, el.attrs, ib, bw);
          any = true;
        } else {
          warn(c, "unexpected <" + c.name + "> inside a NIC's <pci> skipped");
        }
      }
      if (!any) {
        TopoNode nic;
        nic.type = NodeType::kNic;
        nic.parent = parent;
        nic.busid = busid;
        nic.attrs = el.attrs;
        nic.is_ib = ib;
        nic.name = busid;
        nic.net_bw = bw;  // unknown port speed: the PCI link bounds it
        int id = add_node(std::move(nic));
        g_.add_link(id, parent, LinkType::kPci, bw);
      }
      return;
    }
    if (cls == kClassBridge || has_pci_children) {
      n.type = NodeType::kPciSwitch;
      int id = add_node(std::move(n));
      g_.add_link(id, parent, LinkType::kPci, bw);
      for (const XmlElement& c : el.children) {
        if (c.name == "pci") import_pci(c, id);
        else if (c.name == "nic") import_nic(c, id, "", {});
        else warn(c, "unknown element <" + c.name + "> under a PCI switch skipped");
      }
      if (cls != kClassBridge && static_cast<int>(g_.nodes.size()) == id + 1) {
        // Only its children made it a switch, and none survived: drop it, so
        // that what we export (a childless non-bridge) re-imports the same.
        warn(el, "<pci busid=\"" + busid + "\"> is not a bridge and has no usable children; skipped");
        g_.nodes.pop_back();
        g_.links.pop_back();
      }
      return;
    }
    // Other devices (storage, NVSwitch management functions, ...) do not
    // carry collective traffic; they are dropped without a warning. Their
    // busid stays reserved so a duplicate still warns.
  }

  void import_gpu(const XmlElement& el, int gpu) {
    TopoNode& n = g_.nodes[gpu];
    n.dev_attrs = el.attrs;
    long x = 0;
    if (const std::string* v = el.attr("sm")) {
      if (parse_long(*v, 10, 1000, x)) n.sm = static_cast<int>(x);
      else warn(el, "<gpu> sm '" + *v + "' invalid; ignored");
    }
    if (const std::string* v = el.attr("dev")) {
      if (!parse_long(*v, 0, 65535, x)) warn(el, "<gpu> dev '" + *v + "' invalid; ignored");
    }
    for (const XmlElement& c : el.children) {
      if (c.name != "nvlink") {
        warn(c, "unknown element <" + c.name + "> under <gpu> skipped");
        continue;
      }
      const std::string* target = c.attr("target");
      const std::string* count = c.attr("count");
      std::string tb;
      long cnt = 0;
      if (count == nullptr || !parse_long(*count, 1, kMaxNvLinks, cnt)) {
        warn(c, "<nvlink> count missing or outside 1.." + std::to_string(kMaxNvLinks) + "; skipped");
        continue;
      }
      NvLinkPeer peer = NvLinkPeer::kGpu;  // no tclass: a GPU, as in hand-written files
      if (const std::string* t = c.attr("tclass")) {
        long tclass = parse_class24(*t);
        if (tclass < 0) {
          warn(c, "<nvlink> tclass '" + *t + "' malformed (expected 0x and 6 hex digits, e.g. 0x068000); skipped");
          continue;
        }
        peer = nvlink_peer_of(tclass);
      }
      if (target == nullptr) {
        warn(c, "<nvlink> without a target skipped");
        continue;
      }
      if (!normalize_busid(*target, tb)) {
        // Inside a VM NVML cannot see the far end of an NVLink and NCCL
        // writes this sentinel with tclass 0x068000 (an NVSwitch is assumed).
        // Only a GPU target needs a real bus id.
        if (peer != NvLinkPeer::kGpu && is_vm_nvlink_sentinel(*target)) {
          tb = kVmNvLinkSentinel;
        } else {
          warn(c, "<nvlink> target '" + *target + "' is not a PCI bus id; skipped");
          continue;
        }
      }
      nvlinks_.push_back({gpu, tb, static_cast<int>(cnt), peer, c.line});
    }
  }

  void import_nic(const XmlElement& el, int parent, const std::string& busid, const AttrList& pci_attrs,
                  bool ib = false, double pci_bw = 0) {
    // from_net: a <net> element (NCCL's network device); else Loom's shorthand
    // of a NIC <pci> or <nic> without one.
    auto make = [&](const AttrList& net_attrs, const XmlElement& where, bool from_net) {
      TopoNode nic;
      nic.from_net = from_net;
      nic.type = NodeType::kNic;
      nic.parent = parent;
      nic.busid = busid;
      nic.attrs = pci_attrs;
      nic.dev_attrs = net_attrs;
      nic.is_ib = ib;
      XmlElement tmp;
      tmp.attrs = net_attrs;
      if (const std::string* v = tmp.attr("name")) nic.name = *v;
      double speed = 0, lat = 0;
      if (const std::string* v = tmp.attr("speed")) {
        bool number = parse_real(*v, -1e7, 1e7, speed);
        if (number && speed >= 1) {
          nic.net_bw = speed / 8000.0;  // Mb/s -> GB/s
          nic.speed_known = true;
        } else if (!number || speed > 0) {
          // -1 and 0 are how sysfs and NICs say "unknown": not worth a warning.
          warn(where, "<net> speed '" + *v + "' outside 1..1e7 Mb/s; assuming 10 Gb/s as NCCL does");
        }
      }
      if (const std::string* v = tmp.attr("latency")) {
        if (parse_real(*v, 0, 1e6, lat)) nic.net_latency_us = lat;
        else warn(where, "<net> latency '" + *v + "' outside 0..1e6 us; ignored");
      }
      if (nic.name.empty()) nic.name = busid.empty() ? "nic" : busid;
      if (!nic.speed_known && from_net) {
        nic.net_bw = kUnknownNetMbps / 8000.0;
        notes_.push_back(source_ + ": line " + std::to_string(where.line) + ": NIC " + nic.name +
                         ": <net> without a usable speed; assuming 10 Gb/s as NCCL does");
      } else if (!nic.speed_known) {
        nic.net_bw = pci_bw > 0 ? pci_bw : kDefaultPciBw;  // no <net>: the PCI link bounds it
      }
      // RoCE and IB ports both use verbs; a name like mlx5_* marks a verbs device.
      if (nic.name.rfind("mlx", 0) == 0 || nic.name.rfind("ib", 0) == 0) nic.is_ib = true;
      int id = add_node(std::move(nic));
      g_.add_link(id, parent, LinkType::kPci, busid.empty() ? g_.nodes[id].net_bw : pci_bw);
    };
    bool any = false;
    for (const XmlElement& c : el.children) {
      if (c.name == "net") {
        make(c.attrs, c, true);
        any = true;
      } else {
        warn(c, "unknown element <" + c.name + "> under <nic> skipped");
      }
    }
    if (!any) make({}, el, false);
  }

  void finish() {
    // NUMA of every node = its root CPU.
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      int cpu = g_.root_cpu(static_cast<int>(i));
      if (cpu >= 0) g_.nodes[i].numa_id = g_.nodes[cpu].numa_id;
    }
    resolve_nvlinks();
    assign_indices();
    // SMP interconnect: CPUs (sockets / NUMA nodes) are fully connected.
    std::vector<int> cpus;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      if (g_.nodes[i].type == NodeType::kCpu) cpus.push_back(static_cast<int>(i));
    }
    for (size_t i = 0; i < cpus.size(); ++i) {
      for (size_t j = i + 1; j < cpus.size(); ++j) {
        const TopoNode& a = g_.nodes[cpus[i]];
        const TopoNode& b = g_.nodes[cpus[j]];
        double bw = std::min(smp_bw(a.vendor, a.family, a.model), smp_bw(b.vendor, b.family, b.model));
        g_.add_link(cpus[i], cpus[j], LinkType::kSmp, bw);
      }
    }
  }

  void resolve_nvlinks() {
    int nvs = -1;
    std::set<std::pair<int, int>> seen;
    // (gpu, far-end bus id) of the NVSwitch and CPU links already read.
    std::set<std::pair<int, std::string>> fold_targets;
    // Adds lanes to the GPU's one link to `to` (NCCL aggregates them too).
    auto add_lanes = [&](const PendingNvLink& p, int to, double lane) {
      if (!seen.insert({p.gpu, to}).second) {
        for (TopoLink& l : g_.links)
          if (l.type == LinkType::kNvLink && ((l.a == p.gpu && l.b == to) || (l.a == to && l.b == p.gpu))) {
            l.bw += lane * p.count;
            l.count += p.count;
          }
        return;
      }
      g_.add_link(p.gpu, to, LinkType::kNvLink, lane * p.count, 0, p.count);
      g_.links.back().target = p.target;
    };
    for (const PendingNvLink& p : nvlinks_) {
      XmlElement where;
      where.line = p.line;
      double lane = nvlink_lane_bw(g_.nodes[p.gpu].sm);
      if (p.peer != NvLinkPeer::kGpu) {
        const bool to_cpu = p.peer == NvLinkPeer::kCpu;
        // NCCL's dumps list one <nvlink> per far-end device (each NVSwitch,
        // each of a POWER9 CPU's NVLink ports): their lanes add up on the one
        // link. The same device listed twice is an error.
        if (!fold_targets.insert({p.gpu, p.target}).second) {
          warn(where, "second <nvlink> from " + g_.nodes[p.gpu].busid + " to " + (to_cpu ? "CPU port " : "NVSwitch ") +
                          p.target + " ignored");
          continue;
        }
        int to = -1;
        if (to_cpu) {
          // tclass 0x068001: NVLink between the GPU and its own CPU (POWER9).
          to = g_.root_cpu(p.gpu);
          if (to < 0) continue;  // cannot happen: every GPU hangs under a CPU
        } else {
          // NCCL folds all NVSwitches of a host into one node; so do we.
          if (nvs < 0) {
            TopoNode s;
            s.type = NodeType::kNvSwitch;
            s.busid = p.target;
            s.name = "NVS";
            nvs = add_node(std::move(s));
          }
          to = nvs;
        }
        add_lanes(p, to, lane);
        continue;
      }
      int peer = g_.find_busid(p.target, NodeType::kGpu);
      if (peer < 0 || peer == p.gpu) {
        warn(where, "<nvlink> target " + p.target + " is not another GPU in this file; skipped");
        continue;
      }
      auto key = std::minmax(p.gpu, peer);
      if (!seen.insert(key).second) continue;  // both ends list the same link
      g_.add_link(p.gpu, peer, LinkType::kNvLink, lane * p.count, 0, p.count);
    }
  }

  void assign_indices() {
    for (NodeType t : {NodeType::kCpu, NodeType::kPciSwitch, NodeType::kGpu, NodeType::kNic, NodeType::kNvSwitch}) {
      std::vector<int> ids;
      for (size_t i = 0; i < g_.nodes.size(); ++i) {
        if (g_.nodes[i].type == t) ids.push_back(static_cast<int>(i));
      }
      auto dev_of = [&](int id) {
        XmlElement tmp;
        tmp.attrs = g_.nodes[id].dev_attrs;
        long d = -1;
        const std::string* v = tmp.attr("dev");
        if (v == nullptr || !parse_long(*v, 0, 65535, d)) return -1L;
        return d;
      };
      bool all_dev = (t == NodeType::kGpu || t == NodeType::kNic) && !ids.empty() &&
                     std::all_of(ids.begin(), ids.end(), [&](int id) { return dev_of(id) >= 0; });
      // GPUs: CUDA device order when the file gives it (dev), else PCI bus
      // order (CUDA_DEVICE_ORDER=PCI_BUS_ID, the order nvidia-smi prints).
      std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) {
        if (all_dev) return dev_of(a) < dev_of(b);
        if (t == NodeType::kCpu) return g_.nodes[a].numa_id < g_.nodes[b].numa_id;
        if (t == NodeType::kGpu) return g_.nodes[a].busid < g_.nodes[b].busid;
        return false;  // NICs and switches: document order
      });
      for (size_t i = 0; i < ids.size(); ++i) g_.nodes[ids[i]].index = static_cast<int>(i);
      if (t == NodeType::kCpu || t == NodeType::kGpu) {
        for (int id : ids) {
          if (g_.nodes[id].name.empty()) g_.nodes[id].name = g_.label(id);
        }
      }
    }
  }

  std::string source_;
  TopoGraph g_;
  std::vector<std::string> warnings_;
  std::vector<std::string> notes_;
  std::set<long> numa_seen_;
  int unknown_numa_cpu_ = -1;  // the node of the <cpu numaid="-1"> elements
  static constexpr int kMaxCpus = 256;
  bool cpu_cap_warned_ = false;
  std::set<std::string> busid_seen_;
  std::vector<PendingNvLink> nvlinks_;
};

// ---- export ----

class Exporter {
 public:
  explicit Exporter(const TopoGraph& g) : g_(g) {
    children_.resize(g.nodes.size());
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      if (g.nodes[i].parent >= 0) children_[g.nodes[i].parent].push_back(static_cast<int>(i));
    }
  }

  XmlElement run() {
    XmlElement sys;
    sys.name = "system";
    sys.attrs = {{"version", "1"}};
    // Document (node) order, not index order: NIC and switch indices follow
    // document order, so keeping it makes export -> import an identity.
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      if (g_.nodes[i].type != NodeType::kCpu) continue;
      const int cpu = static_cast<int>(i);
      XmlElement el;
      el.name = "cpu";
      el.attrs = g_.nodes[cpu].attrs;
      if (el.attr("numaid") == nullptr) el.set_attr("numaid", std::to_string(g_.nodes[cpu].numa_id));
      add_children(el, cpu);
      sys.children.push_back(std::move(el));
    }
    return sys;
  }

 private:
  XmlElement pci_element(const TopoNode& n) {
    XmlElement el;
    el.name = "pci";
    el.attrs = n.attrs;
    if (el.attr("busid") == nullptr) el.set_attr("busid", n.busid);
    return el;
  }

  void add_children(XmlElement& parent_el, int parent) {
    std::set<std::string> nic_busids_done;
    for (int c : children_[parent]) {
      const TopoNode& n = g_.nodes[c];
      switch (n.type) {
        case NodeType::kPciSwitch: {
          XmlElement el = pci_element(n);
          add_children(el, c);
          parent_el.children.push_back(std::move(el));
          break;
        }
        case NodeType::kGpu:
          parent_el.children.push_back(gpu_element(c));
          break;
        case NodeType::kNic:
          if (n.busid.empty()) {
            XmlElement nic;
            nic.name = "nic";
            if (n.from_net || !n.dev_attrs.empty()) nic.children.push_back(net_element(n));
            parent_el.children.push_back(std::move(nic));
          } else if (nic_busids_done.insert(n.busid).second) {
            parent_el.children.push_back(nic_pci_element(parent, n.busid));
          }
          break;
        default:
          break;
      }
    }
  }

  XmlElement net_element(const TopoNode& n) {
    XmlElement net;
    net.name = "net";
    net.attrs = n.dev_attrs;
    return net;
  }

  XmlElement nic_pci_element(int parent, const std::string& busid) {
    XmlElement el;
    XmlElement nic;
    nic.name = "nic";
    bool first = true;
    for (int c : children_[parent]) {
      const TopoNode& n = g_.nodes[c];
      if (n.type != NodeType::kNic || n.busid != busid) continue;
      if (first) el = pci_element(n);
      first = false;
      if (n.from_net || !n.dev_attrs.empty()) nic.children.push_back(net_element(n));
    }
    if (!nic.children.empty()) el.children.push_back(std::move(nic));
    return el;
  }

  XmlElement gpu_element(int id) {
    const TopoNode& n = g_.nodes[id];
    XmlElement el = pci_element(n);
    XmlElement gpu;
    gpu.name = "gpu";
    gpu.attrs = n.dev_attrs;
    for (const TopoLink& l : g_.links) {
      if (l.type != LinkType::kNvLink || (l.a != id && l.b != id)) continue;
      const TopoNode& peer = g_.nodes[l.a == id ? l.b : l.a];
      XmlElement nv;
      nv.name = "nvlink";
      const char* tclass = peer.type == NodeType::kNvSwitch ? "0x068000"
                           : peer.type == NodeType::kCpu    ? "0x068001"
                                                            : "0x030200";
      // A CPU has no bus id: its link keeps the NVLink port's from the file.
      nv.attrs = {{"target", peer.type == NodeType::kCpu ? l.target : peer.busid},
                  {"count", std::to_string(l.count)},
                  {"tclass", tclass}};
      gpu.children.push_back(std::move(nv));
    }
    // Link order in the graph depends on which end listed a link first; sort
    // so that exporting a re-imported graph gives the same bytes.
    std::sort(gpu.children.begin(), gpu.children.end(),
              [](const XmlElement& x, const XmlElement& y) { return *x.attr("target") < *y.attr("target"); });
    // Always written (as NCCL does): with a VGA or malformed class, the <gpu>
    // child is what marks the device as a GPU on re-import.
    el.children.push_back(std::move(gpu));
    return el;
  }

  const TopoGraph& g_;
  std::vector<std::vector<int>> children_;
};

}  // namespace

bool parse_cpu_affinity(const std::string& s, std::vector<uint32_t>& words) {
  words.clear();
  if (s.empty() || s.size() > 4096) return false;
  // Comma-separated groups, most significant first; each "0x" + hex (hwloc)
  // or 1-8 hex digits (cpumap). hwloc's single group may be longer than 8
  // digits ("0x00000003ffffffff" from its taskset form); split it in words.
  size_t pos = 0;
  std::vector<uint32_t> msb_first;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string g = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (g.size() > 2 && g[0] == '0' && (g[1] == 'x' || g[1] == 'X')) g = g.substr(2);
    else if (g.size() > 8) return false;
    if (g.empty() || !std::all_of(g.begin(), g.end(), is_hex)) return false;
    std::vector<uint32_t> part;
    for (size_t end = g.size(); end > 0;) {
      size_t begin = end > 8 ? end - 8 : 0;
      part.insert(part.begin(), static_cast<uint32_t>(std::strtoul(g.substr(begin, end - begin).c_str(), nullptr, 16)));
      end = begin;
    }
    msb_first.insert(msb_first.end(), part.begin(), part.end());
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  words.assign(msb_first.rbegin(), msb_first.rend());
  return true;
}

std::string cpumap_string(const std::vector<uint32_t>& words) {
  size_t n = words.size();
  while (n > 1 && words[n - 1] == 0) --n;
  if (n == 0) return "0";
  char buf[16];
  std::snprintf(buf, sizeof buf, "%x", words[n - 1]);
  std::string out = buf;
  for (size_t i = n - 1; i-- > 0;) {
    std::snprintf(buf, sizeof buf, ",%08x", words[i]);
    out += buf;
  }
  return out;
}

Result<ImportResult> graph_from_xml(const XmlElement& root, const std::string& source) {
  Importer imp(source);
  return imp.run(root);
}

Result<ImportResult> graph_from_xml_text(const std::string& text, const std::string& source) {
  auto doc = parse_xml(text);
  if (!doc.is_ok()) return doc.status().with_context(source);
  return graph_from_xml(doc.value(), source);
}

Result<ImportResult> load_topology_file(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(XmlElement doc, read_xml_file(path));
  return graph_from_xml(doc, path);
}

XmlElement graph_to_xml(const TopoGraph& graph) {
  Exporter e(graph);
  return e.run();
}

Status dump_topology_file(const TopoGraph& graph, const std::string& path) {
  return write_xml_file(path, graph_to_xml(graph));
}

}  // namespace loom::topo
