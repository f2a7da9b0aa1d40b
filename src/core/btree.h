// Shapes shared by the schedules (algorithms/) and the cost model
// (topology/cost_model.cc), which prices each position's work: the binary
// tree of the tree schedules and the fold of the recursive ones.
#pragma once

namespace loom {

inline int floor_pow2(int p) {
  int v = 1;
  while (v * 2 <= p) v *= 2;
  return v;
}

// Fold of a non-power-of-two group for recursive algorithms (MPICH's variant,
// Thakur/Rabenseifner/Gropp 2005): with p2 = floor_pow2(n) and e = n - p2,
// the first 2e members pair up (2i, 2i+1); the even one ("extra") hands its
// data to the odd one and sits out; the p2 remaining members ("core") are
// renumbered 0..p2-1 in rank order. We fold the *first* 2e members rather
// than the last so that core numbers stay monotone in rank (the canonical
// operand order of algorithms/patterns.h relies on it) and each core member covers a contiguous
// range of original members (all_gather / reduce_scatter blocks stay contiguous).
struct Fold {
  int n = 1, p2 = 1, extra = 0;
  bool is_extra(int i) const { return i < 2 * extra && i % 2 == 0; }
  // Core number of member i (-1 for an extra member).
  int core_of(int i) const { return is_extra(i) ? -1 : (i < 2 * extra ? i / 2 : i - extra); }
  // Member of core number c.
  int member_of(int c) const { return c < extra ? 2 * c + 1 : c + extra; }
  // First original member covered by core number c, and how many (1 or 2).
  int first_member(int c) const { return c < extra ? 2 * c : c + extra; }
  int members(int c) const { return c < extra ? 2 : 1; }
};
inline Fold make_fold(int n) {
  Fold f;
  f.n = n;
  f.p2 = floor_pow2(n);
  f.extra = n - f.p2;
  return f;
}

// A binary tree over positions 0..n-1 rooted at position 0, as in NCCL's
// btree: leaves are the odd positions, so a second tree whose positions are
// mirrored (odd n) or shifted by one (even n) makes (almost) every leaf of one
// tree an interior node of the other, and each rank sends about as much as in
// a ring. Depth is ceil(log2 n).
struct TreeNode {
  int parent = -1;           // position, -1 at the root
  int child[2] = {-1, -1};   // positions, -1 = none; child[0] < position < child[1]
  int depth = 0;
};
TreeNode btree_node(int n, int pos);
int btree_depth(int n);  // the largest depth of any position

// The double binary tree (allreduce): tree A has rank = position, tree B (as
// NCCL) shifts positions by one for odd n and mirrors them for even n, so
// A's leaves (odd positions) are interior nodes of B and vice versa (rank 0
// excepted for odd n). The position of `rank` in tree B:
int dbtree_second_pos(int n, int rank);
// The busiest rank's share of one allreduce over both trees, each tree
// carrying half the data, in halves: `sends` one up and one per child in
// each tree (2 at n = 2: n bytes, as in a ring; 4 for most larger n: 2n),
// `reduces` one per child (1 at n = 2, 2 for most larger n).
struct DbtreeLoad {
  int sends = 0;
  int reduces = 0;
};
DbtreeLoad dbtree_max_load(int n);

}  // namespace loom
