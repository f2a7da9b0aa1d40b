// Cost model calibration by a short measurement (LOOM_TUNE_CALIBRATE=1).
//
// Run once per communicator at the end of CommImpl::create, before the engine
// thread starts (the executor and the transports are still free):
//  - ping-pong between ring neighbours (i, i+1) over the real transports with
//    the executor, pairs in parallel (two or three rounds so that no rank is in
//    two pairs at once), at a small and a large message size; one-way time =
//    round trip / 2, the median over iterations for the small size and the
//    best for the large one;
//      alpha (us) = one-way time of the small message,
//      bandwidth (GB/s) = (large - small) / (t_large - t_small);
//  - the local 2-input reduction (kernels::reduce2, float32 sum) throughput.
// The per-rank results are agreed through one bootstrap allgather and combined
// in rank order (worst link: largest alpha, smallest bandwidth; slowest
// reduction), so every rank computes bit-identical parameters and every
// rank's tuner makes the same choices (different choices would deadlock).
#pragma once

#include <atomic>

#include "bootstrap/bootstrap.h"
#include "core/executor.h"
#include "loom/status.h"

namespace loom {

struct Calibration {
  double alpha_us = 0;     // one-way latency of a small message between ring neighbours (worst pair)
  double bw_GBps = 0;      // bandwidth between ring neighbours (worst pair)
  double reduce_GBps = 0;  // local 2-input reduction throughput (slowest rank), output bytes per second
  double elapsed_ms = 0;   // this rank's wall time for the whole calibration
  int pairs = 0;           // ring neighbour pairs measured
};

struct CalibrationOptions {
  size_t small_bytes = 8;
  size_t large_bytes = size_t{4} << 20;
  int small_iters = 20;  // ping-pongs per pair, after one warm-up
  int large_iters = 3;   // > 0
  size_t reduce_bytes = size_t{4} << 20;
  int reduce_iters = 3;
};

// Whether this communicator calibrates: one bootstrap allgather of each rank's
// request (LOOM_TUNE_CALIBRATE), so all ranks agree even when the variable is
// set on some ranks only (then every rank calibrates, with a warning).
Result<bool> agree_calibration_request(Bootstrap& boot, bool requested, Deadline deadline);

// Measures and agrees (see above). Every rank of the communicator must call it
// with the same options. nranks == 1 measures the reduction only (alpha and
// bandwidth stay 0).
Result<Calibration> calibrate_comm(Executor& exec, Bootstrap& boot, int rank, int nranks, Deadline deadline,
                                   const CalibrationOptions& options = {});

}  // namespace loom
