#include "diag/recorder.h"

#include <time.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/algorithms.h"

namespace loom::diag {

const char* op_state_name(OpState s) {
  switch (s) {
    case OpState::kEnqueued: return "enqueued";
    case OpState::kStarted: return "started";
    case OpState::kCompleted: return "completed";
    case OpState::kFailed: return "failed";
  }
  return "unknown";
}

int64_t clock_now_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

namespace {

// now_ns_clock_reads. A plain increment, not a locked one: without an
// invariant TSC every read counts, and concurrent ones may be lost (tests
// count from one thread).
std::atomic<uint64_t> g_clock_reads{0};
void count_clock_read() {
  g_clock_reads.store(g_clock_reads.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

#if defined(__x86_64__)
// The flight recorder reads the wall clock once or twice per op, on its
// critical path (enqueue, end). clock_gettime(CLOCK_REALTIME) costs ~28 ns on this
// project's VMs (the kvm clock through the vDSO), the TSC ~10: measured, 2
// ranks, 8 B allreduce 0.52-0.55 -> 0.49-0.54 us with the TSC. With an
// invariant TSC, the time is an anchor's realtime plus the ticks since it, at
// the rate measured between the last two anchors; a new anchor (one
// clock_gettime) every ~50 ms of ticks follows NTP's slewing. The first call
// measures a provisional rate over ~50 us (first_anchor), good for the first
// millisecond; then a rate over >= 1 ms takes over. Without an invariant TSC,
// clock_gettime itself.
bool invariant_tsc() {
  unsigned a, b, c, d;
  if (!__get_cpuid(0x80000000, &a, &b, &c, &d) || a < 0x80000007) return false;
  __get_cpuid(0x80000007, &a, &b, &c, &d);
  return (d & (1u << 8)) != 0;
}

class TscClock {
 public:
  int64_t now() {
    const uint64_t t = __rdtsc();
    const Anchor& a = slots_[cur_.load(std::memory_order_acquire) % kSlots];
    const uint64_t at = a.tsc.load(std::memory_order_relaxed);
    const double rate = a.ns_per_tick.load(std::memory_order_relaxed);
    if (rate > 0 && t >= at && t - at < a.ticks_valid.load(std::memory_order_relaxed))
      return a.ns.load(std::memory_order_relaxed) + static_cast<int64_t>(static_cast<double>(t - at) * rate);
    return reanchor();
  }

 private:
  struct Anchor {
    std::atomic<uint64_t> tsc{0};
    std::atomic<int64_t> ns{0};
    std::atomic<double> ns_per_tick{0};
    std::atomic<uint64_t> ticks_valid{0};
  };
  static constexpr unsigned kSlots = 64;  // a slot is reused after 63 newer anchors (seconds)
  static constexpr int64_t kAnchorNs = 50'000'000;
  static constexpr int64_t kFirstRateNs = 1'000'000;
  static constexpr int64_t kProvisionalNs = 50'000;

  // Out of line: now()'s common path stays a few instructions without the
  // registers this one needs.
  [[gnu::noinline]] int64_t reanchor() {
    count_clock_read();
    uint64_t t_now;
    int64_t ns;
    if (!tight_pair(&t_now, &ns)) return ns;
    if (busy_.exchange(true, std::memory_order_acquire)) return ns;  // another thread re-anchors
    const uint64_t prev_t = last_tsc_;
    const int64_t prev_ns = last_ns_;
    if (prev_t == 0 || t_now <= prev_t || ns - prev_ns <= 0) {
      last_tsc_ = t_now, last_ns_ = ns;  // first sample, or the TSC went back (migration): start over
      first_anchor(t_now, ns);
    } else if (ns - prev_ns >= kFirstRateNs) {
      publish(t_now, ns, static_cast<double>(ns - prev_ns) / static_cast<double>(t_now - prev_t), kAnchorNs);
      last_tsc_ = t_now, last_ns_ = ns;
    }
    busy_.store(false, std::memory_order_release);
    return ns;
  }

  // The TSC read on both sides of a clock read: *tsc their middle. A pair read
  // across a preemption would skew a rate: only a tight one (2^16 ticks, ~20
  // us at 3 GHz) counts.
  static bool tight_pair(uint64_t* tsc, int64_t* ns) {
    const uint64_t t1 = __rdtsc();
    *ns = clock_now_ns();
    const uint64_t t2 = __rdtsc();
    *tsc = t1 + (t2 - t1) / 2;
    return t2 - t1 <= (uint64_t{1} << 16);
  }

  // After the first sample (t0, ns0): a rate over ~kProvisionalNs of reads,
  // valid for kFirstRateNs, when the sample itself (still last_tsc_) gives
  // a rate over a millisecond. Without it, every read of the first
  // millisecond was a clock_gettime and two TSC reads: the first ~2500 ops of
  // a 2-rank 8 B allreduce in the host's fast phase took 16 instead of 11 us
  // per 64 calls (performance.md Run 48). Spins ~50 us, once per process.
  void first_anchor(uint64_t t0, int64_t ns0) {
    for (int reads = 0; reads < 100000; ++reads) {
      uint64_t t;
      int64_t ns;
      const bool tight = tight_pair(&t, &ns);
      if (ns - ns0 > kFirstRateNs || t <= t0) return;  // preempted for long, or the TSC went back
      if (tight && ns - ns0 >= kProvisionalNs) {
        publish(t, ns, static_cast<double>(ns - ns0) / static_cast<double>(t - t0), kFirstRateNs);
        return;
      }
    }
  }

  // A new anchor at (tsc, ns), extrapolated at `rate` for `valid_ns`.
  void publish(uint64_t tsc, int64_t ns, double rate, int64_t valid_ns) {
    const unsigned next = cur_.load(std::memory_order_relaxed) + 1;
    Anchor& a = slots_[next % kSlots];
    a.tsc.store(tsc, std::memory_order_relaxed);
    a.ns.store(ns, std::memory_order_relaxed);
    a.ns_per_tick.store(rate, std::memory_order_relaxed);
    a.ticks_valid.store(static_cast<uint64_t>(static_cast<double>(valid_ns) / rate), std::memory_order_relaxed);
    cur_.store(next, std::memory_order_release);
  }

  Anchor slots_[kSlots];
  std::atomic<unsigned> cur_{0};
  std::atomic<bool> busy_{false};
  uint64_t last_tsc_ = 0;  // the previous anchor (under busy_)
  int64_t last_ns_ = 0;
};
#endif

}  // namespace

bool now_ns_uses_tsc() {
#if defined(__x86_64__)
  static const bool tsc = invariant_tsc();
  return tsc;
#else
  return false;
#endif
}

int64_t now_ns() {
#if defined(__x86_64__)
  static const bool tsc = now_ns_uses_tsc();
  static TscClock clock;
  if (tsc) return clock.now();
#endif
  count_clock_read();
  return clock_now_ns();
}

uint64_t now_ns_clock_reads() { return g_clock_reads.load(std::memory_order_relaxed); }

namespace {
// An algorithm name's first 8 characters, as the entry keeps them. A copy
// of a run-time length compiled to a byte loop on every record; most names
// have 8 characters or more, and those take one load.
uint64_t algo_word(const std::string& algorithm) {
  uint64_t name = 0;
  if (algorithm.size() >= 8) {
    std::memcpy(&name, algorithm.data(), 8);
    return name;
  }
  // Byte i where a memcpy would put it (algo_full_name reads it back so).
  for (size_t i = 0; i < algorithm.size(); ++i) {
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    const unsigned shift = 56 - 8 * static_cast<unsigned>(i);
#else
    const unsigned shift = 8 * static_cast<unsigned>(i);
#endif
    name |= static_cast<uint64_t>(static_cast<unsigned char>(algorithm[i])) << shift;
  }
  return name;
}
}  // namespace

FlightRecorder::FlightRecorder(size_t capacity)
    : cap_(capacity),
      mask_(ring_size(capacity) - 1),
      entries_(capacity ? new Entry[ring_size(capacity)] : nullptr),
      p2p_(capacity ? new P2pEntry[ring_size(capacity)] : nullptr) {}

size_t FlightRecorder::ring_size(size_t capacity) {
  size_t n = 1;
  while (n < capacity) n <<= 1;
  return n;
}

uint32_t FlightRecorder::pack_info(Collective coll, DataType dt, RedOp op, OpState state, int nphases) {
  static_assert(kNumDataTypes <= 16 && kNumRedOps <= 16 && kNumCollectives <= 16, "4 bits each");
  const uint32_t phases = static_cast<uint32_t>(std::clamp(nphases, 0, 0xffff));
  return (static_cast<uint32_t>(coll) & 0xf) | (static_cast<uint32_t>(dt) & 0xf) << 4 |
         (static_cast<uint32_t>(op) & 0xf) << 8 | static_cast<uint32_t>(state) << 12 | phases << 16;
}

int64_t FlightRecorder::on_enqueue(uint64_t seq, uint64_t coll_seq, const CollArgs& a) {
  const int64_t now = now_ns();
  if (cap_) write_entry(seq, coll_seq, a, nullptr, 0, now);
  return now;
}

int64_t FlightRecorder::on_run_at_issue(uint64_t seq, uint64_t coll_seq, const CollArgs& a, const std::string& algorithm,
                                        int nphases) {
  const int64_t now = now_ns();
  if (cap_) write_entry(seq, coll_seq, a, &algorithm, nphases, now);
  return now;
}

void FlightRecorder::on_ran_at_issue(uint64_t seq, uint64_t coll_seq, const CollArgs& a, const std::string& algorithm,
                                     int nphases, bool ok) {
  if (cap_) write_entry(seq, coll_seq, a, &algorithm, nphases, now_ns(), ok ? End::kOk : End::kFailed);
}

void FlightRecorder::write_entry(uint64_t seq, uint64_t coll_seq, const CollArgs& a, const std::string* algorithm,
                                 int nphases, int64_t now, End end) {
  constexpr auto r = std::memory_order_relaxed;
  Entry& e = slot(seq);
  const uint64_t held = e.seq.load(r);
  // The slot's op ends on the engine thread: its final state is stored
  // (release) after its last write to the entry, so once it reads finished
  // here the slot is free. Ops run in order, so an op left unfinished in
  // the ring is the running one or queued behind it (or, after a failure,
  // one that never ran: the communicator is dead then).
  if (held != ~0ull && held != seq && unfinished(e.info.load(std::memory_order_acquire))) {
    unrecorded_.store(unrecorded_.load(r) + 1, r);  // written by the issuing thread only
    if (seq + 1 > next_.load(r)) next_.store(seq + 1, std::memory_order_release);
    return;
  }
  // A seqlock: readers skip the slot while it is rewritten (seq cleared,
  // then the fields; the fence orders the two on any memory model).
  e.seq.store(~0ull, r);
  std::atomic_thread_fence(std::memory_order_release);
  e.coll_seq.store(coll_seq, r);
  e.count.store(a.count, r);
  e.algo.store(algorithm ? algo_word(*algorithm) : 0, r);
  e.t_enq.store(now, r);
  e.t_start.store(algorithm ? now : 0, r);
  e.t_end.store(end == End::kNo ? 0 : now, r);
  e.root.store(a.root, r);
  const OpState state = end == End::kOk       ? OpState::kCompleted
                        : end == End::kFailed ? OpState::kFailed
                        : algorithm           ? OpState::kStarted
                                              : OpState::kEnqueued;
  e.info.store(pack_info(a.coll, a.dt, a.op, state, nphases), r);
  if (a.coll == Collective::kSendRecv) {
    P2pEntry& pe = p2p_[seq & mask_];
    const int np = static_cast<int>(std::min<size_t>(a.p2p.size(), kMaxP2p));
    for (int i = 0; i < np; ++i) {
      const P2pOp& p = a.p2p[i];
      int64_t c = static_cast<int64_t>(std::min<size_t>(p.count, 0x7fffffff));
      pe.p2p[i].store((static_cast<int64_t>(p.peer) << 1 | (p.is_send ? 1 : 0)) << 32 | c, r);
    }
    pe.np2p.store(static_cast<int>(a.p2p.size()), r);
  }
  e.seq.store(seq, std::memory_order_release);
  // Only ever forward: an op run at issue is recorded when it first waits
  // (CommImpl::run_sub), possibly after a later op was queued and recorded.
  if (seq + 1 > next_.load(std::memory_order_relaxed)) next_.store(seq + 1, std::memory_order_release);
}

int64_t FlightRecorder::on_start(uint64_t seq, const std::string& algorithm, int nphases) {
  const int64_t now = now_ns();
  if (!cap_) return now;
  Entry& e = slot(seq);
  constexpr auto r = std::memory_order_relaxed;
  if (e.seq.load(r) != seq) return now;  // not recorded (write_entry): the ring was full of unfinished ops
  e.algo.store(algo_word(algorithm), r);
  e.t_start.store(now, r);
  // The phases and the state in one store (this thread wrote the rest of info).
  const uint32_t info = e.info.load(r);
  e.info.store(with_state(info & 0xffffu, OpState::kStarted) | static_cast<uint32_t>(std::clamp(nphases, 0, 0xffff)) << 16,
               std::memory_order_release);
  return now;
}

void FlightRecorder::on_end(uint64_t seq, bool ok) {
  if (!cap_) return;
  Entry& e = slot(seq);
  if (e.seq.load(std::memory_order_relaxed) != seq) return;  // not recorded (write_entry)
  e.t_end.store(now_ns(), std::memory_order_relaxed);
  e.info.store(with_state(e.info.load(std::memory_order_relaxed), ok ? OpState::kCompleted : OpState::kFailed),
               std::memory_order_release);
}

namespace {

// The entry keeps an algorithm name's first 8 characters (one word, written
// on the op's path); a dump shows the registered name they begin
// ("rabenseifner", not "rabensei"), or the 8 characters when none does.
std::string algo_full_name(uint64_t word) {
  char prefix[9] = {};
  std::memcpy(prefix, &word, 8);
  const size_t len = std::strlen(prefix);
  if (len == 8)
    for (const Algorithm& a : all_algorithms())
      if (std::strncmp(a.name, prefix, 8) == 0) return a.name;
  return prefix;
}

}  // namespace

nlohmann::json FlightRecorder::to_json(size_t max_ops) const {
  nlohmann::json out = nlohmann::json::array();
  if (!cap_) return out;
  const uint64_t end = next_.load(std::memory_order_acquire);
  const uint64_t begin = end > cap_ ? end - cap_ : 0;
  // Every slot of the ring: the last cap_ ops, and older ones that did not
  // complete (unfinished ones keep their slots, write_entry; a failed one is
  // the op a failure's dump is about), oldest first.
  std::vector<std::pair<uint64_t, size_t>> order;
  for (size_t i = 0; i <= mask_; ++i) {
    const uint64_t s = entries_[i].seq.load(std::memory_order_acquire);
    if (s == ~0ull || s >= end) continue;
    const auto state = static_cast<OpState>(entries_[i].info.load(std::memory_order_acquire) >> 12 & 0xf);
    if (s >= begin || state != OpState::kCompleted) order.emplace_back(s, i);
  }
  std::sort(order.begin(), order.end());
  if (order.size() > max_ops) order.erase(order.begin(), order.end() - static_cast<ptrdiff_t>(max_ops));
  for (const auto& [s, i] : order) {
    const Entry& e = entries_[i];
    if (e.seq.load(std::memory_order_acquire) != s) continue;
    const uint32_t info = e.info.load(std::memory_order_acquire);
    const auto coll = static_cast<Collective>(info & 0xf);
    nlohmann::json j;
    j["seq"] = s;
    j["coll"] = collective_name(coll);
    j["count"] = e.count.load();
    j["dtype"] = dtype_name(static_cast<DataType>(info >> 4 & 0xf));
    if (coll == Collective::kSendRecv) {
      const P2pEntry& pe = p2p_[s & mask_];
      nlohmann::json p2p = nlohmann::json::array();
      const int np = std::min(pe.np2p.load(), kMaxP2p);
      for (int i = 0; i < np; ++i) {
        int64_t v = pe.p2p[i].load();
        p2p.push_back({{"send", ((v >> 32) & 1) != 0}, {"peer", static_cast<int>(v >> 33)}, {"count", v & 0x7fffffff}});
      }
      j["p2p"] = std::move(p2p);
      j["p2p_total"] = pe.np2p.load();
    } else {
      j["coll_seq"] = e.coll_seq.load();
      j["op"] = redop_name(static_cast<RedOp>(info >> 8 & 0xf));
      j["root"] = e.root.load();
    }
    j["algo"] = algo_full_name(e.algo.load());
    j["state"] = op_state_name(static_cast<OpState>(info >> 12 & 0xf));
    j["nphases"] = static_cast<int>(info >> 16);
    j["enqueued_ns"] = e.t_enq.load();
    j["started_ns"] = e.t_start.load();
    j["ended_ns"] = e.t_end.load();
    std::atomic_thread_fence(std::memory_order_acquire);  // the seqlock's read side (write_entry)
    if (e.seq.load(std::memory_order_relaxed) != s) continue;  // rewritten while we read
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace loom::diag
