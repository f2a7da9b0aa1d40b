// NCCL topology XML <-> TopoGraph.
//
// Reads the format NCCL writes with NCCL_TOPO_DUMP_FILE and reads with
// NCCL_TOPO_FILE:
//   <system version="1">
//     <cpu numaid affinity arch vendor familyid modelid>
//       <pci busid class link_speed link_width ...>        (switch: nested <pci>)
//         <pci busid class="0x030200" ...><gpu dev sm ...><nvlink target count tclass/></gpu></pci>
//         <pci busid class="0x020700" ...><nic><net name dev speed latency .../></nic></pci>
//       <nic><net .../></nic>                               (a NIC without PCI info)
// PCI class 0x0604 = bridge/switch, 0x0302 (or 0x03xx with <gpu>) = GPU,
// 0x02xx = NIC (0x0207 = IB).
//
// Contract for bad input: syntax errors, a wrong root, or limits exceeded ->
// a kInvalidArgument Status naming the line. Semantic problems (unknown
// element, missing busid, absurd number, duplicate device) -> a warning naming
// the line (also logged via topo_warn) and the node or attribute is skipped.
// The resulting graph always has at least one CPU node.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/status.h"
#include "topology/graph.h"
#include "topology/xml.h"

namespace loom::topo {

struct ImportResult {
  TopoGraph graph;
  std::vector<std::string> warnings;
  // Defaults applied as NCCL applies them (a <net> without speed is 10 Gb/s),
  // worth an INFO TOPO line: load_system_topology logs them.
  std::vector<std::string> notes;
};

Result<ImportResult> graph_from_xml(const XmlElement& root, const std::string& source);
Result<ImportResult> graph_from_xml_text(const std::string& text, const std::string& source);
Result<ImportResult> load_topology_file(const std::string& path);

// CPU sets in <cpu affinity>. NCCL writes and reads the Linux cpumap form:
// 32-bit hex words, most significant first ("3", "ffffffff,0000ffff"); hwloc
// prints "0x00000003" / "0xffffffff,0x0000ffff" (older Loom dumps). Both
// parse; `words` comes back least significant first. false if neither form.
bool parse_cpu_affinity(const std::string& s, std::vector<uint32_t>& words);
// The cpumap form of `words` (least significant first): "3", "ffff,00000000".
std::string cpumap_string(const std::vector<uint32_t>& words);

// Writes the graph in the same format; re-importing it yields an equal graph
// (TopoGraph::describe() compares equal).
XmlElement graph_to_xml(const TopoGraph& graph);
Status dump_topology_file(const TopoGraph& graph, const std::string& path);

}  // namespace loom::topo
