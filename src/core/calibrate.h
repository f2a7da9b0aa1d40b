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

// What this communicator measures at init, agreed by one bootstrap allgather
// of each rank's wishes so that all ranks run the same measurements (a rank
// that probes alone would wait for its peers until the deadline):
//  - calibrate (LOOM_TUNE_CALIBRATE): when any rank asks (then every rank
//    calibrates, with a warning when only some asked);
//  - hand_off (LOOM_TUNE_HAND_OFF and more ranks on the host than CPUs):
//    when every rank asks.
//  - probe_algos (LOOM_TUNE_PROBE_ALGOS, with hand_off): when every rank asks.
struct CalibrationRequest {
  bool calibrate = false;
  bool hand_off = false;
  bool probe_algos = false;
};
Result<CalibrationRequest> agree_calibration_request(Bootstrap& boot, CalibrationRequest mine, Deadline deadline);

// Measures and agrees (see above). Every rank of the communicator must call it
// with the same options. nranks == 1 measures the reduction only (alpha and
// bandwidth stay 0).
Result<Calibration> calibrate_comm(Executor& exec, Bootstrap& boot, int rank, int nranks, Deadline deadline,
                                   const CalibrationOptions& options = {});

// Oversubscribed hand-off probe (LOOM_TUNE_HAND_OFF). Every rank exchanges
// 8 B with ring neighbours, `rounds` dependent rounds in a row (send to
// r + d, receive from r - d), for d = 1 (rank r runs on core r mod cores:
// partners on other cores) and d = cores (partners on the same core), `reps`
// times after a warm-up; a rank's figure is its fastest repetition per round.
// The slowest rank's figures are agreed through one bootstrap allgather, so
// every rank gets bit-identical values. Needs nranks > cores >= 1.
struct HandOffProbe {
  double across_us = 0;  // one round, partners on different cores
  double within_us = 0;  // one round, partners on the same core
  double elapsed_ms = 0;
};
Result<HandOffProbe> probe_hand_off(Executor& exec, Bootstrap& boot, int rank, int nranks, int cores,
                                    Deadline deadline, int rounds = 16, int reps = 3);

// Oversubscribed algorithm probe (LOOM_TUNE_PROBE_ALGOS): runs each of
// `scheds` (one collective's schedules by several algorithms, the same list
// on every rank) `blocks` times `per_block` ops in a row, the candidates in
// turns (a, b, c, a, b, c, ...) so that a change of the host's pace between
// blocks moves them alike, after one warm-up op each. A rank's figure per
// candidate is the median over its blocks of the block's time per op; the
// figures are agreed through one bootstrap allgather as the mean over ranks,
// summed in rank order (bit-identical on every rank). Every rank passes the
// same buffers' layout (`bufs`: send, recv; scratch is provided).
struct AlgoProbe {
  std::vector<double> us;  // per candidate, time per op
  double elapsed_ms = 0;
};
Result<AlgoProbe> probe_schedules(Executor& exec, Bootstrap& boot, const std::vector<const RankSchedule*>& scheds,
                                  std::vector<std::byte*> bufs, DataType dt, RedOp op, Deadline deadline,
                                  int blocks = 4, int per_block = 4);

}  // namespace loom
