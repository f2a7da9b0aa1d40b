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

// Whether the direct broadcast's root stages its buffer of `bytes` in
// scratch for its readers (direct.cc), with ranks sharing cores: from 3
// ranks, from the announced size (stage_min_bytes, 0 = never) and only once
// the op's data, nranks x bytes, outgrows the host's last-level cache
// (cache_bytes, 0 = unknown: from the announced size). Shared by the schedule
// and the cost model that prices it. In cache the FIFOs' pipelined chunks
// are cheaper than readers taking the staged buffer through a mapping (and
// waiting for the root's copy first). Measured, 2 cores, -z 1, us, staged
// direct / best FIFO algorithm, 3 alternated rounds (performance.md Run 36):
// 3 ranks 1 MiB 216-243 / 74-102 (chain), 4 MiB 795-985 / 293-425, 16 MiB
// 1353-2152 / 1425-2195; 4 ranks 4 MiB 874-1178 / 413-559 (binomial),
// 16 MiB 2005-2537 / 1975-3258; 8 ranks 1 MiB 324-343 / 214-252, 8 MiB
// 1707-2023 / 2253-3985, 16 MiB 3849-5530 / 5494-7184.
inline bool stages_broadcast(double bytes, int nranks, double stage_min_bytes, double cache_bytes) {
  return stage_min_bytes > 0 && nranks > 2 && bytes >= stage_min_bytes &&
         (cache_bytes <= 0 || nranks * bytes > cache_bytes);
}

}  // namespace loom
