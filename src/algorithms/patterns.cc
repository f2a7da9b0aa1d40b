#include "algorithms/patterns.h"

#include <algorithm>

#include "core/config.h"

namespace loom::patterns {

Step send_step(int peer, BufRef src, size_t count) {
  Step s;
  s.kind = StepKind::kSend;
  s.peer = peer;
  s.src = src;
  s.count = count;
  return s;
}
Step send_to_reduce_step(int peer, BufRef src, size_t count) {
  Step s = send_step(peer, src, count);
  s.peer_reduces = true;
  return s;
}
Step recv_step(int peer, BufRef dst, size_t count) {
  Step s;
  s.kind = StepKind::kRecv;
  s.peer = peer;
  s.dst = dst;
  s.count = count;
  return s;
}
Step recv_reduce_step(int peer, BufRef local, BufRef dst, size_t count, bool incoming_first) {
  Step s;
  s.kind = StepKind::kRecvReduce;
  s.peer = peer;
  s.src = local;
  s.dst = dst;
  s.count = count;
  s.incoming_first = incoming_first;
  return s;
}
Step copy_step(BufRef src, BufRef dst, size_t count) {
  Step s;
  s.kind = StepKind::kCopy;
  s.src = src;
  s.dst = dst;
  s.count = count;
  return s;
}
Step overlapped_copy_step(BufRef src, BufRef dst, size_t count) {
  Step s = copy_step(src, dst, count);
  s.overlap = true;
  return s;
}
Step reduce_step(BufRef left, BufRef right, BufRef dst, size_t count) {
  Step s;
  s.kind = StepKind::kReduce;
  s.src = left;
  s.src2 = right;
  s.dst = dst;
  s.count = count;
  return s;
}
Step divide_step(BufRef dst, size_t count) {
  Step s;
  s.kind = StepKind::kDivide;
  s.dst = dst;
  s.count = count;
  return s;
}

void push_phase(RankSchedule& s, Phase&& p) {
  if (!p.steps.empty()) s.phases.push_back(std::move(p));
}

RankSchedule local_only(const CollArgs& a, size_t count, const char* name) {
  RankSchedule s;
  s.algorithm = name;
  if (!a.in_place && count > 0) {
    Phase p;
    p.steps.push_back(copy_step({kBufSend, 0}, {kBufRecv, 0}, count));
    push_phase(s, std::move(p));
  }
  return s;
}

size_t chunk_elems(const CollArgs& a) {
  if (a.chunk_elems) return a.chunk_elems;
  return std::max<size_t>(1, params::chunk_bytes() / dtype_size(a.dt));
}

std::vector<int> iota_group(int n) {
  std::vector<int> g(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) g[static_cast<size_t>(i)] = i;
  return g;
}


void emit_binomial_bcast(RankSchedule& s, const std::vector<int>& group, int root, int me, BufRef buf, size_t count) {
  const int m = static_cast<int>(group.size());
  if (m <= 1 || count == 0) return;
  const int rel = mod(me - root, m);
  auto member = [&](int r) { return group[static_cast<size_t>(mod(r + root, m))]; };
  for (int mask = 1; mask < m; mask *= 2) {
    Phase p;
    if (rel < mask && rel + mask < m) p.steps.push_back(send_step(member(rel + mask), buf, count));
    if (rel >= mask && rel < 2 * mask) p.steps.push_back(recv_step(member(rel - mask), buf, count));
    push_phase(s, std::move(p));
  }
}

void emit_binomial_reduce(RankSchedule& s, const std::vector<int>& group, int root, int me, BufRef src, BufRef acc,
                          size_t count) {
  const int m = static_cast<int>(group.size());
  if (count == 0) return;
  const int rel = mod(me - root, m);
  auto member = [&](int r) { return group[static_cast<size_t>(mod(r + root, m))]; };
  bool have_partial = false;  // acc holds own OP children so far
  for (int mask = 1; mask < m; mask *= 2) {
    Phase p;
    if (rel & mask) {
      p.steps.push_back(send_to_reduce_step(member(rel - mask), have_partial ? acc : src, count));
      push_phase(s, std::move(p));
      return;
    }
    if (rel + mask < m) {
      p.steps.push_back(recv_reduce_step(member(rel + mask), have_partial ? acc : src, acc, count));
      have_partial = true;
    }
    push_phase(s, std::move(p));
  }
  // Only the root gets here; with no peers its result is its own input.
  if (!have_partial && (src.buf != acc.buf || src.offset != acc.offset)) {
    Phase p;
    p.steps.push_back(copy_step(src, acc, count));
    push_phase(s, std::move(p));
  }
}

void emit_recursive_doubling_allreduce(RankSchedule& s, const std::vector<int>& group, int me, BufRef src, BufRef dst,
                                       BufRef tmp, size_t count, bool divide_result, bool in_place) {
  const int m = static_cast<int>(group.size());
  if (count == 0) return;
  const Fold f = make_fold(m);
  auto g = [&](int i) { return group[static_cast<size_t>(i)]; };
  if (f.is_extra(me)) {
    // Hand the data to the odd partner, get the final result back.
    Phase p;
    p.steps.push_back(send_to_reduce_step(g(me + 1), src, count));
    push_phase(s, std::move(p));
    Phase q;
    q.steps.push_back(recv_step(g(me + 1), dst, count));
    push_phase(s, std::move(q));
    return;
  }
  auto same = [](BufRef a, BufRef b) { return a.buf == b.buf && a.offset == b.offset; };
  in_place = in_place || same(src, dst);
  // The partial sum lives in `cur`: src at first (never written), then dst
  // and tmp in turn. An exchange sends cur and reduces the partner's message
  // into the other one: a single-copy send may be read until the phase ends,
  // so the phase writes nothing it sends (dst aliases src when in place).
  BufRef cur = src;
  auto next = [&](BufRef c) { return same(c, tmp) ? dst : (same(c, src) && !in_place) ? dst : tmp; };
  Phase pending;  // local steps that open the next phase
  if (me < 2 * f.extra) {
    Phase p;
    // The extra member has the lower rank: its data is the left operand.
    p.steps.push_back(recv_reduce_step(g(me - 1), src, next(src), count, /*incoming_first=*/true));
    push_phase(s, std::move(p));
    cur = next(src);
  }
  const int c = f.core_of(me);
  for (int mask = 1; mask < f.p2; mask *= 2) {
    const int pc = c ^ mask;
    const int peer = g(f.member_of(pc));
    Phase p;
    p.steps.push_back(send_to_reduce_step(peer, cur, count));
    // Canonical order: the lower rank's partial is the left operand on both
    // partners, so both evaluate the same expression bit for bit.
    p.steps.push_back(recv_reduce_step(peer, cur, next(cur), count, /*incoming_first=*/pc < c));
    push_phase(s, std::move(p));
    cur = next(cur);
  }
  if (!same(cur, dst) && !(in_place && same(cur, src))) pending.steps.push_back(copy_step(cur, dst, count));
  if (divide_result) pending.steps.push_back(divide_step(dst, count));
  if (me < 2 * f.extra) pending.steps.push_back(send_step(g(me - 1), dst, count));
  push_phase(s, std::move(pending));
}

}  // namespace loom::patterns
