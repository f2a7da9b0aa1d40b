// Which collectives move every message as a reduced one (shm: one single-copy
// threshold, LOOM_SHM_SINGLE_COPY_BYTES, for the whole op), shared by the
// schedules (RankSchedule::reduced_class, algorithms.cc) and the cost model
// that prices them (topology/cost_model.cc), so the two cannot disagree.
#pragma once

#include "loom/types.h"

namespace loom {

// The reducing collectives, whose stored messages carry what the op has just
// computed or land in scratch to be reduced, and a broadcast of more than 2
// ranks through a tree or chain, whose inner ranks forward what they have
// just received. A 2-rank broadcast, and the direct (star) broadcast at any
// size, forward nothing: the root's buffer keeps the plain threshold (single
// copy from the root's buffer). Measured: docs/performance.md Run 13, 17.
inline bool moves_as_reduced(Collective coll, int nranks, bool direct) {
  return coll == Collective::kAllReduce || coll == Collective::kReduceScatter || coll == Collective::kReduce ||
         (coll == Collective::kBroadcast && nranks > 2 && !direct);
}

}  // namespace loom
