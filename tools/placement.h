// What loom-topo and loom-sim share: loading the topology (--topo-file or
// this host) and placing N ranks on it (--nranks, --ranks-per-host) the way
// a job would see it, down to the CollArgs its communicator hands
// make_schedule. One copy, so the two tools always agree on a placement.
#pragma once

#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "loom/status.h"
#include "topology/paths.h"
#include "topology/topo_xml.h"

namespace loom::tools {

// `file` when given, else this host's topology (LOOM_TOPO_FILE /
// NCCL_TOPO_FILE, or discovery; then written to LOOM_TOPO_DUMP_FILE as a
// job's rank 0 would).
Result<topo::ImportResult> load_topology(const std::string& file);

// --nranks' default: one rank per GPU, else one per core, at least 2.
int default_nranks(const topo::TopoGraph& g);

// Every rank's host as a communicator numbers them (CollArgs::host_of_rank:
// the lowest rank of the host) for a placement from topo::map_ranks.
std::vector<int> host_of_rank(const topo::RankTopology& rt);

// The CollArgs rank `rank` of that placement hands make_schedule for a call
// of `count` elements (NCCL's per-call count) before the tuner's chunk
// (core/schedule_args.h): a float sum unless dt/op say otherwise.
CollArgs placed_args(Collective coll, size_t count, DataType dt, const std::vector<int>& hosts, int rank,
                     int root = 0);

// The registered algorithms that accept the call on rank 0 (what a job
// offers the tuner: runnable_algorithms).
std::vector<std::string> runnable(Collective coll, size_t count, DataType dt, const std::vector<int>& hosts);

}  // namespace loom::tools
