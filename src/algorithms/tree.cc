// Tree family: double binary tree allreduce (Sanders, Speck & Träff 2009; NCCL
// 2.4), pipelined binary-tree broadcast and reduce, binomial broadcast
// (pipelined in chunks like the trees; one chunk = whole message per step)
// and binomial reduce (pipelined in chunks too, patterns.cc; far-first on
// one host).
//
// Pipelining: the data of a tree is cut into chunks and every rank works on a
// global clock of phases. With D the depth of the tree and d a rank's depth:
//   up (reduce):   a rank sends chunk k to its parent in phase k + D - d, so
//                  its children (depth d + 1) delivered chunk k in phase
//                  k + D - d - 1;
//   down (bcast):  a rank sends chunk k to its children in phase k + U + d and
//                  received it from its parent in phase k + U + d - 1, where
//                  U = D when the broadcast follows the reduce (allreduce).
// A message is sent and received in the same phase index on both ends and,
// within a phase, steps are listed tree by tree, so per ordered pair of ranks
// the messages match in order. The first child is reduced on the fly
// (recv_reduce); the second lands in scratch and is folded in by a local step
// at the start of the next phase, so partial sums are always
// (own OP first child) OP second child: a fixed association, deterministic
// run to run, and the allreduce result is computed once (at the root) and
// copied to everyone, so all ranks return identical bits.
#include <algorithm>

#include "algorithms/algorithms.h"
#include "algorithms/patterns.h"

namespace loom {
namespace {

using namespace patterns;

// One rank's view of one tree carrying elements [off, off + count).
struct TreeRole {
  int parent = -1;               // rank
  bool first_child = false;      // the parent reduces this rank's chunks on the fly
  std::vector<int> children;     // ranks, reduction order
  int depth = 0, max_depth = 0;
  size_t off = 0, count = 0;
};

TreeRole role_in(int n, int pos, const std::vector<int>& rank_of_pos, size_t off, size_t count) {
  TreeRole t;
  TreeNode node = btree_node(n, pos);
  if (node.parent >= 0) {
    t.parent = rank_of_pos[static_cast<size_t>(node.parent)];
    const TreeNode up = btree_node(n, node.parent);
    t.first_child = (up.child[0] >= 0 ? up.child[0] : up.child[1]) == pos;
  }
  for (int c : node.child)
    if (c >= 0) t.children.push_back(rank_of_pos[static_cast<size_t>(c)]);
  t.depth = node.depth;
  t.max_depth = btree_depth(n);
  t.off = off;
  t.count = count;
  return t;
}

struct TreeBufs {
  BufRef src;      // this rank's input
  BufRef acc;      // partial sums / result (reduce), received data (bcast)
  BufRef tmp;      // second child's chunk
  bool up = false, down = false;
  bool divide = false;  // avg: the root divides each chunk once
  bool root_copy = false;  // bcast out of place: the root copies send -> recv
};

// Emits the pipelined phases of several trees (on disjoint data) at once.
void emit_trees(RankSchedule& s, const std::vector<TreeRole>& trees, const TreeBufs& b, size_t chunk) {
  int last = 0;
  std::vector<size_t> nchunks;
  for (const TreeRole& t : trees) {
    size_t nc = (t.count + chunk - 1) / chunk;
    nchunks.push_back(nc);
    int span = static_cast<int>(nc) + (b.up ? t.max_depth : 0) + (b.down ? t.max_depth : 0) + 1;
    last = std::max(last, span);
  }
  for (int ph = 0; ph <= last; ++ph) {
    Phase p;
    for (size_t ti = 0; ti < trees.size(); ++ti) {
      const TreeRole& t = trees[ti];
      const long nc = static_cast<long>(nchunks[ti]);
      const int D = t.max_depth, d = t.depth;
      auto in = [&](long k) { return k >= 0 && k < nc; };
      auto off = [&](long k) { return t.off + static_cast<size_t>(k) * chunk; };
      auto csz = [&](long k) { return std::min(chunk, t.count - static_cast<size_t>(k) * chunk); };
      const bool root = t.parent < 0;
      if (ph == 0 && b.root_copy && root && t.count) p.steps.push_back(copy_step(at(b.src, t.off), at(b.acc, t.off), t.count));
      if (b.up) {
        // Local: fold in the second child's chunk received last phase.
        long k = ph - (D - d);
        if (in(k) && t.children.size() > 1) p.steps.push_back(reduce_step(at(b.acc, off(k)), at(b.tmp, off(k)), at(b.acc, off(k)), csz(k)));
        if (in(k) && root && b.divide) p.steps.push_back(divide_step(at(b.acc, off(k)), csz(k)));
        if (in(k) && !root) {
          const BufRef from = at(t.children.empty() ? b.src : b.acc, off(k));
          p.steps.push_back(t.first_child ? send_to_reduce_step(t.parent, from, csz(k)) : send_step(t.parent, from, csz(k)));
        }
        long kr = ph - (D - d - 1);
        if (in(kr)) {
          for (size_t c = 0; c < t.children.size(); ++c) {
            if (c == 0)
              p.steps.push_back(recv_reduce_step(t.children[c], at(b.src, off(kr)), at(b.acc, off(kr)), csz(kr)));
            else
              p.steps.push_back(recv_step(t.children[c], at(b.tmp, off(kr)), csz(kr)));
          }
        }
      }
      if (b.down) {
        const int U = b.up ? D : 0;
        long kr = ph - (U + d - 1);
        if (!root && in(kr)) p.steps.push_back(recv_step(t.parent, at(b.acc, off(kr)), csz(kr)));
        long ks = ph - (U + d);
        // A leaf-only broadcast root sends straight from its input.
        BufRef from = (root && !b.up) ? b.src : b.acc;
        if (in(ks))
          for (int c : t.children) p.steps.push_back(send_step(c, at(from, off(ks)), csz(ks)));
      }
    }
    push_phase(s, std::move(p));
  }
}

}  // namespace

Result<RankSchedule> tree_allreduce(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  if (n == 1) return local_only(a, a.count, "tree");
  RankSchedule s;
  s.algorithm = "tree";
  if (a.count == 0) return s;
  // Tree A: position = rank; tree B: dbtree_second_pos (core/btree.h).
  std::vector<int> rank_a(n), rank_b(n);
  for (int i = 0; i < n; ++i) {
    rank_a[i] = i;
    rank_b[dbtree_second_pos(n, i)] = i;
  }
  const int pos_b = dbtree_second_pos(n, r);
  // With fewer than two chunks' worth of data one tree is enough.
  const size_t half = a.count / 2;
  std::vector<TreeRole> trees;
  if (half == 0) {
    trees.push_back(role_in(n, r, rank_a, 0, a.count));
  } else {
    trees.push_back(role_in(n, r, rank_a, 0, half));
    trees.push_back(role_in(n, pos_b, rank_b, half, a.count - half));
  }
  TreeBufs b;
  b.src = {kBufSend, 0};
  b.acc = {kBufRecv, 0};
  b.tmp = {kBufScratch, 0};
  b.up = b.down = true;
  b.divide = a.op == RedOp::kAvg;
  for (const TreeRole& t : trees)
    if (t.children.size() > 1) s.scratch_count = a.count;
  emit_trees(s, trees, b, chunk_elems(a));
  return s;
}

Result<RankSchedule> tree_broadcast(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  if (n == 1) return local_only(a, a.count, "tree");
  RankSchedule s;
  s.algorithm = "tree";
  if (a.count == 0) return s;
  std::vector<int> rank_of(n);
  for (int i = 0; i < n; ++i) rank_of[i] = (i + a.root) % n;
  TreeBufs b;
  b.src = {kBufSend, 0};
  b.acc = {kBufRecv, 0};
  b.down = true;
  b.root_copy = r == a.root && !a.in_place;
  emit_trees(s, {role_in(n, mod(r - a.root, n), rank_of, 0, a.count)}, b, chunk_elems(a));
  return s;
}

Result<RankSchedule> tree_reduce(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  if (n == 1) return local_only(a, a.count, "tree");
  RankSchedule s;
  s.algorithm = "tree";
  if (a.count == 0) return s;
  std::vector<int> rank_of(n);
  for (int i = 0; i < n; ++i) rank_of[i] = (i + a.root) % n;
  TreeRole t = role_in(n, mod(r - a.root, n), rank_of, 0, a.count);
  TreeBufs b;
  b.src = {kBufSend, 0};
  b.tmp = {kBufScratch, 0};
  // Non-root ranks may have no recv buffer: partial sums live in scratch.
  b.acc = r == a.root ? BufRef{kBufRecv, 0} : BufRef{kBufScratch, a.count};
  b.up = true;
  b.divide = a.op == RedOp::kAvg;
  s.scratch_count = 2 * a.count;
  emit_trees(s, {t}, b, chunk_elems(a));
  return s;
}

Result<RankSchedule> binomial_broadcast(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  if (n == 1) return local_only(a, a.count, "binomial");
  RankSchedule s;
  s.algorithm = "binomial";
  if (a.count == 0) return s;
  // The binomial tree as a tree of emit_trees: position v = rank - root
  // receives from v minus its highest set bit and sends to v + m for every
  // power of two m > v (near-first, as emit_binomial_bcast), largest subtree
  // first. With one chunk (the tuner's choice for this algorithm) this is the
  // whole-message binomial broadcast; smaller chunks pipeline it.
  const int v = mod(r - a.root, n);
  TreeRole t;
  auto rank_at = [&](int pos) { return (pos + a.root) % n; };
  if (v > 0) t.parent = rank_at(v - floor_pow2(v));
  for (int m = 1; m < n; m *= 2)
    if (m > v && v + m < n) t.children.push_back(rank_at(v + m));
  t.depth = __builtin_popcount(static_cast<unsigned>(v));
  for (int pos = 1; pos < n; ++pos) t.max_depth = std::max(t.max_depth, __builtin_popcount(static_cast<unsigned>(pos)));
  t.count = a.count;
  TreeBufs b;
  b.src = {kBufSend, 0};
  b.acc = {kBufRecv, 0};
  b.down = true;
  b.root_copy = r == a.root && !a.in_place;
  emit_trees(s, {t}, b, chunk_elems(a));
  return s;
}

Result<RankSchedule> binomial_reduce(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  if (n == 1) return local_only(a, a.count, "binomial");
  RankSchedule s;
  s.algorithm = "binomial";
  if (a.count == 0) return s;
  const bool root = r == a.root;
  BufRef acc = root ? BufRef{kBufRecv, 0} : BufRef{kBufScratch, 0};
  if (!root) s.scratch_count = a.count;
  // On one host the tree goes far-first (the mirror of binomial_broadcast's):
  // with more ranks than cores, rank r on core r mod cores, the near-first
  // tree's receivers are all of the root's parity, so with 2 cores one core
  // did 10 of the 14 message ends of an 8-rank reduce; far-first splits them
  // 7 / 7 like the chain, at depth 3. Measured, 8 ranks on 2 cores, -z 1, in
  // one process against the chain (--ab): 8 B - 16 KiB 0.41-0.70 of the
  // chain's time far-first, 0.47-0.85 near-first. Across hosts (ranks in
  // blocks per host) near-first keeps the early, numerous steps inside a
  // host; far-first would send a block's ranks across at once.
  const bool one_host = std::all_of(a.host_of_rank.begin(), a.host_of_rank.end(),
                                    [&](int h) { return h == a.host_of_rank.front(); });
  emit_binomial_reduce(s, iota_group(n), a.root, r, {kBufSend, 0}, acc, a.count, one_host, chunk_elems(a));
  // A partial sum leaves from scratch, which the parent could map and read in
  // place (shm, from 256 KiB): the send would then end only once the parent
  // has read it, and with ranks taking turns on the cores the parent is
  // still receiving its other children. Measured, 4 ranks on 2 cores, -z 1,
  // far-first: 256 KiB 64.5 us mapped, 27.7 through the FIFO
  // (LOOM_SHM_MAP_SHARED=0), the chain 41-45; 512 KiB 117-121 / 56-58.
  if (a.oversubscribed)
    for (Phase& ph : s.phases)
      for (Step& st : ph.steps)
        if (st.kind == StepKind::kSend && st.src.buf == kBufScratch) st.unmapped = true;
  if (root && a.op == RedOp::kAvg) {
    Phase p;
    p.steps.push_back(divide_step({kBufRecv, 0}, a.count));
    push_phase(s, std::move(p));
  }
  return s;
}

}  // namespace loom
