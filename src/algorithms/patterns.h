// Reusable rank arithmetic and step builders for the schedule generators
// (in the spirit of UCC's coll_patterns): binary trees, binomial trees,
// the power-of-two fold used by the recursive (hypercube) algorithms, and
// group-relative emitters that the flat generators and the hierarchical
// composition share.
//
// A "group" is an ordered list of communicator ranks; emitters address peers
// as group[i] and append phases to a RankSchedule, so the same code runs over
// the whole communicator (group = 0..n-1) or over the ranks of one host.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "algorithms/schedule.h"
#include "core/btree.h"

namespace loom::patterns {

inline int mod(int a, int n) { return ((a % n) + n) % n; }
using loom::floor_pow2;
inline int log2_exact(int p) {
  int l = 0;
  while ((1 << l) < p) ++l;
  return l;
}

Step send_step(int peer, BufRef src, size_t count);
// A send whose receiver reduces it (recv_reduce_step there): Step::peer_reduces.
Step send_to_reduce_step(int peer, BufRef src, size_t count);
Step recv_step(int peer, BufRef dst, size_t count);
// dst = local OP incoming, or incoming OP local with incoming_first.
Step recv_reduce_step(int peer, BufRef local, BufRef dst, size_t count, bool incoming_first = false);
Step copy_step(BufRef src, BufRef dst, size_t count);
// A copy_step the executor may overlap with the phase's transfers (Step::overlap).
Step overlapped_copy_step(BufRef src, BufRef dst, size_t count);
Step reduce_step(BufRef left, BufRef right, BufRef dst, size_t count);  // dst = left OP right
Step divide_step(BufRef dst, size_t count);
inline BufRef at(BufRef b, size_t off) { return {b.buf, b.offset + off}; }

// Appends p if it has steps (empty phases are noise in the recorder).
void push_phase(RankSchedule& s, Phase&& p);

// Single-rank schedule: recv = send unless in place.
RankSchedule local_only(const CollArgs& a, size_t count, const char* name);

// Pipelining chunk (elements) from args or LOOM_CHUNK_BYTES.
size_t chunk_elems(const CollArgs& a);

std::vector<int> iota_group(int n);

// Columns (NCCL's loop of steps): a vector cut into blocks, block b spanning
// [start(b), start(b + 1)), each block in pieces of `chunk` elements; column
// i is piece i of every block. A ring or halving/doubling schedule run once
// per column, column i's step j in phase i + j (emit_column_phases), sends in
// each phase what the previous one reduced or received, while it is still in
// the core's cache. One column (chunk >= every block) is the plain schedule.
template <class Start>
struct Columns {
  Start start;  // start(b) for b in [0, nblocks]; start(nblocks) is the vector's end
  int nblocks;
  size_t chunk;
  size_t len(int b) const { return start(b + 1) - start(b); }
  size_t count() const {
    size_t c = 1;
    for (int b = 0; b < nblocks; ++b) c = std::max(c, (len(b) + chunk - 1) / chunk);
    return c;
  }
  // Column i's pieces of blocks [lo, hi), adjacent ones as one: emit(offset, count).
  template <class Emit>
  void pieces(int lo, int hi, size_t i, Emit&& emit) const {
    size_t run0 = 0, run1 = 0;
    for (int b = lo; b < hi; ++b) {
      const size_t s0 = start(b) + std::min(len(b), i * chunk), s1 = start(b) + std::min(len(b), (i + 1) * chunk);
      if (s1 == s0) continue;
      if (run1 > run0 && s0 == run1) {
        run1 = s1;
        continue;
      }
      if (run1 > run0) emit(run0, run1 - run0);
      run0 = s0, run1 = s1;
    }
    if (run1 > run0) emit(run0, run1 - run0);
  }
};
template <class Start>
Columns<Start> make_columns(Start start, int nblocks, size_t chunk) {
  return {start, nblocks, std::max<size_t>(chunk, 1)};
}

// Appends the phases of `cols` columns of `steps` steps each: phase t runs
// step(phase, i, j) for column i's step j = t - i, older columns (later
// steps) first, so both ends of a link list a phase's messages in one order.
// The first phase starts with the steps of `head` (its only one when there
// are no steps).
template <class StepFn>
void emit_column_phases(RankSchedule& s, Phase head, size_t cols, size_t steps, StepFn&& step) {
  if (steps == 0) return push_phase(s, std::move(head));
  for (size_t t = 0; t + 1 < cols + steps; ++t) {
    Phase p = t == 0 ? std::move(head) : Phase{};
    for (size_t i = t >= steps ? t - steps + 1 : 0; i <= t && i < cols; ++i) step(p, i, static_cast<int>(t - i));
    push_phase(s, std::move(p));
  }
}

// The binary tree (core/btree.h): leaves are the odd positions.
using loom::btree_depth;
using loom::btree_node;
using loom::TreeNode;

// Fold: core/btree.h (shared with the cost model).

// Binomial broadcast of count elements at `buf` from group[root] (buf holds
// the data on the root; every other member receives into buf).
void emit_binomial_bcast(RankSchedule& s, const std::vector<int>& group, int root, int me, BufRef buf, size_t count);

// Binomial reduce to group[root]: every member contributes `src`; the result
// lands in `acc` of the root. Non-root members with children also use their
// `acc` as a partial-sum buffer (pass scratch there). Operands are combined
// as (lower relative position) OP (higher), in a fixed order: deterministic.
// Near-first (default): position v sends to v - 2^k at its lowest set bit 2^k,
// so step 1 pairs neighbours. far_first: v sends at its highest set bit, with
// the distances from the largest down, the mirror of emit_binomial_bcast.
// chunk > 0: pipelined in chunks of that many elements (a rank sends chunk
// k up while its children deliver chunk k + 1); 0: whole message per step.
void emit_binomial_reduce(RankSchedule& s, const std::vector<int>& group, int root, int me, BufRef src, BufRef acc,
                          size_t count, bool far_first = false, size_t chunk = 0);

// Recursive-doubling allreduce over the group with the fold above: result in
// `dst` on every member; `in_place`: src and dst are the same memory (also
// when given as different BufRefs, e.g. the send and receive buffers of an
// in-place call); `tmp` must hold count elements; divide_result applies
// kDivide (RedOp::kAvg) once, before the result is handed back to the folded
// members.
// Each exchange reduces the partner's message as it arrives (recv_reduce)
// into a buffer the phase's send does not read (dst and tmp in turn), so no
// copy into scratch and no separate reduce step. Partners combine as (lower
// rank) OP (higher rank) (Step::incoming_first), so both compute the same
// expression and every member ends with identical bits.
void emit_recursive_doubling_allreduce(RankSchedule& s, const std::vector<int>& group, int me, BufRef src, BufRef dst,
                                       BufRef tmp, size_t count, bool divide_result, bool in_place);

}  // namespace loom::patterns
