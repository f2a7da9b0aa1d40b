// The CollArgs a communicator hands make_schedule (CommImpl::schedule_for),
// in one place, so that tools which build schedules without a communicator
// (loom-topo's algorithm lists, loom-sim's schedules) build the very ones a
// job would.
#pragma once

#include <cstddef>
#include <vector>

#include "algorithms/schedule.h"

namespace loom {

// Fills the job's part of `args` for args.rank: host_of_rank (every rank's
// host, named by its lowest rank, as the bootstrap's host hashes give it),
// oversubscribed (more ranks on args.rank's host than this machine's cores),
// and the shm staging settings every rank agrees on (LOOM_TRANSPORT,
// LOOM_SHM_ANNOUNCED_MIN_BYTES, the host's last-level cache).
void set_job_args(CollArgs& args, const std::vector<int>& host_of_rank);

// The pipelining chunk in elements for a tuner selection's chunk_bytes:
// rounded up, so a chunk of a whole block in bytes stays a whole block in
// elements; 0 (the algorithms' default) when LOOM_CHUNK_BYTES pins the chunk
// or the selection names none.
size_t tuned_chunk_elems(size_t chunk_bytes, DataType dt);

}  // namespace loom
