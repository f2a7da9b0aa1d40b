// The algorithm registry: every algorithm describes itself (name, collective,
// description, what it supports) and generates a RankSchedule. An algorithm
// that cannot serve a request answers NotSupported and the selector moves on.
#pragma once

#include <string>
#include <vector>

#include "algorithms/schedule.h"

namespace loom {

struct Algorithm {
  const char* name;        // "ring", "chain", "direct"
  Collective coll;
  const char* description;
  // Ok if this algorithm can serve args; NotSupported with the reason otherwise.
  Status (*supports)(const CollArgs& args);
  Result<RankSchedule> (*make)(const CollArgs& args);
};

// All registered algorithms, in preference order per collective.
const std::vector<Algorithm>& all_algorithms();
// Algorithms registered for one collective.
std::vector<const Algorithm*> algorithms_for(Collective coll);
const Algorithm* find_algorithm(Collective coll, const std::string& name);
// The registered algorithms that accept `args` (Algorithm::supports), by
// name, in preference order: what a job offers the tuner for the call.
std::vector<std::string> runnable_algorithms(const CollArgs& args);

// Checks args (nranks, rank, root, counts) and builds the schedule with the
// named algorithm, or the first supporting one when name is empty.
Result<RankSchedule> make_schedule(const CollArgs& args, const std::string& algorithm = "");

// Generators (one file per family).
Result<RankSchedule> ring_allreduce(const CollArgs& a);
Result<RankSchedule> ring_reduce_scatter(const CollArgs& a);
Result<RankSchedule> ring_all_gather(const CollArgs& a);
Result<RankSchedule> chain_broadcast(const CollArgs& a);
Result<RankSchedule> chain_reduce(const CollArgs& a);
Result<RankSchedule> direct_all_to_all(const CollArgs& a);
Result<RankSchedule> direct_sendrecv(const CollArgs& a);
Result<RankSchedule> direct_broadcast(const CollArgs& a);
Result<RankSchedule> direct_all_gather(const CollArgs& a);
Result<RankSchedule> pairwise_all_to_all(const CollArgs& a);
// tree.cc
Result<RankSchedule> tree_allreduce(const CollArgs& a);
Result<RankSchedule> tree_broadcast(const CollArgs& a);
Result<RankSchedule> tree_reduce(const CollArgs& a);
Result<RankSchedule> binomial_broadcast(const CollArgs& a);
Result<RankSchedule> binomial_reduce(const CollArgs& a);
// hypercube.cc
Result<RankSchedule> hypercube_allreduce(const CollArgs& a);
Result<RankSchedule> hypercube_all_gather(const CollArgs& a);
Result<RankSchedule> halving_reduce_scatter(const CollArgs& a);
Result<RankSchedule> rabenseifner_allreduce(const CollArgs& a);
Result<RankSchedule> bruck_all_gather(const CollArgs& a);
// direct_reduce.cc
Status one_shot_supports(const CollArgs& a);
Result<RankSchedule> one_shot_allreduce(const CollArgs& a);
Result<RankSchedule> two_shot_allreduce(const CollArgs& a);
// hierarchical.cc
Status hierarchical_supports(const CollArgs& a);
Result<RankSchedule> hierarchical_allreduce(const CollArgs& a);

}  // namespace loom
