// Executes one rank's Schedule over the transports (schedule.h semantics):
// local steps through the memory backend, communication steps streamed
// through the connections, every wait bounded by the op's deadline and the
// communicator's abort flag, with peers checked for death or abort while idle.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "bootstrap/socket.h"
#include "core/memory.h"
#include "core/shared_stores.h"
#include "diag/fingerprint.h"
#include "transport/transport.h"

namespace loom {

// Live position of the running op, readable from other threads (diagnostics).
struct ExecProgress {
  std::atomic<uint64_t> seq{0};
  std::atomic<int> phase{-1};
  std::atomic<int> nphases{0};
  std::atomic<int> waiting_peer{-1};
  // ---- diag (flight recorder): communication steps of the current phase,
  // published only when the engine goes idle (never on the fast path).
  struct StepSlot {
    std::atomic<int> peer{-1};
    std::atomic<int> kind{0};  // StepKind
    std::atomic<uint64_t> done{0}, total{0};  // bytes
  };
  static constexpr int kMaxSlots = 8;
  StepSlot slots[kMaxSlots];
  std::atomic<int> nslots{0};
  // ---- end diag
};

class Executor {
 public:
  Executor(int rank, int nranks, Transport* transport, MemoryBackend* mem, const std::atomic<bool>* abort);

  // Runs `sched`; `bufs` indexed by BufId (scratch is provided here).
  // `what` names the op in errors ("allreduce #57 (ring, 1024 x float32)").
  Status run(const RankSchedule& sched, std::vector<std::byte*>& bufs, DataType dt, RedOp op, Deadline deadline,
             const std::string& what);

  // run() for a schedule of one exchange (RankSchedule::single_exchange)
  // with fingerprints on: a small message (the fingerprint and at most
  // kExchangeMaxBytes of data) goes out at once, and the peer's is taken in
  // the poll that sees it, without run()'s per-op and per-phase set-up
  // (~0.05 us of a 0.25 us 2-rank 8 B allreduce here, performance.md Run
  // 42). A peer that is not there within a few polls hands the op to the
  // general loop, with the deadline (timeout_s from now), abort, peer
  // checks and sleep of run(). Larger messages, and ones the transport
  // cannot take whole, run as run().
  Status run_exchange(const RankSchedule& sched, std::vector<std::byte*>& bufs, DataType dt, RedOp op,
                      double timeout_s, const std::string& what);
  // Data sizes run_exchange takes. Measured against the general loop
  // (alternating runs, 2 ranks, us, out of place / in place): 1 KiB
  // 0.34-0.38 / 0.34-0.37 against 0.39-0.51 / 0.41-0.56, 2 KiB 0.45-0.47 /
  // 0.46-0.47 against 0.48-0.53 / 0.50-0.55, 3 KiB level, 4 KiB in place
  // 0.79-0.82 against 0.70-0.79 (performance.md Run 42).
  static constexpr size_t kExchangeMaxBytes = 2048;

  ExecProgress& progress() { return progress_; }
  // Test counters (this process): idle waits on watch words that ended
  // because a word was ready, and ones that looked their fill (approximate
  // when several threads of the process wait at once).
  static uint64_t watch_waits_ready();
  static uint64_t watch_waits_expired();
  // Test counters of this executor (written by the thread running its op,
  // read once the ops are done): run_exchange calls answered in its own
  // polls, handed over to the general loop (a late peer), and run by run()
  // (more than kExchangeMaxBytes, no fingerprints, or a message the
  // transport could not take whole).
  struct ExchangeCounts {
    uint64_t answered = 0, handed_over = 0, general = 0;
  };
  const ExchangeCounts& exchange_counts() const { return exchange_counts_; }
  // Test counters of this executor: ops run() took on its short path
  // (run_short) and finished there, ones that handed at least one phase to
  // the general loop, and phases finished whole on the short path after an
  // earlier phase of their op was handed over (resumed).
  struct ShortCounts {
    uint64_t answered = 0, handed_over = 0, resumed = 0;
  };
  const ShortCounts& short_counts() const { return short_counts_; }
  // Tests: the copies into scratch chosen by scratch_stores_, and how many of
  // their pieces streamed.
  struct ScratchCopies {
    uint64_t copies = 0, streamed_pieces = 0;
  };
  const ScratchCopies& scratch_copies() const { return scratch_copies_; }
  // ---- diag: in-band fingerprint of the next run() (nullptr = none); the
  // object must stay valid during run().
  void set_fingerprint(const diag::Fingerprint* fp) { fp_ = fp; }
  // ---- diag: bookkeeping the caller took off the op's critical path (the
  // flight recorder's entry of an op run at issue): `fn(ctx)` runs at the
  // op's first poll that finds nothing to do, i.e. once every message it
  // could send is out and it waits for its peers (run_exchange: once it has
  // waited kLongWaitPolls polls), or at flush_deferred().
  void defer_until_idle(void (*fn)(void*), void* ctx) {
    deferred_fn_ = fn;
    deferred_ctx_ = ctx;
  }
  void flush_deferred() {
    if (!deferred_fn_) return;
    auto* fn = deferred_fn_;
    deferred_fn_ = nullptr;
    fn(deferred_ctx_);
  }
  // Whether the bookkeeping was still deferred at the op's end (it never
  // waited long); the caller takes it back and does it itself.
  bool take_deferred() {
    const bool had = deferred_fn_ != nullptr;
    deferred_fn_ = nullptr;
    return had;
  }
  ~Executor();

 private:
  struct Active {
    const Step* step;
    Connection* conn;
    std::byte* dst;          // recv destination
    const std::byte* src;    // send source or recv_reduce local operand
    size_t total = 0;        // bytes
    size_t done = 0;
    size_t hdr_left = 0;     // diag: fingerprint bytes still to send / receive first
    bool coalesced = false;  // diag: header and data travel as one message (small data)
    bool staged = false;     // diag: the coalesced data is in the header's stage buffer
  };
  Status run_phase(const Phase& ph, std::vector<std::byte*>& bufs, DataType dt, RedOp op, Deadline deadline,
                   const std::string& what, size_t phase_index, size_t nphases);
  // The phase loop: progresses active_ (and overlapped_) until done, failed,
  // aborted or past the deadline.
  Status drive(std::vector<std::byte*>& bufs, DataType dt, RedOp op, Deadline deadline, const std::string& what,
               size_t phase_index, size_t nphases);
  void run_overlapped(std::vector<std::byte*>& bufs, size_t es);
  // A transfer step's progress record, its buffers resolved.
  Active make_active(const Step& s, Connection* c, std::vector<std::byte*>& bufs, size_t es);
  // A local step (copy, reduce, divide) as run_phase runs it.
  void run_local(const Step& s, std::vector<std::byte*>& bufs, DataType dt, RedOp op);
  // run() for ops whose transfers are all small first contacts
  // (RankSchedule::short_path, at most kExchangeMaxBytes each, fingerprints
  // on): phase by phase, each send written whole with its header in one
  // try (Connection::send_gather) and each receive taken whole if it is
  // there, without run_phase's and drive()'s set-up per phase. A phase with
  // a transfer left (a late peer, a full channel) goes to drive() with the
  // finished ones marked done (finish_short_phase); the next phase starts
  // the short way again.
  Status run_short(const RankSchedule& sched, std::vector<std::byte*>& bufs, DataType dt, RedOp op, Deadline deadline,
                   const std::string& what);
  Status finish_short_phase(const RankSchedule& sched, size_t i, uint64_t done, std::vector<std::byte*>& bufs,
                            DataType dt, RedOp op, Deadline deadline, const std::string& what);
  // Polls of run_exchange before it hands over to drive(): ranks with a core
  // each (fast_wait_) poll a while, oversubscribed ones look once.
  static constexpr int kExchangePolls = 256;
  // From this poll on run_exchange's op waits a while: it rings the peers'
  // owed doorbells (a fence) and does the deferred bookkeeping. Most small
  // answers come sooner: the op is then recorded whole at its end, with
  // one clock read (CommImpl::run_sub).
  static constexpr int kLongWaitPolls = 16;
  Status ensure_scratch(size_t bytes);
  // The schedule's scratch (if it has any), grown as needed, as bufs[kBufScratch].
  Status provide_scratch(const RankSchedule& sched, size_t es, std::vector<std::byte*>& bufs);
  // ---- diag: fingerprint header handling (see diag/fingerprint.h)
  void arm_fingerprint(Active& a);  // for a Step::first_contact transfer
  std::byte* stage(int peer);        // hdr_out_[peer], allocated on first use
  void send_fingerprint(Active& a, bool& moved);
  Status recv_fingerprint(Active& a, bool& moved);
  // A receive-reduce's arithmetic: dst = local OP incoming, or incoming OP
  // local when the step puts the peer's partial first (Step::incoming_first).
  void reduce_received(const Step& s, std::byte* dst, const std::byte* local, const std::byte* incoming, size_t count,
                       DataType dt, RedOp op) {
    if (s.incoming_first) mem_->reduce(dst, incoming, local, count, dt, op);
    else mem_->reduce(dst, local, incoming, count, dt, op);
  }
  // A whole small message (fingerprint header, then the step's data) in
  // place in the transport: checks the header, lands the data (copy or
  // reduction with `local`) and consumes it. Inline: drive() runs it on its
  // per-poll path.
  Status land_whole(const Step& s, Connection* c, std::span<const std::byte> msg, std::byte* dst,
                    const std::byte* local, DataType dt, RedOp op, const std::string& what) {
    Status fst = fp_->check(s.peer, s.count, msg.data());
    if (!fst.is_ok()) return Status(fst.code(), what + ": " + fst.message());
    const std::byte* data = msg.data() + diag::kFingerprintBytes;
    if (s.kind == StepKind::kRecv) mem_->copy(dst, data, msg.size() - diag::kFingerprintBytes);
    else reduce_received(s, dst, local, data, s.count, dt, op);
    c->recv_consume(msg.size(), msg.size());
    return Status::ok();
  }
  void publish_progress();
  bool wait_on_watches();

  // Idle waits on the transports' watch words (Connection::recv_watch)
  // instead of whole polls (not when oversubscribed: those ranks yield).
  bool fast_wait_ = false;
  static constexpr int kFastWaitPolls = 64;   // idle polls that may wait on watches
  static constexpr int kFastWaitLooks = 64;   // looks at the watch words per such poll

  ExchangeCounts exchange_counts_;
  ShortCounts short_counts_;
  bool short_path_ = true;  // LOOM_SHORT_PATH
  // Copies into scratch that peers read through a mapping: a staged block
  // (direct broadcast / all_gather with ranks sharing cores) was last read by
  // ranks that may sit on another die, where cached stores wait for each
  // line (core/shared_stores.h; performance.md Run 43). In pieces of
  // kScratchPieceBytes, each timed.
  void copy_into_scratch(std::byte* dst, const std::byte* src, size_t bytes);
  static constexpr size_t kScratchPieceBytes = 256 << 10;
  SharedStores scratch_stores_{SharedStores::configured()};
  ScratchCopies scratch_copies_;
  int rank_, nranks_;
  Transport* transport_;
  MemoryBackend* mem_;
  const std::atomic<bool>* abort_;
  int spin_;
  std::chrono::microseconds spin_time_;  // poll at least this long before sleeping (LOOM_SPIN_US)
  int yield_mask_;  // sched_yield every (yield_mask_ + 1) idle polls
  std::byte* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::vector<Active> active_;
  std::vector<const Step*> overlapped_;  // this phase's Step::overlap copies, run after the first pass
  std::vector<uint64_t> send_gate_, recv_gate_;
  uint64_t iter_ = 0;
  ExecProgress progress_;
  // ---- diag: fingerprint state (the messages that carry it: Step::first_contact)
  const diag::Fingerprint* fp_ = nullptr;
  void (*deferred_fn_)(void*) = nullptr;
  void* deferred_ctx_ = nullptr;
  bool reduced_class_ = false;  // RankSchedule::reduced_class of the running op
  // Plain receives of at least this many bytes land with streaming stores
  // (LOOM_COPY_STREAM_BYTES; 0 = never).
  uint64_t stream_bytes_ = 0;
  // Small first messages travel with the header as one message (one doorbell,
  // one wake-up): header + up to kCoalesceBytes of data, staged per peer.
  static constexpr size_t kCoalesceBytes = 4096;
  std::vector<std::vector<std::byte>> hdr_out_;
  std::vector<std::array<std::byte, diag::kFingerprintBytes>> hdr_in_;
};

}  // namespace loom
