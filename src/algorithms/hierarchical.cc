// Hierarchical allreduce for communicators spanning several hosts:
//   1. binomial reduce inside each host to its leader (the host's lowest rank),
//   2. recursive-doubling allreduce among the leaders (one rank per host, so
//      only one message per host crosses the network per step),
//   3. binomial broadcast inside each host from the leader.
// It beats a flat algorithm when the inter-host link is much slower than
// shared memory and messages are small to medium: the network carries
// log2(hosts) messages of the full size instead of 2(p-1) ring steps. On one
// host it is just binomial reduce + broadcast, which the cost model rates
// slower than recursive doubling, so it is never picked there; LOOM_ALGO can
// still force it.
//
// Identical bits: leaders finish with identical bits (canonical operand
// order, patterns.h) and the broadcast copies them; the intra-host reduce
// uses a fixed order, so the result is also deterministic run to run.
#include <algorithm>
#include <string>

#include "algorithms/algorithms.h"
#include "algorithms/patterns.h"

namespace loom {

using namespace patterns;

Status hierarchical_supports(const CollArgs& a) {
  if (!a.host_of_rank.empty() && static_cast<int>(a.host_of_rank.size()) != a.nranks)
    return not_supported("hierarchical: host_of_rank has " + std::to_string(a.host_of_rank.size()) +
                         " entries for " + std::to_string(a.nranks) + " ranks");
  return Status::ok();
}

Result<RankSchedule> hierarchical_allreduce(const CollArgs& a) {
  LOOM_RETURN_IF_ERROR(hierarchical_supports(a));
  const int n = a.nranks, r = a.rank;
  if (n == 1) return local_only(a, a.count, "hierarchical");
  RankSchedule s;
  s.algorithm = "hierarchical";
  if (a.count == 0) return s;
  auto host = [&](int i) { return a.host_of_rank.empty() ? 0 : a.host_of_rank[static_cast<size_t>(i)]; };
  std::vector<int> local, leaders;
  std::vector<int> seen;
  for (int i = 0; i < n; ++i) {
    if (host(i) == host(r)) local.push_back(i);
    if (std::find(seen.begin(), seen.end(), host(i)) == seen.end()) {
      seen.push_back(host(i));
      leaders.push_back(i);  // the lowest rank of each host, in rank order
    }
  }
  const int me_local = static_cast<int>(std::find(local.begin(), local.end(), r) - local.begin());
  const bool leader = me_local == 0;
  const BufRef out{kBufRecv, 0};
  s.scratch_count = a.count;
  emit_binomial_reduce(s, local, 0, me_local, {kBufSend, 0}, leader ? out : BufRef{kBufScratch, 0}, a.count);
  if (leader) {
    const int me_leader = static_cast<int>(std::find(leaders.begin(), leaders.end(), r) - leaders.begin());
    emit_recursive_doubling_allreduce(s, leaders, me_leader, out, out, {kBufScratch, 0}, a.count,
                                      a.op == RedOp::kAvg, /*in_place=*/true);
  }
  emit_binomial_bcast(s, local, 0, me_local, out, a.count);
  return s;
}

}  // namespace loom
