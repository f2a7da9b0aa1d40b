// libFuzzer target: arbitrary bytes through the XML reader, the topology
// importer, path search and the exporter. Any crash, sanitizer report or
// round-trip mismatch is a bug.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "topology/paths.h"
#include "topology/topo_xml.h"
#include "topology/xml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bool quiet = [] { return setenv("LOOM_TOPO_QUIET", "1", 1) == 0; }();
  (void)quiet;
  std::string text(reinterpret_cast<const char*>(data), size);
  auto doc = loom::topo::parse_xml(text);
  if (!doc.is_ok()) return 0;
  auto g = loom::topo::graph_from_xml(doc.value(), "fuzz");
  if (!g.is_ok()) return 0;
  const loom::topo::TopoGraph& graph = g.value().graph;
  if (graph.nodes.size() <= 64) {
    for (size_t a = 0; a < graph.nodes.size(); ++a) {
      (void)loom::topo::find_path(graph, static_cast<int>(a), 0);
    }
    (void)loom::topo::map_ranks(graph, 4);
  }
  // Export must re-import to the same graph.
  std::string xml = loom::topo::write_xml(loom::topo::graph_to_xml(graph));
  auto again = loom::topo::graph_from_xml_text(xml, "fuzz");
  if (!again.is_ok() || again.value().graph.describe() != graph.describe()) {
    if (std::getenv("LOOM_FUZZ_DEBUG") != nullptr) {
      std::fprintf(stderr, "--- first import\n%s--- export\n%s--- re-import\n%s\n", graph.describe().c_str(),
                   xml.c_str(), again.is_ok() ? again.value().graph.describe().c_str() : again.status().to_string().c_str());
    }
    std::abort();
  }
  return 0;
}
