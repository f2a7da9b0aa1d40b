#include "core/schedule_args.h"

#include <algorithm>
#include <cstdint>

#include "core/config.h"
#include "transport/hybrid_transport.h"

namespace loom {

void set_job_args(CollArgs& args, const std::vector<int>& host_of_rank) {
  args.host_of_rank = host_of_rank;  // hierarchical algorithms need it
  args.oversubscribed = params::oversubscribed(params::ranks_on_host_of(host_of_rank, args.rank, args.nranks));
  // Only settings every rank agrees on (agree_settings), so that a send and
  // its receive mark a message announced alike; a receiver with
  // LOOM_SHM_MAP_SHARED=0 then takes it through the FIFO (its segment says
  // so to both ends).
  auto mode = parse_transport_mode(params::transport());
  const bool shm = mode.is_ok() && *mode != TransportMode::kSocket;
  args.stage_min_bytes = shm ? std::max<uint64_t>(params::shm_announced_min_bytes(), 1) : 0;
  args.stage_cache_bytes =
      shm ? params::broadcast_cache_bytes(params::ranks_on_host_of(host_of_rank, args.rank, args.nranks)) : 0;
}

size_t tuned_chunk_elems(size_t chunk_bytes, DataType dt) {
  if (chunk_bytes == 0 || params::chunk_bytes_if_set()) return 0;
  return std::max<size_t>(1, (chunk_bytes + dtype_size(dt) - 1) / dtype_size(dt));
}

}  // namespace loom
