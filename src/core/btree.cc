#include "core/btree.h"

#include <algorithm>

namespace loom {

TreeNode btree_node(int n, int pos) {
  TreeNode t;
  if (n <= 1) return t;
  if (pos == 0) {
    t.child[1] = floor_pow2(n - 1);
  } else {
    const int b = pos & -pos;
    int up = (pos & (2 * b)) ? pos - b : pos + b;
    if (up >= n) up = pos - b;
    t.parent = up;
    if (b >= 2) {
      t.child[0] = pos - b / 2;
      int c = b / 2;
      while (c >= 1 && pos + c >= n) c /= 2;
      if (c >= 1) t.child[1] = pos + c;
    }
  }
  for (int p = t.parent; p >= 0; p = btree_node(n, p).parent) ++t.depth;
  return t;
}

int btree_depth(int n) {
  int d = 0;
  for (int i = 0; i < n; ++i) d = std::max(d, btree_node(n, i).depth);
  return d;
}

}  // namespace loom
