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

}  // namespace loom
