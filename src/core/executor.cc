#include "core/executor.h"

#include <fmt/format.h>
#include <immintrin.h>

#include "core/config.h"

namespace loom {

Executor::Executor(int rank, int nranks, Transport* transport, MemoryBackend* mem, const std::atomic<bool>* abort)
    : rank_(rank),
      nranks_(nranks),
      transport_(transport),
      mem_(mem),
      abort_(abort),
      spin_(params::spin_count()),
      send_gate_(nranks, 0),
      recv_gate_(nranks, 0) {}

Executor::~Executor() { mem_->release(scratch_, scratch_bytes_); }

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
  if (sched.scratch_count) {
    LOOM_RETURN_IF_ERROR(ensure_scratch(sched.scratch_count * es));
    if (bufs.size() <= kBufScratch) bufs.resize(kBufScratch + 1, nullptr);
    bufs[kBufScratch] = scratch_;
  }
  progress_.nphases.store(static_cast<int>(sched.phases.size()), std::memory_order_relaxed);
  for (size_t i = 0; i < sched.phases.size(); ++i) {
    progress_.phase.store(static_cast<int>(i), std::memory_order_relaxed);
    LOOM_RETURN_IF_ERROR(run_phase(sched.phases[i], bufs, dt, op, deadline, what, i, sched.phases.size()));
  }
  progress_.phase.store(-1, std::memory_order_relaxed);
  return Status::ok();
}

Status Executor::run_phase(const Phase& ph, std::vector<std::byte*>& bufs, DataType dt, RedOp op, Deadline deadline,
                           const std::string& what, size_t phase_index, size_t nphases) {
  const size_t es = dtype_size(dt);
  auto ptr = [&](BufRef b) { return bufs[b.buf] + b.offset * es; };
  active_.clear();
  for (const Step& s : ph.steps) {
    switch (s.kind) {
      case StepKind::kCopy: mem_->copy(ptr(s.dst), ptr(s.src), s.count * es); break;
      case StepKind::kReduce: mem_->reduce(ptr(s.dst), ptr(s.src), ptr(s.src2), s.count, dt, op); break;
      case StepKind::kDivide: mem_->divide(ptr(s.dst), s.count, dt, static_cast<uint64_t>(nranks_)); break;
      default: {
        if (s.count == 0) break;
        Connection* c = transport_->connection(s.peer);
        if (!c)
          return internal_error(fmt::format("{}: rank {} has no connection to rank {}", what, rank_, s.peer));
        Active a{&s, c, nullptr, nullptr, s.count * es, 0};
        if (s.kind == StepKind::kSend) a.src = ptr(s.src);
        else a.dst = ptr(s.dst);
        if (s.kind == StepKind::kRecvReduce) a.src = ptr(s.src);
        active_.push_back(a);
      }
    }
  }
  if (active_.empty()) return Status::ok();

  int idle = 0;
  auto last_peer_check = Clock::now();
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
        if (s.kind == StepKind::kRecv && mem_->host_accessible()) {
          // Plain receive: let the transport land bytes directly (single copy).
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
          else mem_->reduce(a.dst + a.done, a.src + a.done, span.data(), span.size() / es, dt, op);
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
    if (all_done) return Status::ok();
    if (moved) {
      idle = 0;
      continue;
    }
    if (++idle < spin_) {
      _mm_pause();
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
    auto describe_wait = [&]() {
      return fmt::format("{}: phase {}/{} waiting on '{}' ({} of {} bytes done)", what, phase_index + 1, nphases,
                         describe(*waiting->step), waiting->done, waiting->total);
    };
    if (abort_ && abort_->load(std::memory_order_relaxed)) return aborted_error(describe_wait() + "; communicator aborted");
    auto now = Clock::now();
    if (now - last_peer_check > std::chrono::milliseconds(100) || now >= deadline) {
      last_peer_check = now;
      for (const Active& a : active_) {
        if (a.done == a.total) continue;
        Status st = transport_->check_peer(a.step->peer);
        if (!st.is_ok()) return Status(st.code(), describe_wait() + ": " + st.message());
      }
    }
    if (now >= deadline) return timeout_error(describe_wait() + "; deadline (LOOM_TIMEOUT) passed");
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
    transport_->wait_events(ev, std::min(left, std::chrono::microseconds(50000)));
    idle = spin_ / 2;  // after a wake-up, spin a little before sleeping again
  }
}

}  // namespace loom
