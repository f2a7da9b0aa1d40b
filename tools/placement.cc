#include "placement.h"

#include <algorithm>

#include "algorithms/algorithms.h"
#include "core/config.h"
#include "core/schedule_args.h"
#include "topology/discover.h"

namespace loom::tools {

Result<topo::ImportResult> load_topology(const std::string& file) {
  if (!file.empty()) return topo::load_topology_file(file);
  Result<topo::ImportResult> loaded = topo::load_system_topology();
  if (loaded.is_ok()) topo::dump_system_topology(loaded->graph, -1);  // LOOM_TOPO_DUMP_FILE, as before
  return loaded;
}

int default_nranks(const topo::TopoGraph& g) {
  const int ngpus = g.count(topo::NodeType::kGpu);
  return ngpus > 0 ? ngpus : std::max(2, params::host_cores());
}

std::vector<int> host_of_rank(const topo::RankTopology& rt) {
  std::vector<int> hosts(rt.ranks.size());
  for (size_t r = 0; r < rt.ranks.size(); ++r) hosts[r] = rt.ranks[r].host * rt.ranks_per_host;
  return hosts;
}

CollArgs placed_args(Collective coll, size_t count, DataType dt, const std::vector<int>& hosts, int rank, int root) {
  CollArgs args;
  args.coll = coll;
  args.dt = dt;
  args.op = RedOp::kSum;
  args.count = count;
  args.root = root;
  args.nranks = static_cast<int>(hosts.size());
  args.rank = rank;
  set_job_args(args, hosts);
  return args;
}

std::vector<std::string> runnable(Collective coll, size_t count, DataType dt, const std::vector<int>& hosts) {
  return runnable_algorithms(placed_args(coll, count, dt, hosts, 0));
}

}  // namespace loom::tools
