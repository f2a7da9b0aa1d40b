// The binary tree shape shared by the tree schedules (algorithms/tree.cc)
// and the cost model (topology/cost_model.cc), which prices each position's
// work.
#pragma once

namespace loom {

inline int floor_pow2(int p) {
  int v = 1;
  while (v * 2 <= p) v *= 2;
  return v;
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
