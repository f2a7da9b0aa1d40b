#include "core/btree.h"

#include <algorithm>

namespace loom {

namespace {

// The parent position of `pos` (> 0) in the tree over n positions.
int btree_parent(int n, int pos) {
  const int b = pos & -pos;
  int up = (pos & (2 * b)) ? pos - b : pos + b;
  if (up >= n) up = pos - b;
  return up;
}

}  // namespace

TreeNode btree_node(int n, int pos) {
  TreeNode t;
  if (n <= 1) return t;
  if (pos == 0) {
    t.child[1] = floor_pow2(n - 1);
  } else {
    const int b = pos & -pos;
    t.parent = btree_parent(n, pos);
    if (b >= 2) {
      t.child[0] = pos - b / 2;
      int c = b / 2;
      while (c >= 1 && pos + c >= n) c /= 2;
      if (c >= 1) t.child[1] = pos + c;
    }
  }
  // Walk up by parents alone: asking btree_node for each ancestor computed
  // that ancestor's depth too, 2^depth calls (4096 ranks: seconds at init).
  for (int p = t.parent; p >= 0; p = p == 0 ? -1 : btree_parent(n, p)) ++t.depth;
  return t;
}

int dbtree_second_pos(int n, int rank) { return (n % 2) ? (rank + n - 1) % n : n - 1 - rank; }

DbtreeLoad dbtree_max_load(int n) {
  auto children = [n](int pos) {
    const TreeNode t = btree_node(n, pos);
    return (t.child[0] >= 0) + (t.child[1] >= 0);
  };
  auto has_parent = [n](int pos) { return btree_node(n, pos).parent >= 0 ? 1 : 0; };
  DbtreeLoad most;
  for (int r = 0; r < n; ++r) {
    const int b = dbtree_second_pos(n, r);
    most.sends = std::max(most.sends, children(r) + has_parent(r) + children(b) + has_parent(b));
    most.reduces = std::max(most.reduces, children(r) + children(b));
  }
  return most;
}

int btree_depth(int n) {
  int d = 0;
  for (int i = 0; i < n; ++i) d = std::max(d, btree_node(n, i).depth);
  return d;
}

}  // namespace loom
