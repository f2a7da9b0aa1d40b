#include "algorithms/interpreter.h"

#include <fmt/format.h>

#include <cstring>
#include <deque>
#include <map>
#include <memory>

#include "algorithms/matching.h"
#include "kernels/host_reduce.h"

namespace loom {
namespace {

struct Message {
  std::vector<std::byte> data;
  MessageTag tag;  // matching.h: what the receive is checked against
};

struct RankState {
  size_t phase = 0;
  bool posted = false;
  std::vector<bool> done;  // per step of the current phase
};

}  // namespace

void apply_local_step(const Step& s, std::byte* dst, const std::byte* src, const std::byte* src2, DataType dt, RedOp op,
                      int nranks) {
  const size_t bytes = s.count * dtype_size(dt);
  switch (s.kind) {
    case StepKind::kCopy:
      if (dst != src) std::memmove(dst, src, bytes);
      break;
    case StepKind::kReduce: kernels::reduce2(dst, src, src2, s.count, dt, op); break;
    case StepKind::kDivide: kernels::divide(dst, dst, s.count, dt, static_cast<uint64_t>(nranks)); break;
    default: break;
  }
}

Status interpret(const std::vector<RankSchedule>& schedules, std::vector<std::vector<std::byte*>> bufs, DataType dt,
                 RedOp op, const std::vector<std::vector<size_t>>& elems) {
  const int n = static_cast<int>(schedules.size());
  const size_t es = dtype_size(dt);
  if (static_cast<int>(bufs.size()) != n) return invalid_argument("interpret: one buffer table per rank needed");
  std::vector<std::unique_ptr<std::byte[]>> scratch(n);
  for (int r = 0; r < n; ++r) {
    if (bufs[r].size() <= kBufScratch) bufs[r].resize(kBufScratch + 1, nullptr);
    if (!bufs[r][kBufScratch] && schedules[r].scratch_count) {
      scratch[r] = std::make_unique<std::byte[]>(schedules[r].scratch_count * es);
      std::memset(scratch[r].get(), 0x7f, schedules[r].scratch_count * es);  // not zeros: see interpreter.h
      bufs[r][kBufScratch] = scratch[r].get();
    }
  }
  auto resolve = [&](int r, BufRef b, size_t count, const char* what) -> Result<std::byte*> {
    if (b.buf >= bufs[r].size() || !bufs[r][b.buf])
      return internal_error(fmt::format("rank {}: {} refers to buffer {} which does not exist", r, what, b.buf));
    if (b.buf == kBufScratch && b.offset + count > schedules[r].scratch_count)
      return internal_error(fmt::format("rank {}: {} overruns scratch ({} + {} > {})", r, what, b.offset, count,
                                        schedules[r].scratch_count));
    if (b.buf != kBufScratch && static_cast<size_t>(r) < elems.size() && b.buf < elems[r].size() &&
        b.offset + count > elems[r][b.buf])
      return internal_error(fmt::format("rank {}: {} overruns buffer {} ({} + {} > {} elements)", r, what, b.buf,
                                        b.offset, count, elems[r][b.buf]));
    return bufs[r][b.buf] + b.offset * es;
  };
  std::map<std::pair<int, int>, std::deque<Message>> queues;
  std::vector<RankState> st(n);
  for (;;) {
    bool progress = false, all_done = true;
    for (int r = 0; r < n; ++r) {
      RankState& rs = st[r];
      const auto& phases = schedules[r].phases;
      if (rs.phase >= phases.size()) continue;
      all_done = false;
      const Phase& ph = phases[rs.phase];
      if (!rs.posted) {
        rs.done.assign(ph.steps.size(), false);
        // Local steps, in order (overlapped copies after the sends, below).
        auto run_local = [&](const Step& s) -> Status {
          LOOM_ASSIGN_OR_RETURN(std::byte * dst, resolve(r, s.dst, s.count, "local step dst"));
          std::byte* src = nullptr;
          std::byte* src2 = nullptr;
          if (s.kind != StepKind::kDivide) {
            LOOM_ASSIGN_OR_RETURN(src, resolve(r, s.src, s.count, "local step src"));
          }
          if (s.kind == StepKind::kReduce) {
            LOOM_ASSIGN_OR_RETURN(src2, resolve(r, s.src2, s.count, "local step src2"));
          }
          apply_local_step(s, dst, src, src2, dt, op, n);
          return Status::ok();
        };
        for (size_t i = 0; i < ph.steps.size(); ++i) {
          const Step& s = ph.steps[i];
          if (is_comm_step(s.kind) || s.overlap) continue;
          LOOM_RETURN_IF_ERROR(run_local(s));
          rs.done[i] = true;
        }
        // An overlapped copy runs while the transfers are in flight: it must not
        // write what any of them touches, nor read what a receive writes.
        for (size_t i = 0; i < ph.steps.size(); ++i) {
          const Step& o = ph.steps[i];
          if (!o.overlap || o.count == 0) continue;
          if (o.kind != StepKind::kCopy)
            return internal_error(fmt::format("rank {} phase {}: only copies can overlap ('{}')", r, rs.phase, describe(o)));
          LOOM_ASSIGN_OR_RETURN(std::byte * od, resolve(r, o.dst, o.count, "overlapped dst"));
          LOOM_ASSIGN_OR_RETURN(std::byte * os, resolve(r, o.src, o.count, "overlapped src"));
          if (od == os) continue;  // in place: nothing is copied
          for (const Step& c : ph.steps) {
            if (!is_comm_step(c.kind) || c.count == 0) continue;
            const bool is_send = c.kind == StepKind::kSend;
            LOOM_ASSIGN_OR_RETURN(std::byte * cb, resolve(r, is_send ? c.src : c.dst, c.count, "step"));
            auto hits_at = [&](const std::byte* base, const std::byte* p) {
              return p < base + c.count * es && base < p + o.count * es;
            };
            auto hits = [&](const std::byte* p) { return hits_at(cb, p); };
            bool conflict = hits(od) || (!is_send && hits(os));
            if (c.kind == StepKind::kRecvReduce) {  // its local operand is read while the copy writes
              LOOM_ASSIGN_OR_RETURN(std::byte * cs, resolve(r, c.src, c.count, "step"));
              conflict = conflict || hits_at(cs, od);
            }
            if (conflict)
              return internal_error(fmt::format("rank {} phase {}: overlapped '{}' conflicts with '{}'", r, rs.phase,
                                                describe(o), describe(c)));
          }
        }
        // Hazards: a send must not read what a receive of this phase writes,
        // nor a receive-reduce its local operand, and two receives must not
        // write the same bytes.
        for (size_t i = 0; i < ph.steps.size(); ++i) {
          const Step& a = ph.steps[i];
          if (!is_comm_step(a.kind)) continue;
          for (size_t j = 0; j < ph.steps.size(); ++j) {
            const Step& b = ph.steps[j];
            if (i == j || b.kind == StepKind::kSend || !is_comm_step(b.kind) || a.count == 0 || b.count == 0) continue;
            LOOM_ASSIGN_OR_RETURN(std::byte * pb, resolve(r, b.dst, b.count, "step"));
            auto overlaps = [&](const std::byte* pa) { return pa < pb + b.count * es && pb < pa + a.count * es; };
            bool hazard = false;
            if (a.kind == StepKind::kSend || j > i) {  // two receives' destinations: once per pair
              LOOM_ASSIGN_OR_RETURN(std::byte * pa, resolve(r, a.kind == StepKind::kSend ? a.src : a.dst, a.count, "step"));
              hazard = overlaps(pa);
            }
            if (a.kind == StepKind::kRecvReduce) {
              // Its local operand is read while the other receive writes
              // (the executor progresses both at once).
              LOOM_ASSIGN_OR_RETURN(std::byte * ps, resolve(r, a.src, a.count, "step"));
              hazard = hazard || overlaps(ps);
            }
            if (hazard)
              return internal_error(fmt::format("rank {} phase {}: '{}' overlaps '{}' written in the same phase", r,
                                                rs.phase, describe(a), describe(b)));
          }
        }
        for (size_t i = 0; i < ph.steps.size(); ++i) {
          const Step& s = ph.steps[i];
          if (s.kind != StepKind::kSend) continue;
          LOOM_RETURN_IF_ERROR(check_peer(r, rs.phase, s, n));
          LOOM_ASSIGN_OR_RETURN(std::byte * src, resolve(r, s.src, s.count, "send src"));
          Message m{std::vector<std::byte>(src, src + s.count * es), message_tag(s, rs.phase)};
          queues[{r, s.peer}].push_back(std::move(m));
          rs.done[i] = true;
        }
        for (size_t i = 0; i < ph.steps.size(); ++i) {
          if (!ph.steps[i].overlap) continue;
          LOOM_RETURN_IF_ERROR(run_local(ph.steps[i]));
          rs.done[i] = true;
        }
        rs.posted = true;
        progress = true;
      }
      // Receives, matched in order per peer.
      std::map<int, bool> blocked_peer;
      for (size_t i = 0; i < ph.steps.size(); ++i) {
        const Step& s = ph.steps[i];
        if (rs.done[i] || (s.kind != StepKind::kRecv && s.kind != StepKind::kRecvReduce)) continue;
        LOOM_RETURN_IF_ERROR(check_peer(r, rs.phase, s, n));
        if (blocked_peer[s.peer]) continue;
        auto& q = queues[{s.peer, r}];
        if (q.empty()) {
          blocked_peer[s.peer] = true;
          continue;
        }
        Message m = std::move(q.front());
        q.pop_front();
        LOOM_RETURN_IF_ERROR(check_receive(r, rs.phase, s, m.tag));
        LOOM_ASSIGN_OR_RETURN(std::byte * dst, resolve(r, s.dst, s.count, "recv dst"));
        if (s.kind == StepKind::kRecv) {
          std::memcpy(dst, m.data.data(), m.data.size());
        } else {
          LOOM_ASSIGN_OR_RETURN(std::byte * local, resolve(r, s.src, s.count, "recv_reduce local"));
          if (s.incoming_first) kernels::reduce2(dst, m.data.data(), local, s.count, dt, op);
          else kernels::reduce2(dst, local, m.data.data(), s.count, dt, op);
        }
        rs.done[i] = true;
        progress = true;
      }
      bool phase_done = true;
      for (bool d : rs.done) phase_done = phase_done && d;
      if (phase_done) {
        rs.phase++;
        rs.posted = false;
        progress = true;
      }
    }
    if (all_done) break;
    if (!progress) {
      std::string why = "deadlock: every rank is blocked;";
      for (int r = 0; r < n; ++r) {
        if (st[r].phase >= schedules[r].phases.size()) {
          why += fmt::format(" rank {} done;", r);
          continue;
        }
        const Phase& ph = schedules[r].phases[st[r].phase];
        for (size_t i = 0; i < ph.steps.size(); ++i)
          if (!st[r].done[i]) {
            why += fmt::format(" rank {} phase {} waits on '{}';", r, st[r].phase, describe(ph.steps[i]));
            break;
          }
      }
      return internal_error(why);
    }
  }
  for (const auto& [key, q] : queues)
    if (!q.empty())
      return internal_error(fmt::format("{} message(s) from rank {} to rank {} were never received", q.size(),
                                        key.first, key.second));
  return Status::ok();
}

}  // namespace loom
