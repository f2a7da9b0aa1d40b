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
                          size_t count, bool far_first, size_t chunk) {
  const int m = static_cast<int>(group.size());
  if (count == 0) return;
  const int rel = mod(me - root, m);
  auto member = [&](int r) { return group[static_cast<size_t>(mod(r + root, m))]; };
  // This position's parent and children, in the order it reduces them.
  // Near-first: rel sends at its lowest set bit, after the children below
  // it (rel + 1, rel + 2, ...). Far-first: at its highest set bit, with the
  // distances from the largest down (the mirror of emit_binomial_bcast).
  int top = 1;
  while (top < m) top *= 2;
  int parent = -1;
  std::vector<int> children;
  for (int step = 1; step < m; step *= 2) {
    const int mask = far_first ? top / 2 / step : step;
    if (far_first ? (rel >= mask && rel < 2 * mask) : (rel & mask) != 0) {
      parent = member(rel - mask);
      break;
    }
    if (rel + mask < m) children.push_back(member(rel + mask));
  }
  // Chunk k: reduce it from each child in turn (own input OP first child,
  // then OP each next: the fixed order of the whole-message tree), then send
  // it up in the phase that starts chunk k + 1, so a rank forwards a chunk
  // while its children deliver the next one.
  const size_t c = chunk == 0 ? count : std::min(chunk, count);
  const size_t nchunks = (count + c - 1) / c;
  auto off = [&](size_t k) { return k * c; };
  auto len = [&](size_t k) { return std::min(c, count - k * c); };
  const BufRef up = children.empty() ? src : acc;
  for (size_t k = 0; k <= nchunks; ++k) {
    const size_t rounds = k < nchunks ? std::max<size_t>(children.size(), 1) : 1;
    for (size_t i = 0; i < rounds; ++i) {
      Phase p;
      if (i == 0 && k > 0 && parent >= 0) p.steps.push_back(send_to_reduce_step(parent, at(up, off(k - 1)), len(k - 1)));
      if (k < nchunks && i < children.size())
        p.steps.push_back(recv_reduce_step(children[i], at(i == 0 ? src : acc, off(k)), at(acc, off(k)), len(k)));
      push_phase(s, std::move(p));
    }
  }
  // The root of a single-member group: its result is its own input.
  if (parent < 0 && children.empty() && (src.buf != acc.buf || src.offset != acc.offset)) {
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
