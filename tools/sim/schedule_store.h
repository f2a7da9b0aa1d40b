// Schedules of every rank of a simulated job, in a form that fits 16k ranks.
//
// A RankSchedule keeps buffers and offsets the simulator never reads, and
// a ring allreduce over 16384 ranks is 2 x 16383 phases on each rank: some
// 6 MB per rank, 99 GB in all. The store keeps what timing and
// matching need (kind, peer, count, flags; StepLite), with every peer
// relative to its rank ((peer - rank) mod nranks), and interns phases: the
// ring's phases are then a handful of shapes shared by every rank, and each
// rank a short run-length list of (shape, repeats). Whoever needs a step's
// buffers (an error message) regenerates that rank's RankSchedule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "algorithms/schedule.h"

namespace loom::sim {

// One step without its buffers.
struct StepLite {
  uint64_t count = 0;     // elements
  uint32_t rel_peer = 0;  // transfers: (peer - rank) mod nranks; kBadPeer when out of range or the rank itself
  StepKind kind = StepKind::kCopy;
  uint8_t flags = 0;      // kOverlap | kPeerReduces | kAnnounced
  bool operator==(const StepLite&) const = default;
};
static_assert(sizeof(StepLite) == 16);
inline constexpr uint32_t kBadPeer = UINT32_MAX;
inline constexpr uint8_t kOverlap = 1, kPeerReduces = 2, kAnnounced = 4;

// A distinct phase: its steps (in schedule order) and their local work.
struct PhaseShape {
  uint32_t first = 0;   // index of its first step in the store's step pool
  uint32_t nsteps = 0;
  uint32_t ncomm = 0;   // transfer steps
  uint32_t nsends = 0;  // of which sends
  // Elements of local work: copies and divides before the transfers are
  // posted, reduces before them, and copies overlapped with them.
  uint64_t copy_elems = 0, reduce_elems = 0, overlap_elems = 0;
};

class ScheduleStore {
 public:
  struct Run {
    uint32_t shape;
    uint32_t reps;  // the shape this many times in a row
  };

  explicit ScheduleStore(int nranks);
  // Appends the next rank's schedule (ranks in order 0, 1, ...), `repeat`
  // times in a row: ops issued back to back, as a stream of calls runs.
  void add_rank(const RankSchedule& s, int repeat = 1);

  int nranks() const { return nranks_; }
  int ranks_added() const { return static_cast<int>(rank_begin_.size()) - 1; }
  std::span<const Run> runs(int rank) const {
    return {runs_.data() + rank_begin_[static_cast<size_t>(rank)],
            runs_.data() + rank_begin_[static_cast<size_t>(rank) + 1]};
  }
  const PhaseShape& shape(uint32_t id) const { return shapes_[id]; }
  std::span<const StepLite> steps(const PhaseShape& p) const { return {steps_.data() + p.first, p.nsteps}; }
  int peer(int rank, const StepLite& s) const {
    return s.rel_peer == kBadPeer ? -1 : static_cast<int>((static_cast<uint64_t>(rank) + s.rel_peer) % nranks_);
  }

  // Totals over every rank (what the schedules would hold expanded).
  uint64_t phases() const { return phases_; }
  uint64_t transfers() const { return transfers_; }
  size_t nshapes() const { return shapes_.size(); }
  size_t nruns() const { return runs_.size(); }
  size_t memory_bytes() const;  // what the store holds

 private:
  uint32_t intern(const std::vector<StepLite>& steps);

  int nranks_;
  std::vector<StepLite> steps_;
  std::vector<PhaseShape> shapes_;
  std::vector<Run> runs_;
  std::vector<uint64_t> rank_begin_{0};  // rank r's runs: [rank_begin_[r], rank_begin_[r + 1])
  std::unordered_map<uint64_t, uint32_t> index_;  // hash of a shape's steps -> shape
  std::vector<StepLite> scratch_;
  uint64_t phases_ = 0, transfers_ = 0;
};

}  // namespace loom::sim
