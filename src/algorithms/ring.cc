// Ring family: ring allreduce (= ring reduce-scatter then ring all-gather,
// composed over the same block layout, in pipelined slices), ring
// reduce_scatter, ring all_gather, and the pipelined chain (a ring cut open
// at the root) for broadcast and reduce.
//
// Within one step, a block streams through the transport's FIFO while the
// receiver reduces it, so sender copy and receiver reduce overlap; chain
// broadcast/reduce additionally split the data into chunks so consecutive
// ranks work on consecutive chunks at once.
#include <algorithm>

#include "algorithms/algorithms.h"
#include "algorithms/patterns.h"

namespace loom {
using namespace patterns;  // NOLINT: step builders and rank arithmetic

Result<RankSchedule> ring_allreduce(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  if (n == 1) return local_only(a, a.count, "ring");
  RankSchedule s;
  s.algorithm = "ring";
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  auto off = [&](int b) { return block_offset(a.count, n, b); };
  // Each block goes in slices of the pipelining chunk (NCCL's loop of ring
  // steps): slice i takes its 2(n-1) steps in phases i .. i+2n-3, so a
  // phase forwards slices reduced (or received) one phase earlier, while
  // they are still in this core's cache, next to the steps of newer
  // slices. With whole blocks (one slice: the cost model's chunk unless a
  // block outgrows a core's cache on one host) this is reduce-scatter then
  // all-gather, one step per phase. Unsliced, a step re-read the block the
  // previous step wrote whole, from memory beyond a cache's size. Measured,
  // 2 ranks, `-z 1`, us out of place / in place, whole halves against 256
  // KiB slices (performance.md Run 26): 16 MiB medians of 5 2234 / 1870 ->
  // 2222 / 1552, 64 MiB 9630 / 8458 -> 9021 / 5877, 256 MiB 46076 / 37200
  // -> 38862 / 28042.
  const auto cols = make_columns([&](int b) { return off(b); }, n, chunk_elems(a));
  const int owned = mod(r + 1, n);  // fully reduced here after the reduce-scatter steps
  emit_column_phases(s, Phase{}, cols.count(), 2 * static_cast<size_t>(n - 1), [&](Phase& p, size_t i, int k) {
    if (k < n - 1) {
      // Reduce-scatter step k: send block r-k (ours raw at k = 0, else the
      // partial sum reduced at step k-1), reduce block r-k-1 on receipt.
      const int sb = mod(r - k, n), rb = mod(r - k - 1, n);
      cols.pieces(sb, sb + 1, i, [&](size_t o, size_t m) {
        p.steps.push_back(send_to_reduce_step(next, {k == 0 ? kBufSend : kBufRecv, o}, m));
      });
      cols.pieces(rb, rb + 1, i, [&](size_t o, size_t m) {
        p.steps.push_back(recv_reduce_step(prev, {kBufSend, o}, {kBufRecv, o}, m));
      });
      return;
    }
    // All-gather step k-(n-1) of the owned blocks; avg divides the owned
    // slice exactly once, before it is forwarded, so every rank ends with
    // identical bits.
    const int g = k - (n - 1), sb = mod(r + 1 - g, n), rb = mod(r - g, n);
    if (g == 0 && a.op == RedOp::kAvg)
      cols.pieces(owned, owned + 1, i, [&](size_t o, size_t m) { p.steps.push_back(divide_step({kBufRecv, o}, m)); });
    cols.pieces(sb, sb + 1, i, [&](size_t o, size_t m) { p.steps.push_back(send_step(next, {kBufRecv, o}, m)); });
    cols.pieces(rb, rb + 1, i, [&](size_t o, size_t m) { p.steps.push_back(recv_step(prev, {kBufRecv, o}, m)); });
  });
  return s;
}

Result<RankSchedule> ring_reduce_scatter(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  const size_t c = a.count;
  if (n == 1) {
    RankSchedule s = local_only(a, c, "ring");
    return s;
  }
  RankSchedule s;
  s.algorithm = "ring";
  if (c == 0) return s;
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  // Partial sums alternate between two scratch blocks so the block being
  // forwarded is never the one being written in the same step.
  s.scratch_count = n > 2 ? 2 * c : 0;
  for (int k = 0; k < n - 1; ++k) {
    Phase p;
    int sb = mod(r - k - 1, n), rb = mod(r - k - 2, n);
    BufRef src = k == 0 ? BufRef{kBufSend, sb * c} : BufRef{kBufScratch, ((k - 1) % 2) * c};
    p.steps.push_back(send_to_reduce_step(next, src, c));
    BufRef dst = (k == n - 2) ? BufRef{kBufRecv, 0} : BufRef{kBufScratch, (k % 2) * c};
    p.steps.push_back(recv_reduce_step(prev, {kBufSend, rb * c}, dst, c));
    push_phase(s, std::move(p));
  }
  if (a.op == RedOp::kAvg) {
    Phase p;
    p.steps.push_back(divide_step({kBufRecv, 0}, c));
    push_phase(s, std::move(p));
  }
  return s;
}

Result<RankSchedule> ring_all_gather(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  const size_t c = a.count;
  RankSchedule s;
  s.algorithm = "ring";
  if (c == 0) return s;
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  Phase first;
  // In place (send == recv + r*c) the executor sees src == dst and skips it.
  // Our own block leaves from the input, so the copy overlaps the first step.
  first.steps.push_back(overlapped_copy_step({kBufSend, 0}, {kBufRecv, r * c}, c));
  for (int k = 0; k < n - 1; ++k) {
    Phase p = k == 0 ? std::move(first) : Phase{};
    int sb = mod(r - k, n), rb = mod(r - k - 1, n);
    p.steps.push_back(send_step(next, k == 0 ? BufRef{kBufSend, 0} : BufRef{kBufRecv, sb * c}, c));
    p.steps.push_back(recv_step(prev, {kBufRecv, rb * c}, c));
    push_phase(s, std::move(p));
  }
  if (n == 1) push_phase(s, std::move(first));
  return s;
}

Result<RankSchedule> chain_broadcast(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  RankSchedule s;
  s.algorithm = "chain";
  if (a.count == 0) return s;
  const bool is_root = r == a.root;
  if (n == 1) return local_only(a, a.count, "chain");
  const size_t chunk = chunk_elems(a);
  const size_t nchunks = (a.count + chunk - 1) / chunk;
  const int pos = mod(r - a.root, n);
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  auto csz = [&](size_t k) { return std::min(chunk, a.count - k * chunk); };
  // Position i receives chunk k in phase k+i-1 and forwards it in phase k+i.
  const size_t nphases = nchunks + n - 2;
  for (size_t ph = 0; ph < nphases; ++ph) {
    Phase p;
    // The root sends from its input, so its own copy overlaps the sends.
    if (is_root && ph == 0 && !a.in_place) p.steps.push_back(overlapped_copy_step({kBufSend, 0}, {kBufRecv, 0}, a.count));
    if (pos < n - 1 && ph >= static_cast<size_t>(pos) && ph - pos < nchunks) {
      size_t k = ph - pos;
      p.steps.push_back(send_step(next, {is_root ? kBufSend : kBufRecv, k * chunk}, csz(k)));
    }
    if (pos > 0 && ph + 1 >= static_cast<size_t>(pos) && ph + 1 - pos < nchunks) {
      size_t k = ph + 1 - pos;
      p.steps.push_back(recv_step(prev, {kBufRecv, k * chunk}, csz(k)));
    }
    push_phase(s, std::move(p));
  }
  return s;
}

Result<RankSchedule> chain_reduce(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  RankSchedule s;
  s.algorithm = "chain";
  if (a.count == 0) return s;
  const bool is_root = r == a.root;
  if (n == 1) return local_only(a, a.count, "chain");
  const size_t chunk = chunk_elems(a);
  const size_t nchunks = (a.count + chunk - 1) / chunk;
  // Chain root+1 -> root+2 -> ... -> root; the root reduces last.
  const int pos = mod(r - a.root - 1, n);
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  auto csz = [&](size_t k) { return std::min(chunk, a.count - k * chunk); };
  const BufId acc = is_root ? kBufRecv : kBufScratch;
  if (!is_root && pos > 0) s.scratch_count = a.count;
  const size_t nphases = nchunks + n - 2;
  for (size_t ph = 0; ph < nphases; ++ph) {
    Phase p;
    if (pos < n - 1 && ph >= static_cast<size_t>(pos) && ph - pos < nchunks) {
      size_t k = ph - pos;
      p.steps.push_back(send_to_reduce_step(next, {pos == 0 ? kBufSend : acc, k * chunk}, csz(k)));
    }
    if (pos > 0 && ph + 1 >= static_cast<size_t>(pos) && ph + 1 - pos < nchunks) {
      size_t k = ph + 1 - pos;
      p.steps.push_back(recv_reduce_step(prev, {kBufSend, k * chunk}, {acc, k * chunk}, csz(k)));
    }
    push_phase(s, std::move(p));
  }
  if (is_root && a.op == RedOp::kAvg) {
    Phase p;
    p.steps.push_back(divide_step({kBufRecv, 0}, a.count));
    push_phase(s, std::move(p));
  }
  return s;
}

}  // namespace loom
