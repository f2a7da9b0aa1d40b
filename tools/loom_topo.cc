// loom-topo: shows what Loom sees and what it would choose.
//
// Prints the topology (discovered, or loaded with --topo-file / LOOM_TOPO_FILE)
// as a tree, the rank-to-rank path matrix, the transport per peer with its
// reason, and the algorithm selection table per collective and size (chosen
// algorithm, predicted time, runner-up). LOOM_ALGO and LOOM_TUNER_PLUGIN are
// honoured, so the effect of an override can be seen before running a job.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "loom/types.h"
#include "placement.h"
#include "topology/algo_override.h"
#include "topology/paths.h"
#include "topology/topo_xml.h"
#include "topology/transport_select.h"
#include "topology/tuner.h"

using namespace loom;
using namespace loom::topo;
using nlohmann::json;

namespace {

struct Args {
  std::string topo_file;
  std::string dump_file;
  int nranks = 0;
  int ranks_per_host = 0;
  bool json = false;
  bool estimates = false;        // --estimates: every algorithm's model estimate, CSV
  std::vector<size_t> sizes;     // --sizes: for --estimates (default: the selection table's)
  double round_across_us = -1;   // --hand-off: the probe's rounds, as the TUNE log prints them
  double round_within_us = -1;
};

void usage(FILE* out) {
  std::fprintf(out,
               "usage: loom-topo [--topo-file F] [--nranks N] [--ranks-per-host R] [--dump F] [--json] [--help]\n"
               "  --topo-file F       read NCCL-format topology XML instead of discovering this host\n"
               "                      (default: LOOM_TOPO_FILE or NCCL_TOPO_FILE when set)\n"
               "  --nranks N          ranks to place (default: one per GPU, else one per core, at least 2)\n"
               "  --ranks-per-host R  ranks per host (default: number of GPUs; more ranks => more hosts)\n"
               "  --dump F            also write the topology as XML to F\n"
               "  --json              machine-readable output\n"
               "  --estimates         instead: the cost model's estimate for every collective, size and\n"
               "                      algorithm, as CSV (collective,bytes,algorithm,predicted_us,chunk_bytes)\n"
               "  --sizes LIST        sizes for --estimates (8,4K,1M; bytes as in the perf tables)\n"
               "  --hand-off A,W      for --estimates with more ranks than cores: the hand-off probe's round\n"
               "                      times in us, across cores and within one, as a job's TUNE log prints\n"
               "                      them ('a round 9.15 us across cores, 16.12 us within one'), so the\n"
               "                      estimates are the ones that job's tuner weighed\n"
               "Environment: LOOM_ALGO (override, e.g. allreduce:0-64K:hypercube,64K-:ring), LOOM_TUNER_PLUGIN.\n");
}

bool parse_int(const char* s, int lo, int hi, int& out) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) return false;
  out = static_cast<int>(v);
  return true;
}

std::string bw_text(double bw) {
  if (std::isinf(bw)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", bw);
  return b;
}

std::string node_line(const TopoGraph& g, int id) {
  const TopoNode& n = g.nodes[static_cast<size_t>(id)];
  std::string s = g.label(id);
  switch (n.type) {
    case NodeType::kCpu:
      s += " numa " + std::to_string(n.numa_id);
      if (!n.vendor.empty()) s += " " + n.vendor;
      if (!n.arch.empty()) s += " " + n.arch;
      break;
    case NodeType::kGpu:
      s += " " + n.busid;
      if (n.sm > 0) s += " sm" + std::to_string(n.sm);
      break;
    case NodeType::kNic:
      s += " " + n.name + (n.busid.empty() || n.busid == n.name ? "" : " " + n.busid);
      s += n.is_ib ? " verbs" : " ethernet";
      s += " " + bw_text(n.net_bw) + " GB/s";
      if (!n.speed_known) s += n.from_net ? " (speed unknown: 10 Gb/s as NCCL)" : " (speed unknown: PCI bound)";
      break;
    default:
      break;
  }
  for (const TopoLink& l : g.links) {
    if (l.type == LinkType::kPci && ((l.a == id && l.b == n.parent) || (l.b == id && l.a == n.parent))) {
      s += "  [PCI " + bw_text(l.bw) + " GB/s]";
    }
  }
  return s;
}

void print_tree(const TopoGraph& g, int id, int depth) {
  std::printf("%*s%s\n", 2 + depth * 2, "", node_line(g, id).c_str());
  for (size_t c = 0; c < g.nodes.size(); ++c) {
    if (g.nodes[c].parent == id) print_tree(g, static_cast<int>(c), depth + 1);
  }
}

const std::vector<size_t>& table_sizes() {
  static const std::vector<size_t> kSizes = {8, 256, 4096, 32768, 262144, 1u << 21, 1u << 24, 1u << 27, 1u << 30};
  return kSizes;
}

// Ranks whose pairwise paths are printed (text) or written (JSON).
constexpr int kTextMatrixRanks = 64;
constexpr int kJsonMatrixRanks = 256;

// The algorithms a job offers the tuner for this call (CommImpl::schedule_for):
// the registered ones that accept it (Algorithm::supports), rank 0's view of
// a float sum of `bytes` as the perf tables count them (all_gather's output,
// reduce_scatter's input, all_to_all's send buffer: nranks blocks). The
// model also prices kinds no schedule implements (a direct reduce_scatter);
// a job never picks those, so neither does this tool.
std::vector<std::string> runnable(Collective coll, size_t bytes, const RankTopology& rt) {
  const DataType dt = DataType::kFloat32;
  const size_t count = bytes / dtype_size(dt) / (bytes_are_blocks(coll) ? static_cast<size_t>(std::max(rt.nranks, 1)) : 1);
  return tools::runnable(coll, count, dt, tools::host_of_rank(rt));
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto next = [&](const char* what) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "loom-topo: %s needs a value\n", what);
        std::exit(2);
      }
      return argv[++i];
    };
    if (s == "--help" || s == "-h") {
      usage(stdout);
      return 0;
    } else if (s == "--topo-file") {
      a.topo_file = next("--topo-file");
    } else if (s == "--dump") {
      a.dump_file = next("--dump");
    } else if (s == "--json") {
      a.json = true;
    } else if (s == "--estimates") {
      a.estimates = true;
    } else if (s == "--sizes") {
      const char* list = next("--sizes");
      if (!parse_bytes_list(list, &a.sizes)) {
        std::fprintf(stderr, "loom-topo: bad size in --sizes '%s'\n", list);
        return 2;
      }
    } else if (s == "--hand-off") {
      const char* v = next("--hand-off");
      char* end = nullptr;
      a.round_across_us = std::strtod(v, &end);
      if (end == v || *end != ',') {
        std::fprintf(stderr, "loom-topo: --hand-off wants ACROSS_US,WITHIN_US, got '%s'\n", v);
        return 2;
      }
      const char* w = end + 1;
      a.round_within_us = std::strtod(w, &end);
      if (end == w || *end != '\0' || a.round_across_us < 0 || a.round_within_us < 0) {
        std::fprintf(stderr, "loom-topo: --hand-off wants ACROSS_US,WITHIN_US, got '%s'\n", v);
        return 2;
      }
    } else if (s == "--nranks") {
      if (!parse_int(next("--nranks"), 1, 4096, a.nranks)) {
        std::fprintf(stderr, "loom-topo: --nranks must be 1..4096\n");
        return 2;
      }
    } else if (s == "--ranks-per-host") {
      if (!parse_int(next("--ranks-per-host"), 1, 4096, a.ranks_per_host)) {
        std::fprintf(stderr, "loom-topo: --ranks-per-host must be 1..4096\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "loom-topo: unknown argument '%s'\n", s.c_str());
      usage(stderr);
      return 2;
    }
  }

  Result<ImportResult> loaded = tools::load_topology(a.topo_file);
  if (!loaded.is_ok()) {
    std::fprintf(stderr, "loom-topo: %s\n", loaded.status().to_string().c_str());
    return 1;
  }
  TopoGraph& g = loaded.value().graph;
  if (!a.dump_file.empty()) {
    Status st = dump_topology_file(g, a.dump_file);
    if (!st.is_ok()) {
      std::fprintf(stderr, "loom-topo: %s\n", st.to_string().c_str());
      return 1;
    }
  }
  int ngpus = g.count(NodeType::kGpu);
  if (a.nranks == 0) a.nranks = tools::default_nranks(g);
  TunerOptions opts;
  opts.ranks_per_host = a.ranks_per_host;
  auto tuner_r = Tuner::from_env(g, a.nranks, opts);
  if (!tuner_r.is_ok()) {
    std::fprintf(stderr, "loom-topo: %s\n", tuner_r.status().to_string().c_str());
    return 1;
  }
  Tuner& tuner = *tuner_r.value();
  if (a.round_across_us >= 0) {
    Status st = tuner.set_hand_off_rounds(a.round_across_us, a.round_within_us);
    if (!st.is_ok()) {
      std::fprintf(stderr, "loom-topo: %s\n", st.to_string().c_str());
      return 2;
    }
  }
  if (a.estimates) {
    // What the tuner weighs (LOOM_ALGO and plugins aside): for "why this
    // algorithm?" and for checking the model against a measured sweep.
    const RankTopology placed = map_ranks(g, a.nranks, a.ranks_per_host);
    std::printf("collective,bytes,algorithm,predicted_us,chunk_bytes\n");
    for (int ci = 0; ci < kNumCollectives; ++ci) {
      const Collective coll = static_cast<Collective>(ci);
      for (size_t bytes : a.sizes.empty() ? table_sizes() : a.sizes) {
        const std::vector<std::string> names = runnable(coll, bytes, placed);
        for (const Estimate& e : tuner.estimate_all(coll, bytes, a.nranks))
          if (std::find(names.begin(), names.end(), algo_name(e.algo)) != names.end())
            std::printf("%s,%zu,%s,%.3f,%zu\n", collective_name(coll), bytes, algo_name(e.algo), e.us, e.chunk_bytes);
      }
    }
    return 0;
  }
  RankTopology rt = map_ranks(g, a.nranks, a.ranks_per_host);
  const int n = rt.nranks;

  json j;
  if (!a.json) {
    std::printf("Topology: %s\n", g.source.c_str());
    std::printf("  %d CPU/NUMA, %d PCI switch, %d GPU, %d NIC, %d NVSwitch; %zu warning(s)\n",
                g.count(NodeType::kCpu), g.count(NodeType::kPciSwitch), ngpus, g.count(NodeType::kNic),
                g.count(NodeType::kNvSwitch), loaded.value().warnings.size());
    std::printf("\nTree:\n");
    for (int cpu : g.nodes_of(NodeType::kCpu)) print_tree(g, cpu, 0);
    for (int s : g.nodes_of(NodeType::kNvSwitch)) print_tree(g, s, 0);
    std::printf("\nOther links:\n");
    for (const TopoLink& l : g.links) {
      if (l.type == LinkType::kPci) continue;
      std::printf("  %-6s <-> %-6s %s %s GB/s%s\n", g.label(l.a).c_str(), g.label(l.b).c_str(),
                  link_type_name(l.type), bw_text(l.bw).c_str(),
                  l.type == LinkType::kNvLink ? (" x" + std::to_string(l.count)).c_str() : "");
    }
    std::printf("\nGPU -> NIC affinity:\n");
    std::vector<int> aff = gpu_nic_affinity(g);
    std::vector<int> gpus = g.nodes_of(NodeType::kGpu);
    if (gpus.empty()) std::printf("  (no GPU)\n");
    for (size_t i = 0; i < gpus.size(); ++i) {
      if (aff[i] < 0) {
        std::printf("  %s -> none\n", g.label(gpus[i]).c_str());
        continue;
      }
      Path p = find_path(g, gpus[i], aff[i]);
      std::printf("  %s -> %s %s (%s)\n", g.label(gpus[i]).c_str(), g.label(aff[i]).c_str(),
                  g.nodes[static_cast<size_t>(aff[i])].name.c_str(), describe_path(g, p).c_str());
    }
    std::printf("\nRanks: %d on %d host(s), %d per host\n", n, rt.nhosts, rt.ranks_per_host);
    for (const RankInfo& r : rt.ranks) {
      std::printf("  rank %-3d host %d %s numa %d nic %s\n", r.rank, r.host,
                  r.device >= 0 ? g.label(r.device).c_str() : "cpu", r.cpu >= 0 ? g.nodes[static_cast<size_t>(r.cpu)].numa_id : -1,
                  r.nic >= 0 ? (g.nodes[static_cast<size_t>(r.nic)].name + " (" + path_type_name(r.nic_path.type) + ")").c_str() : "-");
    }
    // The matrix grows as n^2 (4096 ranks: 168 MB of text): the first ranks.
    const int shown = std::min(n, kTextMatrixRanks);
    std::printf("\nPath matrix (type / GB/s)%s:\n       ",
                shown < n ? (" of the first " + std::to_string(shown) + " of " + std::to_string(n) + " ranks").c_str() : "");
    for (int b = 0; b < shown; ++b) std::printf(" %9s", ("r" + std::to_string(b)).c_str());
    std::printf("\n");
    for (int x = 0; x < shown; ++x) {
      std::printf("  r%-4d", x);
      for (int y = 0; y < shown; ++y) {
        const Path& p = rt.path(x, y);
        std::printf(" %9s", (std::string(path_type_name(p.type)) + "/" + bw_text(p.bw)).c_str());
      }
      std::printf("\n");
    }
    std::printf("\nTransport per peer%s:\n", n > 16 ? " (rank 0 only)" : "");
    for (int x = 0; x < (n > 16 ? 1 : n); ++x) {
      for (int y = 0; y < n; ++y) {
        if (x == y) continue;
        TransportChoice t = choose_transport(g, rt, x, y);
        std::printf("  %3d -> %-3d %-8s %s\n", x, y, transport_name(t.kind), t.reason.c_str());
      }
    }
    if (!tuner.override_rules().empty()) std::printf("\nLOOM_ALGO: %s\n", tuner.override_rules().to_string().c_str());
    std::printf("\nSelection (nranks %d):\n  %-15s %8s  %-17s %12s  %-17s %12s %9s %3s  %s\n", n, "collective", "bytes",
                "algorithm", "predicted us", "runner-up", "us", "chunk", "ch", "source");
  } else {
    json nodes = json::array();
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const TopoNode& nd = g.nodes[i];
      nodes.push_back({{"id", i}, {"label", g.label(static_cast<int>(i))}, {"type", node_type_name(nd.type)},
                       {"busid", nd.busid}, {"numa", nd.numa_id}, {"parent", nd.parent}, {"name", nd.name},
                       {"net_bw_GBps", nd.net_bw}, {"ib", nd.is_ib}});
    }
    json links = json::array();
    for (const TopoLink& l : g.links) {
      links.push_back({{"a", l.a}, {"b", l.b}, {"type", link_type_name(l.type)}, {"bw_GBps", l.bw}, {"count", l.count}});
    }
    json ranks = json::array();
    for (const RankInfo& r : rt.ranks) {
      ranks.push_back({{"rank", r.rank}, {"host", r.host}, {"device", r.device}, {"cpu", r.cpu}, {"nic", r.nic}});
    }
    // paths and transports cover the first paths_ranks ranks (n^2 entries:
    // 1024 ranks were 265 MB of JSON and 2.4 GB of memory).
    const int shown = std::min(n, kJsonMatrixRanks);
    json paths = json::array(), transports = json::array();
    for (int x = 0; x < shown; ++x) {
      json row = json::array();
      for (int y = 0; y < shown; ++y) {
        const Path& p = rt.path(x, y);
        row.push_back({{"type", path_type_name(p.type)}, {"bw_GBps", std::isinf(p.bw) ? -1.0 : p.bw}, {"hops", p.hops}});
        if (x != y) {
          TransportChoice t = choose_transport(g, rt, x, y);
          transports.push_back({{"from", x}, {"to", y}, {"transport", transport_name(t.kind)}, {"reason", t.reason}});
        }
      }
      paths.push_back(row);
    }
    j = {{"source", g.source}, {"warnings", loaded.value().warnings}, {"nodes", nodes}, {"links", links},
         {"nranks", n}, {"nhosts", rt.nhosts}, {"ranks", ranks}, {"paths_ranks", shown}, {"paths", paths},
         {"transports", transports},
         {"selection", json::array()}};
  }

  for (int ci = 0; ci < kNumCollectives; ++ci) {
    Collective coll = static_cast<Collective>(ci);
    for (size_t bytes : table_sizes()) {
      const std::vector<std::string> names = runnable(coll, bytes, rt);
      if (names.empty()) continue;
      auto sel = tuner.select(coll, bytes, n, names);
      if (!sel.is_ok()) continue;
      const Selection& s = sel.value();
      if (a.json) {
        j["selection"].push_back({{"collective", collective_name(coll)}, {"bytes", bytes}, {"algorithm", s.algorithm},
                                  {"predicted_us", s.predicted_us}, {"runner_up", s.runner_up},
                                  {"runner_up_us", s.runner_up_us}, {"chunk_bytes", s.chunk_bytes},
                                  {"channels", s.channels}, {"source", s.source}});
      } else {
        std::printf("  %-15s %8s  %-17s %12.2f  %-17s %12.2f %9s %3d  %s\n", collective_name(coll),
                    format_size(bytes).c_str(), s.algorithm.c_str(), s.predicted_us,
                    s.runner_up.empty() ? "-" : s.runner_up.c_str(), s.runner_up_us,
                    format_size(s.chunk_bytes).c_str(), s.channels, s.source.c_str());
      }
    }
  }
  if (a.json) std::printf("%s\n", j.dump(2).c_str());
  return 0;
}
