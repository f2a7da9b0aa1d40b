// loom-sim's engine: a discrete-event timing simulation of the schedules of
// every rank of a job, and the structural check of the same schedules.
//
// What is modelled (docs/simulator.md says the same for users):
// - Each rank runs its phases in order. A phase's local steps (copies,
//   reduces, divides) run first and cost bytes x gamma (a reduce) or
//   2/3 x bytes x gamma (a copy or divide: two memory streams of a
//   reduction's three, as the cost model prices a pass through scratch);
//   then its transfers are posted and progress together, with its
//   overlapped copies; the phase ends when the last of them is done.
// - A message from a to b costs the pair's alpha (latency) plus its bytes
//   at the rate it gets, at most 1 / beta (the path's bandwidth): alpha and
//   beta are the cost model's own (topo::PairCosts). The bytes move first,
//   then the message arrives alpha later; a receive-reduce then reduces it
//   (bytes x gamma) before its step ends. A transfer of no elements is
//   skipped, as the executor skips it.
// - Messages from a to b go one at a time, in schedule order (the
//   executor's per-peer send gate), matched in order with b's receives
//   from a (schedule.h). A message of at most eager_bytes leaves when its
//   sender posts it (into the transport's FIFO); a larger one waits until
//   its receive is posted too.
// - Within a phase, a rank's k-th message pays (k - 1) x gap_us on top of
//   its alpha (LogGP's g: the sender's per-message work before it). This is
//   the cost model's CommCost::overlap_us, which it charges for each extra
//   concurrent message of the direct algorithms; priced as latency, not as
//   a later start, so a phase's messages share bandwidth from one instant.
// - Bandwidth is shared by the transfers that use one resource at once. The
//   resources are the fabric's (fabric_for: each rank's send side and
//   receive side, every link of the host graph a transfer crosses, each
//   direction apart, and the NICs toward the network, each direction). A
//   transfer gets min(1 / beta, the equal share of each of its resources):
//   an equal split, not max-min fairness, so capacity a transfer is held
//   back from elsewhere is left idle (pessimistic when flows are uneven).
// Not modelled: the network beyond the NICs (a non-blocking fabric), FIFO
// capacity beyond eager_bytes, CPU cores shared by ranks, single-copy and
// mapped reads, channels, kernel launches.
//
// Each rank's finish time is kept as the sum along its critical path (the
// chain of events that made it that late: the last step of each phase, the
// message or peer that step waited for, and so on back to the start), split
// by what each piece of it was: latency, per-message overhead, a
// bandwidth-limited transfer (by the resource that limited it), or local
// work. The report names the largest part for the slowest rank.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "loom/status.h"
#include "schedule_store.h"
#include "topology/cost_model.h"

namespace loom::topo {
class PairCosts;
struct RankTopology;
struct TopoGraph;
}  // namespace loom::topo

namespace loom::sim {

// What held a piece of a rank's critical path.
enum class Limit : uint8_t {
  kLatency,   // alpha
  kOverhead,  // the gaps before a message in its phase (gap_us)
  kPath,      // a transfer at its path's own bandwidth (1 / beta), nothing shared
  kSendPort,  // a transfer at its share of a resource, by kind
  kRecvPort,
  kLink,
  kNicOut,
  kNicIn,
  kLocal,     // copies and reductions
};
inline constexpr int kNumLimits = 9;
const char* limit_name(Limit l);

// The machine the schedules run on, as the simulator prices it.
struct Fabric {
  int nranks = 0;
  std::vector<double> capacity_GBps;  // every shared resource (one direction each)
  std::vector<Limit> kind;            // what each resource is
  std::function<std::string(uint32_t)> name;  // a resource, for the report
  // Appends the resources a message from `from` to `to` uses (the first 8 count).
  std::function<void(int from, int to, std::vector<uint32_t>& out)> route;
  // alpha (us) and beta (us per byte) of one message from `from` to `to`.
  std::function<topo::LinkCost(int from, int to)> link;
  double gamma_us_per_byte = 0;  // reduction; copies cost 2/3 of it per byte
  double gap_us = 0;             // per extra message of a phase, on top of alpha
};

// The fabric of a placement: each rank's send and receive side at the
// fastest path it has; every link of the host graph (each direction of it,
// on each host) at its bandwidth, used by the transfers whose path crosses
// it (between hosts: the path from the rank to its NIC, and at the far end
// from the NIC to the rank); each NIC at its speed toward the network
// (net_bw; a rank without a known NIC gets a stand-in per host at its
// network path's bandwidth). `pairs` gives alpha and beta, `g` and `rt`
// the routes; all three must outlive the fabric.
Fabric fabric_for(const topo::TopoGraph& g, const topo::RankTopology& rt, const topo::PairCosts& pairs,
                  double gamma_us_per_byte, double gap_us);

struct SimOptions {
  size_t elem_bytes = 4;
  // Messages of up to this many bytes leave when their sender posts them;
  // larger ones once their receive is posted too.
  uint64_t eager_bytes = uint64_t{2} << 20;
  // --check: matching and deadlock only; no costs, every message eager
  // (the interpreter's rules: unbounded FIFOs).
  bool structure_only = false;
  // Rank r's full schedule, for error messages that name a step with its
  // buffers (the store keeps none). Without it, steps are named by kind,
  // count and peer.
  std::function<Result<RankSchedule>(int rank)> schedule_of;
  // Called now and then (about every million events): the simulated time
  // so far, messages done, messages in all.
  std::function<void(double now_us, uint64_t done, uint64_t total)> progress;
};

struct SimResult {
  double time_us = 0;  // when the last rank finished
  int slowest_rank = -1;
  // The slowest rank's critical path by what its pieces were (sums to
  // time_us), the largest of them, and the resource that limited the
  // largest single piece of that kind ("NIC mlx5_0 out of host 3").
  std::array<double, kNumLimits> path_us{};
  Limit critical = Limit::kLatency;
  std::string critical_text;
  std::vector<double> finish_us;  // per rank
  uint64_t messages = 0;
  uint64_t events = 0;
};

// Runs the store's schedules on the fabric (structure_only: without one;
// pass a Fabric with just nranks). An error names the first violation of
// the matching rules (matching.h), or a deadlock with the ranks that wait on
// each other, with rank, phase and step.
Result<SimResult> simulate(const ScheduleStore& store, const Fabric& fabric, const SimOptions& options);

// The structural check alone: simulate with structure_only.
Status check(const ScheduleStore& store, SimOptions options);

}  // namespace loom::sim
