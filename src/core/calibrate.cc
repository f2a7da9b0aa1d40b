#include "core/calibrate.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <vector>

#include "core/log.h"
#include "kernels/host_reduce.h"

namespace loom {
namespace {

using WallClock = std::chrono::steady_clock;

double us_since(WallClock::time_point t0) {
  return std::chrono::duration<double, std::micro>(WallClock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Ring edge i joins ranks i and (i + 1) % p. Edges are coloured so that no
// rank is in two edges of one round: even edges, odd edges, and for odd p the
// closing edge (p-1, 0) alone. Returns -1 for edges not measured (p < 2, and
// the duplicate edge (1, 0) when p == 2).
int edge_round(int i, int p) {
  if (p < 2) return -1;
  if (p == 2) return i == 0 ? 0 : -1;
  if (i == p - 1 && p % 2 == 1) return 2;
  return i % 2;
}

// One ping-pong: the initiator sends `bytes` to the peer and waits for them
// back; the echo side receives and returns them. Two phases each, so the
// reply is only sent once the ping has fully arrived.
RankSchedule ping_pong(bool initiator, int peer, size_t bytes) {
  RankSchedule s;
  s.algorithm = "calibrate";
  Step first, second;
  first.peer = second.peer = peer;
  first.count = second.count = bytes;
  if (initiator) {
    first.kind = StepKind::kSend;
    first.src = {kBufSend, 0};
    second.kind = StepKind::kRecv;
    second.dst = {kBufRecv, 0};
  } else {
    first.kind = StepKind::kRecv;
    first.dst = {kBufRecv, 0};
    second.kind = StepKind::kSend;
    second.src = {kBufRecv, 0};
  }
  s.phases.push_back(Phase{{first}});
  s.phases.push_back(Phase{{second}});
  mark_first_contacts(s);
  return s;
}

struct LinkSample {
  double alpha_us = 0;
  double bw_GBps = 0;
};

// Runs `iters` timed ping-pongs (after one untimed warm-up) and returns the
// one-way time in us: the median (many small samples: the typical wake-up
// cost) or the best (few large samples, where one preemption would dominate a
// median of three); the echo side returns 0.
Result<double> one_way_us(Executor& exec, bool initiator, int peer, size_t bytes, int iters, bool best,
                          std::vector<std::byte*>& bufs, Deadline deadline) {
  RankSchedule s = ping_pong(initiator, peer, bytes);
  std::vector<double> samples;
  for (int it = 0; it <= iters; ++it) {
    auto t0 = WallClock::now();
    LOOM_RETURN_IF_ERROR(exec.run(s, bufs, DataType::kUint8, RedOp::kSum, deadline,
                                  fmt::format("calibration ping-pong ({} B with rank {})", bytes, peer)));
    if (it > 0) samples.push_back(us_since(t0) / 2);
  }
  if (!initiator || samples.empty()) return 0.0;
  return best ? *std::min_element(samples.begin(), samples.end()) : median(std::move(samples));
}

Result<LinkSample> measure_link(Executor& exec, bool initiator, int peer, const CalibrationOptions& o,
                                std::vector<std::byte*>& bufs, Deadline deadline) {
  LOOM_ASSIGN_OR_RETURN(double t_small,
                        one_way_us(exec, initiator, peer, o.small_bytes, o.small_iters, false, bufs, deadline));
  LOOM_ASSIGN_OR_RETURN(double t_large,
                        one_way_us(exec, initiator, peer, o.large_bytes, o.large_iters, true, bufs, deadline));
  LinkSample l;
  if (!initiator) return l;
  // A clock too coarse to see the small message still leaves a positive alpha.
  l.alpha_us = std::max(t_small, 0.01);
  const double extra = static_cast<double>(o.large_bytes - o.small_bytes);
  // Noise can make the difference vanish; then the large message alone.
  double bw = t_large > t_small ? extra / ((t_large - t_small) * 1e3)
                                : static_cast<double>(o.large_bytes) / (std::max(t_large, 0.01) * 1e3);
  l.bw_GBps = std::clamp(bw, 1e-4, 1e4);
  return l;
}

// Throughput of reduce2 (float32 sum), best of `iters` after a warm-up, in
// output GB/s (the unit of the model's gamma).
double measure_reduce_GBps(const CalibrationOptions& o) {
  const size_t n = std::max<size_t>(o.reduce_bytes / sizeof(float), 1024);
  std::vector<float> a(n), b(n), dst(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i % 251);
    b[i] = static_cast<float>(i % 127);
  }
  double best = std::numeric_limits<double>::infinity();
  for (int it = 0; it <= o.reduce_iters; ++it) {
    auto t0 = WallClock::now();
    kernels::reduce2(dst.data(), a.data(), b.data(), n, DataType::kFloat32, RedOp::kSum);
    double us = us_since(t0);
    if (it > 0) best = std::min(best, us);
  }
  return static_cast<double>(n * sizeof(float)) / (std::max(best, 0.01) * 1e3);
}

// What each rank contributes to the agreement allgather.
struct Report {
  double alpha_us;  // worst over the edges this rank initiated
  double bw_GBps;
  double reduce_GBps;
  int32_t edges;  // edges this rank initiated (0: alpha/bw unused)
  int32_t pad;
};

}  // namespace

Result<CalibrationRequest> agree_calibration_request(Bootstrap& boot, CalibrationRequest mine, Deadline deadline) {
  const int p = boot.nranks();
  std::vector<uint8_t> flags(static_cast<size_t>(p), 0);
  flags[static_cast<size_t>(boot.rank())] =
      static_cast<uint8_t>((mine.calibrate ? 1 : 0) | (mine.hand_off ? 2 : 0) | (mine.probe_algos ? 4 : 0));
  LOOM_RETURN_IF_ERROR(boot.allgather(flags.data(), 1, deadline).with_context("calibration request exchange"));
  int n = static_cast<int>(std::count_if(flags.begin(), flags.end(), [](uint8_t f) { return (f & 1) != 0; }));
  if (n > 0 && n < p && boot.rank() == 0)
    LOOM_WARN(kLogTune, "LOOM_TUNE_CALIBRATE=1 on {} of {} ranks only; calibrating on all", n, p);
  CalibrationRequest agreed;
  agreed.calibrate = n > 0;
  agreed.hand_off = std::all_of(flags.begin(), flags.end(), [](uint8_t f) { return (f & 2) != 0; });
  agreed.probe_algos = agreed.hand_off && std::all_of(flags.begin(), flags.end(), [](uint8_t f) { return (f & 4) != 0; });
  return agreed;
}

Result<Calibration> calibrate_comm(Executor& exec, Bootstrap& boot, int rank, int nranks, Deadline deadline,
                                   const CalibrationOptions& o) {
  auto t_start = WallClock::now();
  const size_t buf_bytes = std::max(o.small_bytes, o.large_bytes);
  std::vector<std::byte> send(buf_bytes, std::byte{0x5a}), recv(buf_bytes);
  std::vector<std::byte*> bufs = {send.data(), recv.data(), nullptr};

  Report mine{0, std::numeric_limits<double>::infinity(), 0, 0, 0};
  for (int round = 0; round < 3; ++round) {
    // At most one edge per rank per round: as initiator (edge `rank`) or echo
    // (edge `rank - 1`).
    const int as_init = rank, as_echo = (rank - 1 + nranks) % nranks;
    int peer = -1;
    bool initiator = false;
    if (edge_round(as_init, nranks) == round) {
      peer = (rank + 1) % nranks;
      initiator = true;
    } else if (edge_round(as_echo, nranks) == round) {
      peer = as_echo;
    }
    if (peer < 0) continue;
    LOOM_ASSIGN_OR_RETURN(LinkSample l, measure_link(exec, initiator, peer, o, bufs, deadline));
    if (initiator) {
      mine.alpha_us = std::max(mine.alpha_us, l.alpha_us);
      mine.bw_GBps = std::min(mine.bw_GBps, l.bw_GBps);
      ++mine.edges;
      LOOM_INFO(kLogTune, "calibration rank {} -> {}: alpha {:.2f} us, bandwidth {:.2f} GB/s", rank, peer,
                l.alpha_us, l.bw_GBps);
    }
  }
  if (mine.edges == 0) mine.bw_GBps = 0;
  mine.reduce_GBps = measure_reduce_GBps(o);

  std::vector<Report> all(static_cast<size_t>(nranks));
  all[static_cast<size_t>(rank)] = mine;
  LOOM_RETURN_IF_ERROR(boot.allgather(all.data(), sizeof(Report), deadline).with_context("calibration exchange"));
  // Same data, same order on every rank: identical doubles everywhere.
  Calibration c;
  c.reduce_GBps = std::numeric_limits<double>::infinity();
  double bw = std::numeric_limits<double>::infinity();
  for (const Report& r : all) {
    c.reduce_GBps = std::min(c.reduce_GBps, r.reduce_GBps);
    if (r.edges == 0) continue;
    c.alpha_us = std::max(c.alpha_us, r.alpha_us);
    bw = std::min(bw, r.bw_GBps);
    c.pairs += r.edges;
  }
  c.bw_GBps = c.pairs > 0 ? bw : 0;
  c.elapsed_ms = us_since(t_start) / 1e3;
  return c;
}

namespace {

// `rounds` phases of one exchange each: send to rank + d, receive from
// rank - d (mod nranks); every phase depends on the previous one.
RankSchedule shift_rounds(int rank, int nranks, int d, int rounds, size_t bytes) {
  RankSchedule s;
  s.algorithm = "hand-off probe";
  for (int i = 0; i < rounds; ++i) {
    Step snd, rcv;
    snd.kind = StepKind::kSend;
    snd.peer = (rank + d) % nranks;
    snd.src = {kBufSend, 0};
    snd.count = bytes;
    rcv.kind = StepKind::kRecv;
    rcv.peer = (rank - d % nranks + nranks) % nranks;
    rcv.dst = {kBufRecv, 0};
    rcv.count = bytes;
    s.phases.push_back(Phase{{snd, rcv}});
  }
  mark_first_contacts(s);
  return s;
}

}  // namespace

Result<HandOffProbe> probe_hand_off(Executor& exec, Bootstrap& boot, int rank, int nranks, int cores,
                                    Deadline deadline, int rounds, int reps) {
  if (nranks <= cores || cores < 1 || rounds < 1 || reps < 1)
    return invalid_argument(fmt::format("hand-off probe needs more ranks ({}) than cores ({})", nranks, cores));
  auto t_start = WallClock::now();
  constexpr size_t kBytes = 8;
  std::vector<std::byte> send(kBytes, std::byte{0x5a}), recv(kBytes);
  std::vector<std::byte*> bufs = {send.data(), recv.data(), nullptr};
  double mine[2];
  const int dist[2] = {1, cores};
  for (int k = 0; k < 2; ++k) {
    RankSchedule s = shift_rounds(rank, nranks, dist[k], rounds, kBytes);
    double best = std::numeric_limits<double>::infinity();
    for (int it = 0; it <= reps; ++it) {  // the first run warms up
      auto t0 = WallClock::now();
      LOOM_RETURN_IF_ERROR(exec.run(s, bufs, DataType::kUint8, RedOp::kSum, deadline,
                                    fmt::format("hand-off probe ({} rounds at distance {})", rounds, dist[k])));
      if (it > 0) best = std::min(best, us_since(t0) / rounds);
    }
    mine[k] = best;
  }
  std::vector<double> all(2 * static_cast<size_t>(nranks));
  all[2 * static_cast<size_t>(rank)] = mine[0];
  all[2 * static_cast<size_t>(rank) + 1] = mine[1];
  LOOM_RETURN_IF_ERROR(boot.allgather(all.data(), 2 * sizeof(double), deadline).with_context("hand-off probe exchange"));
  HandOffProbe h;
  for (int r = 0; r < nranks; ++r) {
    h.across_us = std::max(h.across_us, all[2 * static_cast<size_t>(r)]);
    h.within_us = std::max(h.within_us, all[2 * static_cast<size_t>(r) + 1]);
  }
  h.elapsed_ms = us_since(t_start) / 1e3;
  return h;
}

Result<AlgoProbe> probe_schedules(Executor& exec, Bootstrap& boot, const std::vector<const RankSchedule*>& scheds,
                                  std::vector<std::byte*> bufs, DataType dt, RedOp op, Deadline deadline, int blocks,
                                  int per_block) {
  if (scheds.empty() || blocks < 1 || per_block < 1) return invalid_argument("algorithm probe: nothing to time");
  auto t_start = WallClock::now();
  const size_t n = scheds.size();
  std::vector<std::vector<double>> times(n);
  auto run_one = [&](size_t i) {
    return exec.run(*scheds[i], bufs, dt, op, deadline,
                    fmt::format("algorithm probe ({} of {})", scheds[i]->algorithm, n));
  };
  for (size_t i = 0; i < n; ++i) LOOM_RETURN_IF_ERROR(run_one(i));  // warm-up: scratch, first contacts
  for (int b = 0; b < blocks; ++b) {
    for (size_t i = 0; i < n; ++i) {
      auto t0 = WallClock::now();
      for (int k = 0; k < per_block; ++k) LOOM_RETURN_IF_ERROR(run_one(i));
      times[i].push_back(us_since(t0) / per_block);
    }
  }
  const int p = boot.nranks();
  std::vector<double> all(n * static_cast<size_t>(p));
  for (size_t i = 0; i < n; ++i) {
    std::vector<double>& v = times[i];
    std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
    all[static_cast<size_t>(boot.rank()) * n + i] = v[v.size() / 2];
  }
  LOOM_RETURN_IF_ERROR(boot.allgather(all.data(), n * sizeof(double), deadline)
                           .with_context("algorithm probe exchange"));
  AlgoProbe probe;
  probe.us.assign(n, 0.0);
  for (int r = 0; r < p; ++r)
    for (size_t i = 0; i < n; ++i) probe.us[i] += all[static_cast<size_t>(r) * n + i] / p;
  probe.elapsed_ms = us_since(t_start) / 1e3;
  return probe;
}

}  // namespace loom
