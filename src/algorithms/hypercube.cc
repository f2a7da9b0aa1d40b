// Hypercube family: recursive doubling allreduce and all_gather, recursive
// halving reduce_scatter, Rabenseifner allreduce (halving reduce-scatter then
// doubling all-gather) and Bruck all_gather.
//
// Non-power-of-two rank counts use the fold of patterns.h (MPICH's variant:
// the first 2e ranks pair up, the even one hands its data to the odd one
// before the power-of-two core runs and gets its result back afterwards).
// We chose it over Rabenseifner's 3-2 elimination or a Bruck-style
// dissemination because it is the simplest correct one, costs two extra
// messages of the full size only on the 2e folded ranks, and keeps every
// core's data a contiguous range of blocks (one message per exchange).
//
// Direction: ranges must stay contiguous, so recursive doubling (all-gather)
// goes near-first (distance 1, 2, 4 ...) and recursive halving goes
// far-first (distance p/2, p/4 ...), ending with core c owning block c.
//
// Determinism: recursive doubling allreduce combines partners as
// (lower rank) OP (higher rank) on both sides (patterns.h), so every rank
// returns identical bits; halving-based algorithms reduce each block on one
// owner in a fixed order and then copy it, which gives the same guarantee.
#include <algorithm>

#include "algorithms/algorithms.h"
#include "algorithms/patterns.h"

namespace loom {
namespace {

using namespace patterns;

// First original member covered by core number c (c == p2 gives n).
int first_member_or_end(const Fold& f, int c) { return c >= f.p2 ? f.n : f.first_member(c); }

}  // namespace

Result<RankSchedule> hypercube_allreduce(const CollArgs& a) {
  const int n = a.nranks;
  if (n == 1) {
    RankSchedule s = local_only(a, a.count, "hypercube");
    return s;
  }
  RankSchedule s;
  s.algorithm = "hypercube";
  if (a.count == 0) return s;
  s.scratch_count = a.count;
  emit_recursive_doubling_allreduce(s, iota_group(n), a.rank, {kBufSend, 0}, {kBufRecv, 0}, {kBufScratch, 0}, a.count,
                                    a.op == RedOp::kAvg, a.in_place);
  return s;
}

Result<RankSchedule> hypercube_all_gather(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  const size_t c = a.count;
  RankSchedule s;
  s.algorithm = "hypercube";
  if (c == 0) return s;
  const Fold f = make_fold(n);
  const BufRef own{kBufRecv, r * c};
  if (f.is_extra(r)) {
    Phase p;
    p.steps.push_back(copy_step({kBufSend, 0}, own, c));
    p.steps.push_back(send_step(r + 1, {kBufSend, 0}, c));
    push_phase(s, std::move(p));
    Phase q;
    q.steps.push_back(recv_step(r + 1, {kBufRecv, 0}, n * c));
    push_phase(s, std::move(q));
    return s;
  }
  // A rank that folds in an extra one first receives its block; every other
  // rank's first exchange sends just its own block, straight from the input,
  // while its own copy into the output overlaps the exchange (as in the ring).
  const bool folds = r < 2 * f.extra;
  Phase first;
  if (folds) {
    first.steps.push_back(copy_step({kBufSend, 0}, own, c));
    first.steps.push_back(recv_step(r - 1, {kBufRecv, (r - 1) * c}, c));
    push_phase(s, std::move(first));
  } else {
    first.steps.push_back(overlapped_copy_step({kBufSend, 0}, own, c));
  }
  const int core = f.core_of(r);
  const int L2 = log2_exact(f.p2);
  // In columns (patterns.h), as rabenseifner_allreduce's doubling: what a
  // step received, the next sends on while it is still cached.
  const auto cols = make_columns([c](int b) { return static_cast<size_t>(b) * c; }, n, chunk_elems(a));
  emit_column_phases(s, folds ? Phase{} : std::move(first), cols.count(), static_cast<size_t>(L2),
                     [&](Phase& p, size_t i, int j) {
                       const int mask = 1 << j;
                       const int base = core & ~(mask - 1), pbase = (core ^ mask) & ~(mask - 1);
                       const int peer = f.member_of(core ^ mask);
                       const int lo = first_member_or_end(f, base), hi = first_member_or_end(f, base + mask);
                       const int plo = first_member_or_end(f, pbase), phi = first_member_or_end(f, pbase + mask);
                       const bool from_input = mask == 1 && !folds;  // the first exchange: our own block
                       const size_t lo_off = static_cast<size_t>(lo) * c;
                       cols.pieces(lo, hi, i, [&](size_t o, size_t m) {
                         p.steps.push_back(
                             send_step(peer, from_input ? BufRef{kBufSend, o - lo_off} : BufRef{kBufRecv, o}, m));
                       });
                       cols.pieces(plo, phi, i,
                                   [&](size_t o, size_t m) { p.steps.push_back(recv_step(peer, {kBufRecv, o}, m)); });
                     });
  if (r < 2 * f.extra) {
    Phase p;
    p.steps.push_back(send_step(r - 1, {kBufRecv, 0}, n * c));
    push_phase(s, std::move(p));
  }
  return s;
}

Result<RankSchedule> halving_reduce_scatter(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  const size_t c = a.count;
  if (n == 1) return local_only(a, c, "rabenseifner");
  RankSchedule s;
  s.algorithm = "rabenseifner";
  if (c == 0) return s;
  const Fold f = make_fold(n);
  const bool avg = a.op == RedOp::kAvg;
  if (f.is_extra(r)) {
    Phase p;
    p.steps.push_back(send_step(r + 1, {kBufSend, 0}, n * c));
    push_phase(s, std::move(p));
    Phase q;
    q.steps.push_back(recv_step(r + 1, {kBufRecv, 0}, c));
    push_phase(s, std::move(q));
    return s;
  }
  // W: the working copy of all n blocks (partial sums of the current range).
  const BufRef w{kBufScratch, 0};
  s.scratch_count = n * c;
  BufRef cur{kBufSend, 0};
  Phase pending;
  if (r < 2 * f.extra) {
    Phase p;
    p.steps.push_back(recv_step(r - 1, w, n * c));
    push_phase(s, std::move(p));
    pending.steps.push_back(reduce_step(w, {kBufSend, 0}, w, n * c));  // lower rank's data on the left
    cur = w;
  }
  const int core = f.core_of(r);
  // A core of one member ends owning just its block: the last exchange
  // reduces straight into the output (as the ring's last step does) instead
  // of into W and a copy after it. A folded core (two members) keeps the copy.
  const bool one_member = !(r < 2 * f.extra);
  const int L2 = log2_exact(f.p2);
  // In columns (patterns.h), as rabenseifner_allreduce: piece i of every
  // member's block, each column's log2(p2) steps in phases i .. i + log2(p2) - 1.
  const auto cols = make_columns([c](int b) { return static_cast<size_t>(b) * c; }, n, chunk_elems(a));
  const BufRef first = cur;
  emit_column_phases(s, std::move(pending), cols.count(), static_cast<size_t>(L2), [&](Phase& p, size_t i, int j) {
    const int mask = f.p2 >> (j + 1);
    const int base = core & ~(2 * mask - 1);
    const bool upper = core & mask;
    const int keep_lo = upper ? base + mask : base, give_lo = upper ? base : base + mask;
    const int k0 = first_member_or_end(f, keep_lo), k1 = first_member_or_end(f, keep_lo + mask);
    const int g0 = first_member_or_end(f, give_lo), g1 = first_member_or_end(f, give_lo + mask);
    const int peer = f.member_of(core ^ mask);
    const BufRef src = j == 0 ? first : w;
    const bool in_output = mask == 1 && one_member;  // kept: this rank's block alone
    cols.pieces(g0, g1, i, [&](size_t o, size_t m) { p.steps.push_back(send_to_reduce_step(peer, at(src, o), m)); });
    cols.pieces(k0, k1, i, [&](size_t o, size_t m) {
      const BufRef dst = in_output ? BufRef{kBufRecv, o - static_cast<size_t>(k0) * c} : at(w, o);
      p.steps.push_back(recv_reduce_step(peer, at(src, o), dst, m));
    });
  });
  pending = Phase{};
  // The output, or W, now holds the finished block(s) of this core's member(s).
  if (!one_member) pending.steps.push_back(copy_step(at(w, r * c), {kBufRecv, 0}, c));
  if (avg) pending.steps.push_back(divide_step({kBufRecv, 0}, c));
  if (r < 2 * f.extra) {
    if (avg) pending.steps.push_back(divide_step(at(w, (r - 1) * c), c));
    pending.steps.push_back(send_step(r - 1, at(w, (r - 1) * c), c));
  }
  push_phase(s, std::move(pending));
  return s;
}

Result<RankSchedule> rabenseifner_allreduce(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  if (n == 1) return local_only(a, a.count, "rabenseifner");
  RankSchedule s;
  s.algorithm = "rabenseifner";
  if (a.count == 0) return s;
  const Fold f = make_fold(n);
  const BufRef out{kBufRecv, 0};
  if (f.is_extra(r)) {
    Phase p;
    p.steps.push_back(send_step(r + 1, {kBufSend, 0}, a.count));
    push_phase(s, std::move(p));
    Phase q;
    q.steps.push_back(recv_step(r + 1, out, a.count));
    push_phase(s, std::move(q));
    return s;
  }
  // The vector is cut into p2 blocks; core c ends the halving owning block c.
  // Block b starts at bstart(b); bstart(p2) is the end.
  auto bstart = [&](int b) { return b >= f.p2 ? a.count : block_offset(a.count, f.p2, b); };
  BufRef cur{kBufSend, 0};
  Phase pending;
  if (r < 2 * f.extra) {
    s.scratch_count = a.count;
    Phase p;
    p.steps.push_back(recv_step(r - 1, {kBufScratch, 0}, a.count));
    push_phase(s, std::move(p));
    pending.steps.push_back(reduce_step({kBufScratch, 0}, {kBufSend, 0}, out, a.count));
    cur = out;
  }
  const int core = f.core_of(r);
  const int L2 = log2_exact(f.p2);
  // In columns (patterns.h): column i is a Rabenseifner of its own over piece
  // i of every block, its 2 log2(p2) steps in phases i .. i + 2 log2(p2) - 1.
  // Unsliced, the second halving step re-read the half reduced in the first
  // from memory once that half outgrew the cache. The cost model's chunk is
  // a whole block (one column) unless it does, on one host.
  const auto cols = make_columns(bstart, f.p2, chunk_elems(a));
  const BufRef first = cur;  // the halving's first source: the input, or the fold's sum
  emit_column_phases(s, std::move(pending), cols.count(), 2 * static_cast<size_t>(L2), [&](Phase& p, size_t i, int j) {
    if (j < L2) {
      // Halving, far-first: keep half the current range of blocks, reduce
      // it with the partner's, send the partner the other half.
      const int mask = f.p2 >> (j + 1);
      const int base = core & ~(2 * mask - 1);
      const bool upper = core & mask;
      const int keep_lo = upper ? base + mask : base, give_lo = upper ? base : base + mask;
      const int peer = f.member_of(core ^ mask);
      const BufRef src = j == 0 ? first : out;
      cols.pieces(give_lo, give_lo + mask, i,
                  [&](size_t o, size_t c) { p.steps.push_back(send_to_reduce_step(peer, at(src, o), c)); });
      cols.pieces(keep_lo, keep_lo + mask, i,
                  [&](size_t o, size_t c) { p.steps.push_back(recv_reduce_step(peer, at(src, o), at(out, o), c)); });
      return;
    }
    // All-gather by doubling, the mirror image of the halving; avg divides
    // the owned block's piece once, before it is sent.
    const int mask = 1 << (j - L2);
    if (j == L2 && a.op == RedOp::kAvg)
      cols.pieces(core, core + 1, i, [&](size_t o, size_t c) { p.steps.push_back(divide_step(at(out, o), c)); });
    const int mine = core & ~(mask - 1), theirs = (core ^ mask) & ~(mask - 1);
    const int peer = f.member_of(core ^ mask);
    cols.pieces(mine, mine + mask, i, [&](size_t o, size_t c) { p.steps.push_back(send_step(peer, at(out, o), c)); });
    cols.pieces(theirs, theirs + mask, i,
                [&](size_t o, size_t c) { p.steps.push_back(recv_step(peer, at(out, o), c)); });
  });
  pending = Phase{};
  if (r < 2 * f.extra) pending.steps.push_back(send_step(r - 1, out, a.count));
  push_phase(s, std::move(pending));
  return s;
}

Result<RankSchedule> bruck_all_gather(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  const size_t c = a.count;
  RankSchedule s;
  s.algorithm = "bruck";
  if (c == 0) return s;
  // Block b of the output lives at recv + b*c; Bruck's "position j" is block
  // (r + j) mod n. A run of positions is at most two runs of blocks (split at
  // the wrap), and sender and receiver split the same block run the same way.
  auto add_run = [&](Phase& p, bool send, int peer, int first_block, int nblocks) {
    int b0 = first_block, len1 = std::min(nblocks, n - b0);
    int runs[2][2] = {{b0, len1}, {0, nblocks - len1}};
    for (auto& run : runs) {
      if (run[1] <= 0) continue;
      BufRef ref{kBufRecv, static_cast<size_t>(run[0]) * c};
      size_t cnt = static_cast<size_t>(run[1]) * c;
      p.steps.push_back(send ? send_step(peer, ref, cnt) : recv_step(peer, ref, cnt));
    }
  };
  // The first step sends just this rank's block: from the input, while its
  // copy into the output overlaps the exchange.
  Phase first;
  first.steps.push_back(overlapped_copy_step({kBufSend, 0}, {kBufRecv, r * c}, c));
  if (n == 1) push_phase(s, std::move(first));
  for (int dist = 1; dist < n; dist *= 2) {
    Phase p = dist == 1 ? std::move(first) : Phase{};
    const int cnt = std::min(dist, n - dist);
    if (dist == 1) p.steps.push_back(send_step(mod(r - 1, n), {kBufSend, 0}, c));
    else add_run(p, true, mod(r - dist, n), r, cnt);
    add_run(p, false, mod(r + dist, n), mod(r + dist, n), cnt);
    push_phase(s, std::move(p));
  }
  return s;
}

}  // namespace loom
