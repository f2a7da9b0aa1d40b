// Flight recorder: per communicator, a ring buffer of the last N operations
// (LOOM_TRACE_BUFFER_SIZE, 0 = off) with their arguments, algorithm, state
// and timestamps. Written by the issuing thread (enqueue) and the engine
// thread (start / end); read at any time by the watchdog, the live query
// server and the dump writer. Every field is a relaxed atomic, so writing
// costs a few plain stores and a reader may see an entry mid-update (it
// re-checks the entry's sequence number; diagnostics tolerate the rest).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "algorithms/schedule.h"

namespace loom::diag {

enum class OpState : int { kEnqueued = 0, kStarted = 1, kCompleted = 2, kFailed = 3 };
const char* op_state_name(OpState s);

// Nanoseconds on a clock shared by all processes of a host and close to wall
// time (CLOCK_REALTIME): dumps of different ranks are compared by it. On x86
// with an invariant TSC it is extrapolated from the TSC between anchors read
// from CLOCK_REALTIME every ~50 ms (recorder.cc); clock_now_ns reads the clock.
int64_t now_ns();
int64_t clock_now_ns();
// For tests: whether now_ns extrapolates the TSC (x86, invariant TSC), and
// how many of its reads the clock itself answered (before the first anchor,
// at each re-anchoring; all of them without the TSC).
bool now_ns_uses_tsc();
uint64_t now_ns_clock_reads();

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity);
  bool enabled() const { return cap_ > 0; }
  size_t capacity() const { return cap_; }

  // Returns the enqueue time it recorded (now_ns).
  int64_t on_enqueue(uint64_t seq, uint64_t coll_seq, const CollArgs& a);
  // Returns the start time it recorded (now_ns).
  int64_t on_start(uint64_t seq, const std::string& algorithm, int nphases);
  void on_end(uint64_t seq, bool ok);
  // on_enqueue + on_start at one time, each field written once: an op run
  // at issue, recorded while it waits (CommImpl::write_deferred_record).
  int64_t on_run_at_issue(uint64_t seq, uint64_t coll_seq, const CollArgs& a, const std::string& algorithm,
                          int nphases);
  // An op run at issue that ended before it waited long, recorded whole at
  // its end with one clock read: enqueued, started and ended at that time
  // (its own duration, about a microsecond, is not measured). One clock
  // read per op instead of two, and the entry written once: 2 ranks, 8 B
  // allreduce, host's fast phase, 0.198 -> 0.177 us (performance.md Run 48).
  void on_ran_at_issue(uint64_t seq, uint64_t coll_seq, const CollArgs& a, const std::string& algorithm, int nphases,
                       bool ok);

  // Entries oldest to newest as a JSON array (schema in docs/troubleshooting.md):
  // the last capacity() ops, and any older one still in the ring that did
  // not complete (running, queued or failed). At most the newest `max_ops`
  // of them: only those are rendered.
  nlohmann::json to_json(size_t max_ops = SIZE_MAX) const;
  // Ops not recorded because their slot held an op that had not finished
  // (more unfinished ops than the ring holds: a deep queue behind a hung op).
  uint64_t unrecorded() const { return unrecorded_.load(std::memory_order_relaxed); }

 private:
  static constexpr int kMaxP2p = 4;
  // One cache line per op: an op's record touches one line, not the two or
  // three of the 120-byte entry it replaced, and a communicator's ring takes
  // half the cache (no time change measured at 8 B; performance.md Run 29).
  // A send/recv group's peers live beside it (P2pEntry), written only for
  // those ops.
  struct alignas(64) Entry {
    std::atomic<uint64_t> seq{~0ull};
    std::atomic<uint64_t> coll_seq{0};
    std::atomic<uint64_t> count{0};
    std::atomic<uint64_t> algo{0};  // first 8 chars of the algorithm name
    std::atomic<int64_t> t_enq{0}, t_start{0}, t_end{0};
    std::atomic<int32_t> root{0};
    std::atomic<uint32_t> info{0};  // pack_info: coll, dtype, op, state, phases
  };
  static_assert(sizeof(Entry) == 64, "one cache line per entry");
  struct P2pEntry {
    std::atomic<int> np2p{0};
    std::atomic<int64_t> p2p[kMaxP2p];  // (peer << 1 | is_send) << 32 | min(count, 2^31)
  };
  // info: coll 4 bits | dtype 4 | op 4 | state 4 | phases 16 (at most 65535)
  static uint32_t pack_info(Collective coll, DataType dt, RedOp op, OpState state, int nphases);
  static uint32_t with_state(uint32_t info, OpState state) { return (info & ~0xf000u) | static_cast<uint32_t>(state) << 12; }
  static bool unfinished(uint32_t info) { return (info >> 12 & 0xf) <= static_cast<uint32_t>(OpState::kStarted); }
  // The entry of `seq`, enqueued (algorithm null) or started at `now`, or
  // with `end` also ended then (ok: completed, else failed); nothing when
  // its slot holds an op that has not finished (a running or queued op
  // keeps its entry until it ends: that is the op a hang dump is about, and
  // its start and end must not land on a newer op's entry).
  enum class End { kNo, kOk, kFailed };
  void write_entry(uint64_t seq, uint64_t coll_seq, const CollArgs& a, const std::string* algorithm, int nphases,
                   int64_t now, End end = End::kNo);
  // The ring holds a power of two of entries, so that a slot is a mask, not
  // a 64-bit division (an op looks its slot up three times: enqueue, start,
  // end). Dumps keep the last cap_.
  Entry& slot(uint64_t seq) const { return entries_[seq & mask_]; }
  static size_t ring_size(size_t capacity);

  size_t cap_;   // ops a dump keeps (LOOM_TRACE_BUFFER_SIZE)
  size_t mask_;  // ring_size(cap_) - 1
  std::unique_ptr<Entry[]> entries_;
  std::unique_ptr<P2pEntry[]> p2p_;  // per slot, for send/recv groups
  std::atomic<uint64_t> next_{0};  // one past the newest seq recorded (or skipped)
  std::atomic<uint64_t> unrecorded_{0};
};

}  // namespace loom::diag
