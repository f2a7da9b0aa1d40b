#include "topology/discover.h"

#include <dirent.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "core/config.h"
#include "core/log.h"
#include "cuda/cuda_loader.h"
#include "cuda/gpu_info.h"
#include "topology/topo_log.h"

#ifdef LOOM_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace loom::topo {
namespace {

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!in || !std::getline(in, s)) return "";
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

bool path_exists(const std::string& p) { return access(p.c_str(), F_OK) == 0; }

std::vector<std::string> list_dir(const std::string& path) {
  std::vector<std::string> out;
  DIR* d = opendir(path.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string machine_arch() {
  utsname u{};
  if (uname(&u) != 0) return "";
  return u.machine;
}

XmlElement net_element(const std::string& name, long speed_mbps, int dev, int port) {
  XmlElement net;
  net.name = "net";
  net.set_attr("name", name);
  net.set_attr("dev", std::to_string(dev));
  if (speed_mbps > 0) net.set_attr("speed", std::to_string(speed_mbps));
  net.set_attr("port", std::to_string(port));
  return net;
}

// <gpu dev sm rank gdr> with its <nvlink target count tclass> children, as
// NCCL writes them. Ranks map to GPUs in CUDA index order (paths.h), so a
// host's rank r is its GPU dev r. All NVSwitch links of a GPU become one
// <nvlink> (count = their sum, target = the first switch): the importer folds
// a host's NVSwitches into one node, as NCCL does, and keeps one link to it.
XmlElement gpu_element(const cuda::GpuInfo& g, bool gdr) {
  XmlElement gpu;
  gpu.name = "gpu";
  gpu.set_attr("dev", std::to_string(g.dev));
  if (g.sm > 0) gpu.set_attr("sm", std::to_string(g.sm));
  gpu.set_attr("rank", std::to_string(g.dev));
  gpu.set_attr("gdr", gdr ? "1" : "0");
  int switch_links = 0;
  std::string first_switch;
  for (const cuda::NvLinkPeer& p : g.links) {
    if (p.nvswitch) {
      switch_links += p.count;
      if (first_switch.empty()) first_switch = p.busid;
      continue;
    }
    XmlElement nv;
    nv.name = "nvlink";
    nv.attrs = {{"target", p.busid}, {"count", std::to_string(p.count)}, {"tclass", "0x030200"}};
    gpu.children.push_back(std::move(nv));
  }
  if (switch_links > 0) {
    XmlElement nv;
    nv.name = "nvlink";
    nv.attrs = {{"target", first_switch}, {"count", std::to_string(switch_links)}, {"tclass", "0x068000"}};
    gpu.children.push_back(std::move(nv));
  }
  return gpu;
}

XmlElement* find_pci(XmlElement& el, const std::string& busid) {
  if (el.name == "pci") {
    std::string b;
    if (const std::string* v = el.attr("busid"); v != nullptr && normalize_busid(*v, b) && b == busid) return &el;
  }
  for (XmlElement& c : el.children) {
    if (XmlElement* f = find_pci(c, busid)) return f;
  }
  return nullptr;
}

// GPU Direct RDMA needs the peer-memory module (nvidia-peermem, or the older
// nv_peer_mem) loaded.
bool gdr_available(const std::string& sysfs_root) {
  return path_exists(sysfs_root + "/module/nvidia_peermem") ||
         path_exists(sysfs_root + "/kernel/mm/memory_peers/nv_mem/version");
}

// NVML's GPUs into the tree: details under the hwloc <pci> element of each,
// or a new <pci> under the first CPU for GPUs hwloc did not list (no hwloc,
// or a container that hides the PCI tree).
void add_nvml_gpus(XmlElement& system, const DiscoverOptions& opt) {
  const cuda::CudaLoader& loader = opt.cuda != nullptr ? *opt.cuda : cuda::CudaLoader::get();
  if (loader.nvml() == nullptr) {
    LOOM_INFO(kLogTopo, "no GPU details: NVML {}", loader.nvml_status());
    return;
  }
  cuda::GpuQuery q = cuda::query_gpus(loader);
  for (const std::string& note : q.notes) topo_warn(note);
  const bool gdr = gdr_available(opt.sysfs_root);
  for (const cuda::GpuInfo& g : q.gpus) {
    XmlElement* pci = find_pci(system, g.busid);
    bool added = pci == nullptr;
    if (added) {
      XmlElement el;
      el.name = "pci";
      el.set_attr("busid", g.busid);
      char id[16];
      el.set_attr("class", "0x030200");
      std::snprintf(id, sizeof id, "0x%04x", g.pci_device_id & 0xffffu);
      el.set_attr("vendor", id);
      std::snprintf(id, sizeof id, "0x%04x", g.pci_device_id >> 16);
      el.set_attr("device", id);
      pci_link_attrs(opt.sysfs_root, g.busid, el.attrs);
      system.children[0].children.push_back(std::move(el));
      pci = &system.children[0].children.back();
    }
    pci->children.push_back(gpu_element(g, gdr));
    int links = 0;
    for (const cuda::NvLinkPeer& p : g.links) links += p.count;
    LOOM_INFO(kLogTopo, "GPU {} at {}: sm {}, {} NVLink(s) to {} peer(s){}", g.dev, g.busid, g.sm, links,
              g.links.size(), added ? " (not in hwloc's PCI tree: placed under the first CPU)" : "");
  }
}

// GT/s at the start of a sysfs link speed ("16.0 GT/s PCIe", "8 GT/s"); 0
// when unknown ("Unknown", "Unknown speed" on older kernels, missing file).
double link_gts(const std::string& speed) {
  char* end = nullptr;
  double v = std::strtod(speed.c_str(), &end);
  return end != speed.c_str() && v > 0 ? v : 0;
}

}  // namespace

void pci_link_attrs(const std::string& sysfs_root, const std::string& busid, AttrList& attrs) {
  // bus/pci/devices/X links to the device's directory, whose parent is its
  // upstream port (or the root complex, which has no link files).
  const std::string dev = sysfs_root + "/bus/pci/devices/" + busid + "/";
  const std::string port = dev + "../";
  // The link's capability, not its state: a GPU idles at 2.5 GT/s, so
  // current_* would make the model depend on the power state at init.
  auto read = [](const std::string& dir, const char* what) {
    std::string v = read_line(dir + "max_" + what);
    return v.empty() ? read_line(dir + "current_" + what) : v;
  };
  std::string speed = read(dev, "link_speed");
  std::string port_speed = read(port, "link_speed");
  double gts = link_gts(speed), port_gts = link_gts(port_speed);
  if (port_gts > 0 && (gts <= 0 || port_gts < gts)) {
    speed = port_speed;
    gts = port_gts;
  }
  if (gts <= 0) return;  // unknown speed: the importer's default
  long width = std::atol(read(dev, "link_width").c_str());
  long port_width = std::atol(read(port, "link_width").c_str());
  if (port_width > 0 && (width <= 0 || port_width < width)) width = port_width;
  // Kept as sysfs writes it ("16.0 GT/s PCIe"), as NCCL does. Width 0 = not
  // known, read as x16 (NCCL's convention).
  attrs.emplace_back("link_speed", speed);
  attrs.emplace_back("link_width", std::to_string(width > 0 ? width : 0));
}

namespace {

#ifdef LOOM_HAVE_HWLOC

using PciAttr = hwloc_obj_attr_u::hwloc_pcidev_attr_s;

std::string busid_of(const PciAttr& p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", static_cast<unsigned>(p.domain), p.bus, p.dev, p.func);
  return buf;
}

bool is_gpu_class(const PciAttr& p) {
  return p.class_id == 0x0302 || (p.class_id == 0x0300 && p.vendor_id == 0x10de);
}
bool is_nic_class(const PciAttr& p) { return (p.class_id >> 8) == 0x02; }

// A PCI tree node collected before it becomes XML.
struct PciTmp {
  AttrList attrs;
  bool bridge = false;
  std::vector<int> children;
  std::vector<XmlElement> extra;  // <gpu>/<nic> children
};

class HwlocDiscovery {
 public:
  explicit HwlocDiscovery(const DiscoverOptions& o) : opt_(o) {}
  ~HwlocDiscovery() {
    if (topo_ != nullptr) hwloc_topology_destroy(topo_);
  }

  bool run(XmlElement& system, std::set<std::string>& nets_seen) {
    if (hwloc_topology_init(&topo_) != 0) return false;
    hwloc_topology_set_io_types_filter(topo_, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(topo_) != 0) return false;
    add_cpus(system);
    if (system.children.empty()) return false;
    add_pci(system, nets_seen);
    return true;
  }

 private:
  void add_cpus(XmlElement& system) {
    std::string vendor, family, model;
    if (hwloc_obj_t pkg = hwloc_get_obj_by_type(topo_, HWLOC_OBJ_PACKAGE, 0)) {
      if (const char* v = hwloc_obj_get_info_by_name(pkg, "CPUVendor")) vendor = v;
      if (const char* v = hwloc_obj_get_info_by_name(pkg, "CPUFamilyNumber")) family = v;
      if (const char* v = hwloc_obj_get_info_by_name(pkg, "CPUModelNumber")) model = v;
    }
    int n = hwloc_get_nbobjs_by_type(topo_, HWLOC_OBJ_NUMANODE);
    for (int i = 0; i < n; ++i) {
      hwloc_obj_t numa = hwloc_get_obj_by_type(topo_, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
      XmlElement cpu;
      cpu.name = "cpu";
      cpu.set_attr("numaid", std::to_string(numa->os_index));
      // NCCL's form, the kernel's cpumap ("ffffffff,0000ffff"); hwloc's own
      // ("0xffffffff,0x0000ffff") only when sysfs has no such file.
      std::string cpus =
          read_line(opt_.sysfs_root + "/devices/system/node/node" + std::to_string(numa->os_index) + "/cpumap");
      if (cpus.empty() && numa->cpuset != nullptr && hwloc_bitmap_last(numa->cpuset) >= 0) {
        constexpr int kUlongBits = static_cast<int>(sizeof(unsigned long) * 8);
        std::vector<uint32_t> words;
        for (int i = 0; i <= hwloc_bitmap_last(numa->cpuset) / kUlongBits; ++i) {
          uint64_t w = hwloc_bitmap_to_ith_ulong(numa->cpuset, static_cast<unsigned>(i));
          for (int b = 0; b < kUlongBits; b += 32) words.push_back(static_cast<uint32_t>(w >> b));
        }
        cpus = cpumap_string(words);
      }
      if (!cpus.empty()) cpu.set_attr("affinity", cpus);
      cpu.set_attr("arch", machine_arch());
      if (!vendor.empty()) cpu.set_attr("vendor", vendor);
      if (!family.empty()) cpu.set_attr("familyid", family);
      if (!model.empty()) cpu.set_attr("modelid", model);
      numa_index_[numa->os_index] = static_cast<int>(system.children.size());
      system.children.push_back(std::move(cpu));
    }
  }

  int cpu_child_for(hwloc_obj_t dev) {
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo_, dev);
    if (anc != nullptr && anc->nodeset != nullptr) {
      int first = hwloc_bitmap_first(anc->nodeset);
      auto it = numa_index_.find(static_cast<unsigned>(first));
      if (first >= 0 && it != numa_index_.end()) return it->second;
    }
    return 0;
  }

  int tmp_for(hwloc_obj_t obj, bool bridge) {
    auto it = tmp_index_.find(obj);
    if (it != tmp_index_.end()) return it->second;
    const PciAttr& p = bridge ? obj->attr->bridge.upstream.pci : obj->attr->pcidev;
    PciTmp t;
    t.bridge = bridge;
    std::string busid = busid_of(p);
    char cls[16];
    std::snprintf(cls, sizeof cls, "0x%04x00", static_cast<unsigned>(p.class_id));
    t.attrs = {{"busid", busid}, {"class", cls}};
    char id[16];
    std::snprintf(id, sizeof id, "0x%04x", static_cast<unsigned>(p.vendor_id));
    t.attrs.emplace_back("vendor", id);
    std::snprintf(id, sizeof id, "0x%04x", static_cast<unsigned>(p.device_id));
    t.attrs.emplace_back("device", id);
    pci_link_attrs(opt_.sysfs_root, busid, t.attrs);
    tmps_.push_back(std::move(t));
    int idx = static_cast<int>(tmps_.size() - 1);
    tmp_index_[obj] = idx;
    return idx;
  }

  // The <nic> of a NIC device: its usable ports. Returns false when the
  // device has network interfaces but none is usable (all down), so that it
  // is left out instead of becoming a nameless NIC of PCI speed.
  bool add_nic_details(PciTmp& t, hwloc_obj_t dev, std::set<std::string>& nets_seen) {
    // Prefer verbs (OpenFabrics) names: that is what the IB transport opens.
    std::vector<XmlElement> ib, eth;
    bool any_osdev = false;
    for (hwloc_obj_t c = dev->io_first_child; c != nullptr; c = c->next_sibling) {
      if (c->type != HWLOC_OBJ_OS_DEVICE || c->name == nullptr) continue;
      std::string name = c->name;
      if (c->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS) {
        any_osdev = true;
        for (const std::string& port : list_dir(opt_.sysfs_root + "/class/infiniband/" + name + "/ports")) {
          int p = std::atoi(port.c_str());
          if (!ib_port_active(opt_.sysfs_root, name, p)) continue;
          ib.push_back(net_element(name, ib_port_rate_mbps(opt_.sysfs_root, name, p), net_dev_++, p));
        }
      } else if (c->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK) {
        any_osdev = true;
        nets_seen.insert(name);
        if (auto net = ethernet_net_element(opt_.sysfs_root, name, net_dev_)) {
          ++net_dev_;
          eth.push_back(std::move(*net));
        }
      }
    }
    XmlElement nic;
    nic.name = "nic";
    nic.children = ib.empty() ? std::move(eth) : std::move(ib);
    if (nic.children.empty()) return !any_osdev;
    t.extra.push_back(std::move(nic));
    return true;
  }

  void add_pci(XmlElement& system, std::set<std::string>& nets_seen) {
    std::map<int, std::vector<int>> roots;  // cpu child index -> top tmp nodes
    for (hwloc_obj_t dev = hwloc_get_next_pcidev(topo_, nullptr); dev != nullptr;
         dev = hwloc_get_next_pcidev(topo_, dev)) {
      const PciAttr& p = dev->attr->pcidev;
      bool gpu = is_gpu_class(p), nic = is_nic_class(p);
      if (!gpu && !nic) continue;
      // GPU details (<gpu>, <nvlink>) are added from NVML by add_nvml_gpus.
      PciTmp nic_details;
      if (!gpu && !add_nic_details(nic_details, dev, nets_seen)) {
        LOOM_INFO(kLogTopo, "NIC {}: no interface or port of it is up; left out", busid_of(p));
        continue;
      }
      int leaf = tmp_for(dev, false);
      for (XmlElement& e : nic_details.extra) tmps_[leaf].extra.push_back(std::move(e));
      // Walk up through PCI-to-PCI bridges; host bridges end the chain.
      int child = leaf;
      hwloc_obj_t up = dev->parent;
      while (up != nullptr && up->type == HWLOC_OBJ_BRIDGE && up->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_PCI) {
        bool existed = tmp_index_.count(up) != 0;
        int b = tmp_for(up, true);
        tmps_[b].children.push_back(child);
        child = b;
        if (existed) break;
        up = up->parent;
      }
      if (child == leaf || up == nullptr || up->type != HWLOC_OBJ_BRIDGE ||
          up->attr->bridge.upstream_type != HWLOC_OBJ_BRIDGE_PCI) {
        // `child` is a new top of a chain (or the device itself).
        std::vector<int>& r = roots[cpu_child_for(dev)];
        if (std::find(r.begin(), r.end(), child) == r.end()) r.push_back(child);
      }
    }
    for (auto& [cpu, tops] : roots) {
      for (int t : tops) system.children[static_cast<size_t>(cpu)].children.push_back(to_xml(t, false));
    }
  }

  // Downstream ports of a switch (a bridge under a bridge with a single
  // child) are folded into the switch, as NCCL's dumps show one <pci> per
  // switch: a GPU and a NIC on one switch are then one hop apart (PIX).
  XmlElement to_xml(int idx, bool parent_is_bridge) {
    PciTmp& t = tmps_[idx];
    if (t.bridge && parent_is_bridge && t.children.size() == 1) return to_xml(t.children[0], true);
    XmlElement el;
    el.name = "pci";
    el.attrs = t.attrs;
    for (int c : t.children) el.children.push_back(to_xml(c, t.bridge));
    for (XmlElement& e : t.extra) el.children.push_back(std::move(e));
    return el;
  }

  DiscoverOptions opt_;
  hwloc_topology_t topo_ = nullptr;
  std::map<unsigned, int> numa_index_;
  std::map<hwloc_obj_t, int> tmp_index_;
  std::vector<PciTmp> tmps_;
  int net_dev_ = 0;
};

#endif  // LOOM_HAVE_HWLOC

// Fallback without hwloc: NUMA nodes from sysfs (no PCI tree).
void sysfs_cpus(const DiscoverOptions& opt, XmlElement& system) {
  for (const std::string& n : list_dir(opt.sysfs_root + "/devices/system/node")) {
    if (n.rfind("node", 0) != 0 || n.size() <= 4) continue;
    XmlElement cpu;
    cpu.name = "cpu";
    cpu.set_attr("numaid", n.substr(4));
    std::string cpus = read_line(opt.sysfs_root + "/devices/system/node/" + n + "/cpumap");
    if (!cpus.empty()) cpu.set_attr("affinity", cpus);
    cpu.set_attr("arch", machine_arch());
    system.children.push_back(std::move(cpu));
  }
}

const char* env_either(const char* loom_name, const char* nccl_name) {
  const char* v = std::getenv(loom_name);
  if (v != nullptr && *v != '\0') return v;
  v = std::getenv(nccl_name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

}  // namespace

std::vector<NetInterface> list_net_interfaces(const std::string& sysfs_root) {
  std::vector<NetInterface> out;
  for (const std::string& name : list_dir(sysfs_root + "/class/net")) {
    std::string base = sysfs_root + "/class/net/" + name;
    if (name == "lo" || read_line(base + "/operstate") != "up") continue;
    NetInterface ni;
    ni.name = name;
    long s = std::atol(read_line(base + "/speed").c_str());
    ni.speed_mbps = s > 0 ? s : 0;
    ni.has_device = path_exists(base + "/device");
    out.push_back(ni);
  }
  return out;
}

long ib_port_rate_mbps(const std::string& sysfs_root, const std::string& dev, int port) {
  // "200 Gb/sec (4X HDR)" or "2.5 Gb/sec (1X SDR)".
  std::string rate = read_line(sysfs_root + "/class/infiniband/" + dev + "/ports/" + std::to_string(port) + "/rate");
  double gbps = std::atof(rate.c_str());
  return gbps > 0 ? static_cast<long>(gbps * 1000.0) : 0;
}

bool ib_port_active(const std::string& sysfs_root, const std::string& dev, int port) {
  // "4: ACTIVE", "1: DOWN", "2: INIT"; unreadable = not known to be unusable.
  std::string state = read_line(sysfs_root + "/class/infiniband/" + dev + "/ports/" + std::to_string(port) + "/state");
  if (state.empty() || state.find("ACTIVE") != std::string::npos) return true;
  LOOM_INFO(kLogTopo, "InfiniBand port {}:{} is '{}', not ACTIVE; left out", dev, port, state);
  return false;
}

namespace {
// Speed for an Ethernet interface whose speed the kernel does not know (-1
// or no file: virtio, veth): NCCL's socket transport assumes 10 Gb/s, so do
// we, rather than let the PCI link (126 Gb/s for virtio) stand for it.
constexpr long kUnknownEthernetMbps = 10000;
long ethernet_speed_mbps(const std::string& sysfs_root, const std::string& name, long known_mbps) {
  if (known_mbps > 0) return known_mbps;
  LOOM_INFO(kLogTopo, "NIC {}: the kernel does not know its speed ({}/class/net/{}/speed is '{}'); assuming 10 Gb/s as NCCL does",
            name, sysfs_root, name, read_line(sysfs_root + "/class/net/" + name + "/speed"));
  return kUnknownEthernetMbps;
}
}  // namespace

std::optional<XmlElement> ethernet_net_element(const std::string& sysfs_root, const std::string& name, int dev) {
  const std::string base = sysfs_root + "/class/net/" + name;
  const std::string state = read_line(base + "/operstate");
  if (state != "up") {
    LOOM_INFO(kLogTopo, "NIC {}: operstate '{}', not up; left out", name, state);
    return std::nullopt;
  }
  long speed = std::atol(read_line(base + "/speed").c_str());
  return net_element(name, ethernet_speed_mbps(sysfs_root, name, speed), dev, 1);
}

XmlElement discover_host_xml(const DiscoverOptions& options) {
  XmlElement system;
  system.name = "system";
  system.set_attr("version", "1");
  std::set<std::string> nets_seen;
  bool done = false;
#ifdef LOOM_HAVE_HWLOC
  if (options.use_hwloc) {
    HwlocDiscovery h(options);
    done = h.run(system, nets_seen);
    if (!done) {
      topo_warn("hwloc found no NUMA node; falling back to sysfs");
      system.children.clear();
      nets_seen.clear();
    }
  }
#endif
  if (!done) sysfs_cpus(options, system);
  if (system.children.empty()) {
    XmlElement cpu;
    cpu.name = "cpu";
    cpu.set_attr("numaid", "0");
    cpu.set_attr("arch", machine_arch());
    system.children.push_back(std::move(cpu));
  }
  add_nvml_gpus(system, options);
  // Interfaces that are up but were not found on the PCI tree (virtual NICs
  // of containers and VMs, or every NIC without hwloc) still carry socket
  // traffic; they hang directly under the first CPU.
  int dev = 1000;  // distinct from PCI NIC device numbers
  for (const NetInterface& ni : list_net_interfaces(options.sysfs_root)) {
    if (nets_seen.count(ni.name) != 0) continue;
    XmlElement nic;
    nic.name = "nic";
    nic.children.push_back(net_element(ni.name, ethernet_speed_mbps(options.sysfs_root, ni.name, ni.speed_mbps), dev++, 1));
    system.children[0].children.push_back(std::move(nic));
  }
  return system;
}

Result<ImportResult> discover_topology(const DiscoverOptions& options) {
  char host[256] = "unknown";
  gethostname(host, sizeof host - 1);
  return graph_from_xml(discover_host_xml(options), std::string("discovered on ") + host);
}

Result<ImportResult> load_system_topology() {
  if (const char* file = env_either("LOOM_TOPO_FILE", "NCCL_TOPO_FILE")) {
    Result<ImportResult> r = load_topology_file(file);
    if (r.is_ok())
      for (const std::string& note : r.value().notes) LOOM_INFO(kLogTopo, "{}", note);
    return r;
  }
  return discover_topology();
}

void dump_system_topology(const TopoGraph& graph, int rank) {
  const char* dump = env_either("LOOM_TOPO_DUMP_FILE", "NCCL_TOPO_DUMP_FILE");
  if (dump == nullptr) return;
  if (rank >= 0) {
    // The shared reader (a malformed value: WARN ENV once, rank 0), under
    // whichever of the two names is set (LOOM_ first).
    const char* name = std::getenv("LOOM_TOPO_DUMP_FILE_RANK") ? "LOOM_TOPO_DUMP_FILE_RANK" : "NCCL_TOPO_DUMP_FILE_RANK";
    if (rank != env_int(name, 0, 0, INT32_MAX)) return;
  }
  Status st = dump_topology_file(graph, dump);
  if (!st.is_ok()) {
    topo_warn("topology dump failed: " + st.to_string());
  } else {
    LOOM_INFO(kLogTopo, "topology written to {}{}", dump, rank >= 0 ? " by rank " + std::to_string(rank) : "");
  }
}

}  // namespace loom::topo
