#include "core/executor.h"

#include <fmt/format.h>
#include <immintrin.h>
#include <sched.h>
#include <unistd.h>

#include <cstring>

#include "core/config.h"
#include "core/log.h"

namespace loom {

namespace {
// Held doorbells (Transport::hold_doorbells) are released on every way out
// of an op.
struct ReleaseDoorbells {
  Transport* t;
  ~ReleaseDoorbells() { t->release_doorbells(); }
};
// The doorbells a phase's writes owe, paid at its end (before the next
// phase's local steps), on every way out.
struct RingOwed {
  Transport* t;
  ~RingOwed() { t->ring_owed(); }
};
}  // namespace

Executor::Executor(int rank, int nranks, Transport* transport, MemoryBackend* mem, const std::atomic<bool>* abort)
    : rank_(rank),
      nranks_(nranks),
      transport_(transport),
      mem_(mem),
      abort_(abort),
      spin_(params::spin_count()),
      // A rank that has a core to itself keeps polling for a while: a 1 MiB
      // single-copy read takes ~60 us here, and a futex sleep + wake-up on a
      // VM costs about as much again (2-rank broadcast 1 MiB: 105 -> 65 us).
      // Oversubscribed, polling would steal the peer's core: sleep early.
      spin_time_(params::spin_us() >= 0 ? params::spin_us()
                 : params::oversubscribed(nranks) ? 0 : 200),
      // Oversubscribed (more ranks than CPUs): yield often so the peer we wait
      // for gets the core; otherwise rarely (a yield is a syscall).
      yield_mask_(params::oversubscribed(nranks) ? 7 : 127),
      send_gate_(nranks, 0),
      recv_gate_(nranks, 0),
      hdr_out_(nranks),
      hdr_in_(nranks) {
  stream_bytes_ = params::copy_stream_bytes();
  short_path_ = params::short_path();
  // Oversubscribed ranks yield instead (the peer may need this core).
  fast_wait_ = !params::oversubscribed(nranks);
}

Executor::~Executor() { mem_->release(scratch_, scratch_bytes_); }

Status Executor::provide_scratch(const RankSchedule& sched, size_t es, std::vector<std::byte*>& bufs) {
  if (!sched.scratch_count) return Status::ok();
  LOOM_RETURN_IF_ERROR(ensure_scratch(sched.scratch_count * es));
  if (bufs.size() <= kBufScratch) bufs.resize(kBufScratch + 1, nullptr);
  bufs[kBufScratch] = scratch_;
  return Status::ok();
}

Status Executor::ensure_scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return Status::ok();
  // Persistent and grown geometrically: no allocation (or page faults) per op.
  size_t want = std::max(bytes, scratch_bytes_ * 2);
  LOOM_ASSIGN_OR_RETURN(void* p, mem_->allocate(want));
  mem_->release(scratch_, scratch_bytes_);
  scratch_ = static_cast<std::byte*>(p);
  scratch_bytes_ = want;
  return Status::ok();
}

Status Executor::run(const RankSchedule& sched, std::vector<std::byte*>& bufs, DataType dt, RedOp op,
                     Deadline deadline, const std::string& what) {
  const size_t es = dtype_size(dt);
  if (short_path_ && sched.short_path && fp_ && !fp_->per_peer() && sched.max_transfer_count * es <= kExchangeMaxBytes)
    return run_short(sched, bufs, dt, op, deadline, what);
  LOOM_RETURN_IF_ERROR(provide_scratch(sched, es, bufs));
  // diag: which messages carry the op's fingerprint is marked in the
  // schedule (Step::first_contact); both ends must mark theirs.
  if (fp_ && !sched.contacts_marked)
    return internal_error(fmt::format("{}: schedule '{}' has no fingerprint marks (mark_first_contacts)", what,
                                      sched.algorithm));
  progress_.nphases.store(static_cast<int>(sched.phases.size()), std::memory_order_relaxed);
  reduced_class_ = sched.reduced_class;
  progress_.nslots.store(0, std::memory_order_relaxed);
  // The op's writes owe their doorbells until the phase waits or ends
  // (Transport::hold_doorbells): a send does not stall until its cache line
  // has left this core; the line moves while the rank polls for its peers.
  // Not when oversubscribed: there the peers sleep early, and a wake-up a
  // poll late costs more than the fence.
  if (fast_wait_) transport_->hold_doorbells();
  ReleaseDoorbells release{transport_};
  for (size_t i = 0; i < sched.phases.size(); ++i) {
    progress_.phase.store(static_cast<int>(i), std::memory_order_relaxed);
    Status st = run_phase(sched.phases[i], bufs, dt, op, deadline, what, i, sched.phases.size());
    if (!st.is_ok()) {
      // The caller frees `bufs` once this returns, but a transfer may still
      // be in them: a socket progress thread on a posted window, a peer
      // reading by single copy. Announcing the failure fences both (the
      // transports' contract) before we return. CommImpl::execute announced
      // it right after anyway; calibration (LOOM_TUNE_CALIBRATE) and the
      // hand-off probe, whose buffers are their own, did not. Regression: a
      // failed calibration freed its buffers under the progress threads, and
      // its peers never learned of the failure (Calibration.AFailedRunTellsThePeers).
      transport_->announce_abort(st.to_string());
      return st;
    }
  }
  progress_.phase.store(-1, std::memory_order_relaxed);
  return Status::ok();
}

Status Executor::run_phase(const Phase& ph, std::vector<std::byte*>& bufs, DataType dt, RedOp op, Deadline deadline,
                           const std::string& what, size_t phase_index, size_t nphases) {
  const size_t es = dtype_size(dt);
  RingOwed ring{transport_};
  active_.clear();
  overlapped_.clear();
  for (const Step& s : ph.steps) {
    switch (s.kind) {
      case StepKind::kCopy:
        if (s.overlap) overlapped_.push_back(&s);  // after the transfers are posted
        else run_local(s, bufs, dt, op);
        break;
      case StepKind::kReduce:
      case StepKind::kDivide: run_local(s, bufs, dt, op); break;
      default: {
        if (s.count == 0) break;
        Connection* c = transport_->connection(s.peer);
        if (!c)
          return internal_error(fmt::format("{}: rank {} has no connection to rank {}", what, rank_, s.peer));
        Active a = make_active(s, c, bufs, es);
        if (s.first_contact && fp_) arm_fingerprint(a);  // diag
        active_.push_back(a);
      }
    }
  }
  // A phase of sends only leaves this thread idle while the peers copy:
  // say so, so a single-copy transport can share the copying with us.
  bool only_sends = !active_.empty() && overlapped_.empty();
  for (const Active& a : active_) only_sends = only_sends && a.step->kind == StepKind::kSend;
  for (const Active& a : active_)
    if (a.step->kind == StepKind::kSend) a.conn->set_sender_idle(only_sends);
  if (active_.empty()) {
    run_overlapped(bufs, es);
    return Status::ok();
  }
  return drive(bufs, dt, op, deadline, what, phase_index, nphases);
}

Executor::Active Executor::make_active(const Step& s, Connection* c, std::vector<std::byte*>& bufs, size_t es) {
  auto ptr = [&](BufRef b) { return bufs[b.buf] + b.offset * es; };
  Active a{&s, c, nullptr, nullptr, s.count * es, 0};
  if (s.kind == StepKind::kSend) a.src = ptr(s.src);
  else a.dst = ptr(s.dst);
  if (s.kind == StepKind::kRecvReduce) a.src = ptr(s.src);
  return a;
}

void Executor::run_local(const Step& s, std::vector<std::byte*>& bufs, DataType dt, RedOp op) {
  const size_t es = dtype_size(dt);
  auto ptr = [&](BufRef b) { return bufs[b.buf] + b.offset * es; };
  switch (s.kind) {
    case StepKind::kCopy:
      if (s.dst.buf == kBufScratch) copy_into_scratch(ptr(s.dst), ptr(s.src), s.count * es);
      else mem_->copy(ptr(s.dst), ptr(s.src), s.count * es);
      break;
    case StepKind::kReduce: mem_->reduce(ptr(s.dst), ptr(s.src), ptr(s.src2), s.count, dt, op); break;
    case StepKind::kDivide: mem_->divide(ptr(s.dst), s.count, dt, static_cast<uint64_t>(nranks_)); break;
    default: break;
  }
}

void Executor::copy_into_scratch(std::byte* dst, const std::byte* src, size_t bytes) {
  // Large copies stream anyway (LOOM_COPY_STREAM_BYTES), device memory is
  // not ours to store into, small ones are not worth timing, and ranges that
  // overlap need the backend's memmove.
  const bool overlap = dst < src + bytes && src < dst + bytes;
  if (!mem_->host_accessible() || bytes < SharedStores::kMeasureBytes || (stream_bytes_ > 0 && bytes >= stream_bytes_) ||
      overlap) {
    mem_->copy(dst, src, bytes);
    return;
  }
  const uint64_t switches = scratch_stores_.switches();
  ++scratch_copies_.copies;
  scratch_copies_.streamed_pieces += scratch_stores_.copy(dst, src, bytes, kScratchPieceBytes);
  if (scratch_stores_.switches() != switches)
    LOOM_INFO(kLogShm, "rank {}: cached copies into scratch at {:.1f} GB/s: {} stores", rank_,
              scratch_stores_.last_gbps(), scratch_stores_.streaming() ? "streaming" : "cached");
}

void Executor::run_overlapped(std::vector<std::byte*>& bufs, size_t es) {
  for (const Step* s : overlapped_)
    mem_->copy(bufs[s->dst.buf] + s->dst.offset * es, bufs[s->src.buf] + s->src.offset * es, s->count * es);
  overlapped_.clear();
}

Status Executor::drive(std::vector<std::byte*>& bufs, DataType dt, RedOp op, Deadline deadline,
                       const std::string& what, size_t phase_index, size_t nphases) {
  const size_t es = dtype_size(dt);
  int idle = 0;
  // Read the clock only once the phase has to wait (most small phases don't).
  Clock::time_point last_peer_check{}, spin_until{};
  // Armed for sleeping (Transport::arm_wait): peers ring our doorbell only then.
  struct Arm {
    Transport* t;
    bool on = false;
    void set(bool want) {
      if (want == on) return;
      on = want;
      if (on) t->arm_wait();
      else t->disarm_wait();
    }
    ~Arm() { set(false); }
  } arm{transport_};
  for (;;) {
    const uint32_t ev = transport_->events();
    bool moved = false, all_done = true;
    ++iter_;
    for (Active& a : active_) {
      if (a.done == a.total) continue;
      const Step& s = *a.step;
      if (s.kind == StepKind::kSend) {
        // Messages to one peer leave in schedule order.
        if (send_gate_[s.peer] == iter_) {
          all_done = false;
          continue;
        }
        a.conn->set_send_reduced(s.peer_reduces || reduced_class_);
        a.conn->set_send_mappable(!s.unmapped);
        a.conn->set_send_announced(s.announced);
        // ---- diag: the op's fingerprint goes out before its first bytes to this peer
        if (a.hdr_left) {
          send_fingerprint(a, moved);
          if (a.hdr_left) {
            send_gate_[s.peer] = iter_;
            all_done = false;
            continue;
          }
        }
        // ---- end diag
        while (a.done < a.total) {
          size_t n = a.conn->send_some(a.src + a.done, a.total - a.done);
          if (n == 0) break;
          a.done += n;
          moved = true;
        }
        if (a.done < a.total) {
          send_gate_[s.peer] = iter_;
          all_done = false;
        }
      } else {
        if (recv_gate_[s.peer] == iter_) {
          all_done = false;
          continue;
        }
        a.conn->set_recv_reduced(s.kind == StepKind::kRecvReduce || reduced_class_);
        a.conn->set_recv_announced(s.announced);
        // ---- diag: consume and check the peer's fingerprint before its first bytes
        if (a.hdr_left) {
          if (a.coalesced && a.hdr_left == diag::kFingerprintBytes) {
            // Fast path, here rather than in a call (its prologue, epilogue
            // and Status return, on every poll): the whole small message is
            // in and contiguous: check the header in place and land the data
            // (one consume, one doorbell).
            const size_t len = diag::kFingerprintBytes + a.total;
            auto span = a.conn->recv_peek(len);
            if (span.empty()) {  // the usual poll while the peer is on its way
              recv_gate_[s.peer] = iter_;
              all_done = false;
              continue;
            }
            if (span.size() == len) {
              LOOM_RETURN_IF_ERROR(land_whole(s, a.conn, span, a.dst, a.src, dt, op, what));
              a.hdr_left = 0;
              a.done = a.total;
              moved = true;
              continue;
            }
          }
          Status fst = recv_fingerprint(a, moved);
          if (!fst.is_ok()) return Status(fst.code(), what + ": " + fst.message());
          if (a.hdr_left) {
            recv_gate_[s.peer] = iter_;
            all_done = false;
            continue;
          }
        }
        // ---- end diag
        if (s.kind == StepKind::kRecv && mem_->host_accessible()) {
          // Plain receive: let the transport land bytes directly (single copy).
          a.conn->set_recv_stream(stream_bytes_ > 0 && a.total >= stream_bytes_);
          while (a.done < a.total) {
            size_t n = a.conn->recv_into(a.dst + a.done, a.total - a.done);
            if (n == 0) break;
            a.done += n;
            moved = true;
          }
        }
        while (a.done < a.total) {
          size_t remaining = a.total - a.done;
          auto span = a.conn->recv_peek(remaining);
          if (span.empty()) break;
          if (s.kind == StepKind::kRecv) mem_->copy(a.dst + a.done, span.data(), span.size());
          else reduce_received(s, a.dst + a.done, a.src + a.done, span.data(), span.size() / es, dt, op);
          a.conn->recv_consume(span.size(), remaining);
          a.done += span.size();
          moved = true;
        }
        if (a.done < a.total) {
          recv_gate_[s.peer] = iter_;
          all_done = false;
        }
      }
    }
    if (!overlapped_.empty()) {
      // The first pass posted every send it could (single-copy descriptors,
      // FIFO bytes): the peers are busy, do the overlapped copies now.
      transport_->ring_owed();  // a peer asleep on those bytes should not wait for the copies
      run_overlapped(bufs, es);
      moved = true;
    }
    if (all_done) return Status::ok();
    if (moved) {
      arm.set(false);
      idle = 0;
      spin_until = {};
      continue;
    }
    flush_deferred();  // diag: the sends are out, the op waits: a moment for bookkeeping
    // Peers asleep on what this phase wrote get their doorbells from the
    // second idle poll on (or at the phase's end, if sooner). Not at the
    // first: its fence would wait for the line just written, the very
    // stall held doorbells avoid, and most small answers come within one.
    if (idle > 0) transport_->ring_owed();
    if (++idle == spin_ && spin_time_.count() > 0) {
      // The poll budget is spent; keep polling until the time floor has passed
      // (the clock is read every 64 polls, not every poll).
      auto now = Clock::now();
      if (spin_until == Clock::time_point{}) spin_until = now + spin_time_;
      if (now < spin_until) idle = spin_ - 64;
    }
    if (idle < spin_) {
      // Yield now and then: with more ranks than cores the peer we wait for
      // may need this very core to make progress.
      if ((idle & yield_mask_) == yield_mask_) sched_yield();
      else if (idle > kFastWaitPolls || !wait_on_watches()) _mm_pause();
      continue;
    }
    // Idle: look at abort, deadline and the peers we wait on, then sleep.
    const Active* waiting = nullptr;
    for (const Active& a : active_)
      if (a.done < a.total) {
        waiting = &a;
        break;
      }
    progress_.waiting_peer.store(waiting->step->peer, std::memory_order_relaxed);
    publish_progress();  // diag
    auto describe_wait = [&](const Active* on = nullptr) {
      const Active& w = on ? *on : *waiting;
      return fmt::format("{}: phase {}/{} waiting on '{}' ({} of {} bytes done)", what, phase_index + 1, nphases,
                         describe(*w.step), w.done, w.total);
    };
    if (abort_ && abort_->load(std::memory_order_relaxed)) return aborted_error(describe_wait() + "; communicator aborted");
    auto now = Clock::now();
    if (last_peer_check == Clock::time_point{}) last_peer_check = now;
    if (now - last_peer_check > std::chrono::milliseconds(100) || now >= deadline) {
      last_peer_check = now;
      for (const Active& a : active_) {
        if (a.done == a.total) continue;
        // The step whose peer failed, not the phase's first unfinished one.
        // Regression: a phase waiting on 'recv from 1' and 'send to 2' said
        // "waiting on 'recv ... from rank 1': rank 2 failed" when rank 2 did.
        Status st = transport_->check_peer(a.step->peer);
        if (!st.is_ok()) {
          progress_.waiting_peer.store(a.step->peer, std::memory_order_relaxed);
          return Status(st.code(), describe_wait(&a) + ": " + st.message());
        }
      }
    }
    if (now >= deadline) return timeout_error(describe_wait() + "; deadline (LOOM_TIMEOUT) passed");
    if (!arm.on) {
      // Arm, then poll everything once more: what arrived before arming rang
      // no doorbell, what arrives after does (and ends the sleep at once).
      arm.set(true);
      continue;
    }
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
    transport_->wait_events(ev, std::min(left, std::chrono::microseconds(50000)));
    arm.set(false);
    idle = spin_ / 2;  // after a wake-up, spin a little before sleeping again
    spin_until = Clock::now();  // ... and without the time floor
  }
}

Status Executor::run_short(const RankSchedule& sched, std::vector<std::byte*>& bufs, DataType dt, RedOp op,
                           Deadline deadline, const std::string& what) {
  const size_t es = dtype_size(dt);
  LOOM_RETURN_IF_ERROR(provide_scratch(sched, es, bufs));
  auto ptr = [&](BufRef b) { return bufs[b.buf] + b.offset * es; };
  // Held doorbells, as in run(); owed ones are paid at every phase's end.
  if (fast_wait_) transport_->hold_doorbells();
  ReleaseDoorbells release{transport_};
  bool handed_over = false;
  for (size_t i = 0; i < sched.phases.size(); ++i) {
    const Phase& ph = sched.phases[i];
    bool overlapped = false;
    for (const Step& s : ph.steps) {
      if (is_comm_step(s.kind)) continue;
      if (s.overlap) overlapped = true;  // after the transfers, as in drive()
      else run_local(s, bufs, dt, op);
    }
    // Each transfer whole, in one try: a send written with its header, a
    // receive found whole. Bit k: the phase's k-th transfer is done.
    uint64_t done = 0, mask = 0;
    size_t k = 0;
    for (const Step& s : ph.steps) {
      if (!is_comm_step(s.kind) || s.count == 0) continue;
      const uint64_t bit = uint64_t{1} << k++;
      mask |= bit;
      Connection* c = transport_->connection(s.peer);
      if (!c) {
        Status st = internal_error(fmt::format("{}: rank {} has no connection to rank {}", what, rank_, s.peer));
        transport_->announce_abort(st.to_string());  // as run() does on a failed phase
        return st;
      }
      const size_t bytes = s.count * es;
      if (s.kind == StepKind::kSend) {
        c->set_send_reduced(s.peer_reduces || sched.reduced_class);
        c->set_send_mappable(!s.unmapped);
        c->set_send_announced(s.announced);
        const size_t sent = c->send_gather(fp_->header(), diag::kFingerprintBytes, ptr(s.src), bytes);
        if (sent != Connection::kNoGather && sent != 0) done |= bit;
        continue;
      }
      c->set_recv_reduced(s.kind == StepKind::kRecvReduce || sched.reduced_class);
      c->set_recv_announced(s.announced);
      auto span = c->recv_peek(diag::kFingerprintBytes + bytes);
      if (span.size() != diag::kFingerprintBytes + bytes) continue;
      const std::byte* local = s.kind == StepKind::kRecvReduce ? ptr(s.src) : nullptr;
      if (Status st = land_whole(s, c, span, ptr(s.dst), local, dt, op, what); !st.is_ok()) {
        transport_->announce_abort(st.to_string());  // as run() does on a failed phase
        return st;
      }
      done |= bit;
    }
    if (overlapped) {
      transport_->ring_owed();  // a peer asleep on those messages should not wait for the copies
      for (const Step& s : ph.steps)
        if (s.kind == StepKind::kCopy && s.overlap) run_local(s, bufs, dt, op);
    }
    if (done == mask) {
      transport_->ring_owed();  // as run_phase at a phase's end
      short_counts_.resumed += handed_over;
      continue;
    }
    // A peer is late (or a message did not fit whole): the general loop
    // takes this phase's unfinished transfers; the next phase tries the
    // short way again (a binomial tree's inner rank waits for its parent,
    // then writes to its children at once).
    if (!handed_over) {
      handed_over = true;
      ++short_counts_.handed_over;
      progress_.nphases.store(static_cast<int>(sched.phases.size()), std::memory_order_relaxed);
      progress_.nslots.store(0, std::memory_order_relaxed);
      reduced_class_ = sched.reduced_class;
    }
    if (Status st = finish_short_phase(sched, i, done, bufs, dt, op, deadline, what); !st.is_ok()) {
      transport_->announce_abort(st.to_string());  // see run()
      return st;
    }
  }
  if (handed_over) progress_.phase.store(-1, std::memory_order_relaxed);
  else ++short_counts_.answered;
  return Status::ok();
}

Status Executor::finish_short_phase(const RankSchedule& sched, size_t i, uint64_t done, std::vector<std::byte*>& bufs,
                                    DataType dt, RedOp op, Deadline deadline, const std::string& what) {
  const size_t es = dtype_size(dt);
  RingOwed ring{transport_};
  progress_.phase.store(static_cast<int>(i), std::memory_order_relaxed);
  active_.clear();
  overlapped_.clear();
  size_t k = 0;
  for (const Step& s : sched.phases[i].steps) {
    if (!is_comm_step(s.kind) || s.count == 0) continue;
    Active a = make_active(s, transport_->connection(s.peer), bufs, es);
    if (done & (uint64_t{1} << k++)) a.done = a.total;  // its header went (came) with it
    else arm_fingerprint(a);  // every transfer here is a first contact (short_path)
    active_.push_back(a);
  }
  return drive(bufs, dt, op, deadline, what, i, sched.phases.size());
}

Status Executor::run_exchange(const RankSchedule& sched, std::vector<std::byte*>& bufs, DataType dt, RedOp op,
                              double timeout_s, const std::string& what) {
  const Step& snd = sched.phases[0].steps[0];
  const Step& rcv = sched.phases[0].steps[1];
  const size_t es = dtype_size(dt), bytes = snd.count * es, len = diag::kFingerprintBytes + bytes;
  Connection* c = transport_->connection(snd.peer);
  if (!fp_ || fp_->per_peer() || bytes > kExchangeMaxBytes || !c) {
    ++exchange_counts_.general;
    return run(sched, bufs, dt, op, coarse_deadline_after(timeout_s), what);
  }
  LOOM_RETURN_IF_ERROR(provide_scratch(sched, es, bufs));
  // In place, the exchange reduces into scratch and a second phase copies
  // that into the buffer: a single-copy send may be read until its phase
  // ends, so the schedule writes nothing it sends. This message went out
  // whole before anything is received (or the op runs as run() below):
  // the receive lands where that copy would put it, and the copy goes.
  const Step* folded = nullptr;
  if (sched.phases.size() == 2 && sched.phases[1].steps.size() == 1) {
    const Step& cp = sched.phases[1].steps[0];
    if (cp.kind == StepKind::kCopy && cp.src.buf == rcv.dst.buf && cp.src.offset == rcv.dst.offset &&
        cp.count == rcv.count)
      folded = &cp;
  }
  // The local phases after the exchange (no communication: they cannot
  // wait or fail on a peer).
  auto finish = [&]() {
    for (size_t i = folded ? 2 : 1; i < sched.phases.size(); ++i)
      LOOM_RETURN_IF_ERROR(run_phase(sched.phases[i], bufs, dt, op, Deadline{}, what, i, sched.phases.size()));
    return Status::ok();
  };
  // The send's doorbell is owed, as in run(): a fence right after the write
  // would wait for its lines to leave this core (4 KiB: +0.1 us per op).
  if (fast_wait_) transport_->hold_doorbells();
  ReleaseDoorbells release{transport_};
  c->set_send_reduced(snd.peer_reduces || sched.reduced_class);
  c->set_send_mappable(!snd.unmapped);
  c->set_send_announced(snd.announced);
  const std::byte* src = bufs[snd.src.buf] + snd.src.offset * es;
  // Written before anything of the peer's is read: an in-place op's send
  // reads the buffer its receive then writes, as in run_phase (the send is
  // the phase's first step).
  const size_t sent = c->send_gather(fp_->header(), diag::kFingerprintBytes, src, bytes);
  if (sent == Connection::kNoGather || sent == 0) {  // not whole, or no room yet: nothing went out
    ++exchange_counts_.general;
    return run(sched, bufs, dt, op, coarse_deadline_after(timeout_s), what);
  }
  c->set_recv_reduced(rcv.kind == StepKind::kRecvReduce || sched.reduced_class);
  c->set_recv_announced(rcv.announced);
  const BufRef to = folded ? folded->dst : rcv.dst;
  std::byte* dst = bufs[to.buf] + to.offset * es;
  const std::byte* local = rcv.kind == StepKind::kRecvReduce ? bufs[rcv.src.buf] + rcv.src.offset * es : nullptr;
  const int polls = fast_wait_ ? kExchangePolls : 1;
  for (int i = 0; i < polls; ++i) {
    auto span = c->recv_peek(len);
    if (span.size() == len) {
      if (Status st = land_whole(rcv, c, span, dst, local, dt, op, what); !st.is_ok()) {
        transport_->announce_abort(st.to_string());  // as run() does on a failed phase
        return st;
      }
      ++exchange_counts_.answered;
      return finish();
    }
    if (!span.empty()) break;  // a part of it: the general loop takes it in pieces
    if (i >= kLongWaitPolls) {
      flush_deferred();  // diag: the op waits (run_phase does it at its first idle poll)
      transport_->ring_owed();
    }
    _mm_pause();
  }
  // The peer is late: the general loop waits, with the send already done.
  ++exchange_counts_.handed_over;
  progress_.nphases.store(static_cast<int>(sched.phases.size()), std::memory_order_relaxed);
  progress_.nslots.store(0, std::memory_order_relaxed);
  progress_.phase.store(0, std::memory_order_relaxed);
  reduced_class_ = sched.reduced_class;
  active_.clear();
  overlapped_.clear();
  active_.push_back(Active{&snd, c, nullptr, src, bytes, bytes});
  Active r{&rcv, c, dst, local, bytes, 0};
  r.hdr_left = diag::kFingerprintBytes;
  r.coalesced = true;
  active_.push_back(r);
  Status st = drive(bufs, dt, op, coarse_deadline_after(timeout_s), what, 0, sched.phases.size());
  if (!st.is_ok()) {
    transport_->announce_abort(st.to_string());  // see run()
    return st;
  }
  progress_.phase.store(-1, std::memory_order_relaxed);
  return finish();
}

namespace {
std::atomic<uint64_t> g_watch_ready{0}, g_watch_expired{0};  // test counters, this process
// A plain increment, not a locked one: a locked instruction drains the store
// buffer like a fence, so at the moment a message is seen it would wait for
// this rank's own send (its doorbell held) to leave the core. Measured
// in-process, 2 ranks, 8 B allreduce, slow phase: -1.9..-2.9% per op (5
// runs); 64 B - 1 KiB unchanged. Increments from threads of one process
// that wait at once may be lost (the counts are approximate then).
void bump(std::atomic<uint64_t>& c) { c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
}  // namespace

uint64_t Executor::watch_waits_ready() { return g_watch_ready.load(std::memory_order_relaxed); }
uint64_t Executor::watch_waits_expired() { return g_watch_expired.load(std::memory_order_relaxed); }

// Waits a while on the words the unfinished receives' transports name (one
// load each per look) instead of whole polls (~180 instructions, and a pause
// of ~20 ns on this project's hosts after each): the arrival is seen sooner.
// Measured in-process, 2 ranks, blocking allreduce, host in its slow phase:
// 1-4 KiB -16..-27 ns per op (1.5-3%), 8-256 B 0-6 ns (performance.md Run 22).
// False when some unfinished step is a send or has no watch (poll as usual).
bool Executor::wait_on_watches() {
  if (!fast_wait_) return false;
  constexpr int kMaxWatches = 4;
  Connection::Watch w[kMaxWatches];
  int n = 0;
  for (const Active& a : active_) {
    if (a.done == a.total) continue;
    if (a.step->kind == StepKind::kSend || n == kMaxWatches) return false;
    w[n] = a.conn->recv_watch();
    if (!w[n].word) return false;
    ++n;
  }
  for (int k = 0; k < kFastWaitLooks; ++k) {
    for (int i = 0; i < n; ++i)
      if (w[i].word->load(std::memory_order_acquire) >= w[i].at_least) {
        bump(g_watch_ready);
        return true;
      }
    _mm_pause();  // without it: +40 ns per op at 64 B - 4 KiB (Run 22), +2-6% with held doorbells (Run 25)
  }
  bump(g_watch_expired);
  return true;
}

// ---- diag: fingerprints and recorder progress -----------------------------

void Executor::arm_fingerprint(Active& a) {
  // Both sides decide from the message size, which they agree on whenever
  // their calls match (and when they do not, the header says so first).
  a.coalesced = a.total <= kCoalesceBytes;
  if (a.step->kind != StepKind::kSend) {
    a.hdr_left = diag::kFingerprintBytes;
    return;
  }
  a.hdr_left = diag::kFingerprintBytes + (a.coalesced ? a.total : 0);
  // A send/recv's header names the peer and the message: written into the
  // peer's stage when the send starts (send_fingerprint), not here: every
  // send/recv message carries one, and a phase may hold several to one peer,
  // which go one after another through the same stage.
}

std::byte* Executor::stage(int peer) {
  auto& buf = hdr_out_[peer];
  if (buf.empty()) buf.resize(diag::kFingerprintBytes + kCoalesceBytes);
  return buf.data();
}

void Executor::send_fingerprint(Active& a, bool& moved) {
  const int p = a.step->peer;
  const size_t len = diag::kFingerprintBytes + (a.coalesced ? a.total : 0);
  // Staged once, at the first attempt, after the phase's local steps ran. Not
  // again when that attempt moved nothing: a single-copy peer may already be
  // reading the stage (regression: TSan saw the re-copy race with its read).
  if (!a.staged) {
    // The messages to a peer leave one by one (send_gate_): the one before
    // this one is done with the stage.
    if (fp_->per_peer()) fp_->encode(p, a.step->count, stage(p));
    const std::byte* hdr = fp_->per_peer() ? stage(p) : fp_->header();
    if (a.coalesced) {
      // Header and data written from where they lie, as one message, when
      // the transport can (shm slots and FIFO): no copy into the stage first.
      // Measured, 2 ranks, blocking allreduce: 1 KiB 0.96 -> 0.83 us, 4 KiB
      // 1.34 -> 1.15 (performance.md Run 21). The transport copies both
      // pieces before it returns, so a collective's header goes out of the
      // fingerprint itself, which the next op rewrites.
      const size_t sent = a.conn->send_gather(hdr, diag::kFingerprintBytes, a.src, a.total);
      if (sent != Connection::kNoGather) {
        if (sent == 0) return;  // no room for it whole yet: try again
        a.hdr_left = 0;
        a.done = a.total;
        moved = true;
        return;
      }
    }
    // The header (and a small message's data) from the stage: a transport
    // may still read it after send_some returns (single copy).
    std::byte* st = stage(p);
    if (hdr != st) std::memcpy(st, hdr, diag::kFingerprintBytes);
    if (a.coalesced) std::memcpy(st + diag::kFingerprintBytes, a.src, a.total);
    a.staged = true;
  }
  size_t n = a.conn->send_some(hdr_out_[p].data() + (len - a.hdr_left), a.hdr_left);
  a.hdr_left -= n;
  moved = moved || n > 0;
  if (a.coalesced && a.hdr_left == 0) a.done = a.total;
}

Status Executor::recv_fingerprint(Active& a, bool& moved) {
  // The header in pieces (a large message's, or a small one not yet whole;
  // run_phase checks a whole small one in place).
  const int p = a.step->peer;
  while (a.hdr_left) {
    // A coalesced message holds the header and then the data: the header
    // is only the first part of what is left of it.
    const size_t msg_remaining = a.hdr_left + (a.coalesced ? a.total : 0);
    auto span = a.conn->recv_peek(msg_remaining);
    if (span.empty()) return Status::ok();
    const size_t k = std::min(span.size(), a.hdr_left);
    std::memcpy(hdr_in_[p].data() + (diag::kFingerprintBytes - a.hdr_left), span.data(), k);
    a.conn->recv_consume(k, msg_remaining);
    a.hdr_left -= k;
    moved = true;
  }
  return fp_->check(p, a.step->count, hdr_in_[p].data());
}

void Executor::publish_progress() {
  int n = 0;
  for (const Active& a : active_) {
    if (n == ExecProgress::kMaxSlots) break;
    auto& slot = progress_.slots[n++];
    slot.peer.store(a.step->peer, std::memory_order_relaxed);
    slot.kind.store(static_cast<int>(a.step->kind), std::memory_order_relaxed);
    slot.done.store(a.done, std::memory_order_relaxed);
    slot.total.store(a.total, std::memory_order_relaxed);
  }
  progress_.nslots.store(n, std::memory_order_release);
}

}  // namespace loom
