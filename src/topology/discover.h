// Discovery of this host's topology.
//
// Produces NCCL-format XML (the same tree a topology file holds), so that a
// discovered machine and a loaded file go through one importer and can be
// dumped with LOOM_TOPO_DUMP_FILE. Sources:
//   - hwloc (when built with it): NUMA nodes, CPU vendor/model, the PCI tree
//     (bridges, GPUs = class 0x0302 or NVIDIA 0x0300, NICs = class 0x02xx) and
//     the OS names of network / InfiniBand devices;
//   - sysfs: PCIe link speed/width (max_link_*, see pci_link_attrs),
//     Ethernet speed (/sys/class/net/X/speed),
//     InfiniBand port rate (/sys/class/infiniband/X/ports/N/rate), and virtual
//     interfaces that are up but not on a PCI bus (containers, VMs).
//   - NVML and the CUDA runtime (src/cuda, loaded at run time when present):
//     per GPU its bus id, CUDA index and SM (<gpu dev sm rank gdr>) and its
//     NVLink peers (<nvlink target count tclass>), attached to the GPU's <pci>
//     element, or to a new one under the first CPU when hwloc did not list it.
// Discovery never fails: with nothing found it returns one <cpu numaid="0">.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "loom/status.h"
#include "topology/topo_xml.h"
#include "topology/xml.h"

namespace loom::cuda {
class CudaLoader;
}

namespace loom::topo {

struct DiscoverOptions {
  bool use_hwloc = true;              // false: sysfs only (also the build without hwloc)
  std::string sysfs_root = "/sys";    // tests point this at a fake tree
  const cuda::CudaLoader* cuda = nullptr;  // GPU details from; null = the process-wide loader
};

struct NetInterface {
  std::string name;
  long speed_mbps = 0;  // 0 when the kernel does not know (virtio, veth)
  bool has_device = false;  // backed by a bus device (PCI, virtio)
};

XmlElement discover_host_xml(const DiscoverOptions& options = {});
Result<ImportResult> discover_topology(const DiscoverOptions& options = {});

// Network interfaces under <sysfs_root>/class/net, without lo and without
// interfaces that are down.
std::vector<NetInterface> list_net_interfaces(const std::string& sysfs_root);
// InfiniBand port rate in Mb/s from "<root>/class/infiniband/<dev>/ports/<p>/rate"; 0 if unknown.
long ib_port_rate_mbps(const std::string& sysfs_root, const std::string& dev, int port);

// Appends link_speed/link_width of PCI device `busid` as NCCL reads them:
// max_link_speed/max_link_width (current_* only where max_* is missing) of
// the device and of its upstream port, the smaller of each. Nothing when the
// speed is unknown; link_width "0" when only the width is (read as x16).
void pci_link_attrs(const std::string& sysfs_root, const std::string& busid, AttrList& attrs);

// Whether port `port` of InfiniBand device `dev` is ACTIVE (ports/N/state);
// true when the state cannot be read.
bool ib_port_active(const std::string& sysfs_root, const std::string& dev, int port);
// The <net> discovery writes for Ethernet interface `name`, or nothing when
// it is not up (as list_net_interfaces). A speed the kernel does not know
// (-1: virtio, veth) is taken as 10 Gb/s, as NCCL's socket transport does.
std::optional<XmlElement> ethernet_net_element(const std::string& sysfs_root, const std::string& name, int dev);

// The topology Loom uses: LOOM_TOPO_FILE (else NCCL_TOPO_FILE) when set, else
// discovery. A file that cannot be read is an error, not a silent fallback.
Result<ImportResult> load_system_topology();

// Writes `graph` to LOOM_TOPO_DUMP_FILE (else NCCL_TOPO_DUMP_FILE) when set,
// from one rank only, as NCCL: the rank LOOM_TOPO_DUMP_FILE_RANK (else
// NCCL_TOPO_DUMP_FILE_RANK) names, default 0. rank < 0 (a tool, not a rank of
// a job) always writes. The file is written whole under a temporary name and
// renamed, so readers and concurrent writers never see a mixed file.
void dump_system_topology(const TopoGraph& graph, int rank);

}  // namespace loom::topo
