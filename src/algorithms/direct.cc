// Direct family: every rank exchanges with every peer in one phase.
// all_to_all (each rank sends block j to rank j), broadcast (the root sends
// to every rank at once) and point-to-point groups.
#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "algorithms/algorithms.h"
#include "algorithms/patterns.h"
#include "core/message_class.h"
#include "loom/memory.h"

namespace loom {

namespace {

// all_to_all with rank r sending block r+k to rank r+k and receiving block
// r-k from rank r-k for k = 1..n-1 (staggered, so ranks do not all start with
// rank 0). one_phase: every exchange at once ("direct"); otherwise one
// exchange per phase ("pairwise": one peer at a time, no p-1 -> 1 fan-in, at
// the price of n-1 latency terms; the modular shift works for every n, where
// XOR pairing needs a power of two).
Result<RankSchedule> shifted_all_to_all(const CollArgs& a, bool one_phase, const char* name) {
  const int n = a.nranks, r = a.rank;
  const size_t c = a.count;
  RankSchedule s;
  s.algorithm = name;
  if (c == 0) return s;
  Phase p;
  BufId src = kBufSend;
  if (a.in_place && n > 1) {
    // Blocks are overwritten while being sent: stage the input first.
    s.scratch_count = n * c;
    Step st;
    st.kind = StepKind::kCopy;
    st.src = {kBufSend, 0};
    st.dst = {kBufScratch, 0};
    st.count = n * c;
    p.steps.push_back(st);
    src = kBufScratch;
  }
  // Our own block is copied while the first exchange is in flight (after its
  // sends are posted): no receive writes its destination.
  p.steps.push_back(patterns::overlapped_copy_step({src, r * c}, {kBufRecv, r * c}, c));
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n, from = (r - k + n) % n;
    Step snd;
    snd.kind = StepKind::kSend;
    snd.peer = to;
    snd.src = {src, to * c};
    snd.count = c;
    p.steps.push_back(snd);
    Step rcv;
    rcv.kind = StepKind::kRecv;
    rcv.peer = from;
    rcv.dst = {kBufRecv, from * c};
    rcv.count = c;
    p.steps.push_back(rcv);
    if (!one_phase) s.phases.push_back(std::exchange(p, Phase{}));
  }
  if (!p.steps.empty()) s.phases.push_back(std::move(p));
  return s;
}

}  // namespace

Result<RankSchedule> direct_all_to_all(const CollArgs& a) { return shifted_all_to_all(a, true, "direct"); }

Result<RankSchedule> pairwise_all_to_all(const CollArgs& a) { return shifted_all_to_all(a, false, "pairwise"); }

namespace {

// Whether the direct all_gather's ranks send their `count` elements staged
// in scratch (announced messages, Step::announced): with more ranks than
// cores on shm (CollArgs::stage_min_bytes, 0 elsewhere), from 3 ranks (at 2
// the one message gains nothing from staging) and from stage_min_bytes.
// Every rank computes it alike, which the announced marks on a send and its
// receive need.
bool staged_sends(const CollArgs& a, size_t count) {
  return a.oversubscribed && a.stage_min_bytes > 0 && a.nranks > 2 && count * dtype_size(a.dt) >= a.stage_min_bytes;
}

// Appends the copy of `count` elements of the send buffer into scratch to
// `p` and returns where they are. Scratch is mem_alloc memory, which peers
// can map, only from kMemAllocMinBytes (core/memory.cc): at least that much.
BufRef stage_in_scratch(const CollArgs& a, size_t count, RankSchedule& s, Phase& p) {
  const size_t es = dtype_size(a.dt);
  s.scratch_count = std::max({s.scratch_count, count, (kMemAllocMinBytes + es - 1) / es});
  p.steps.push_back(patterns::copy_step({kBufSend, 0}, {kBufScratch, 0}, count));
  return {kBufScratch, 0};
}

}  // namespace

// Broadcast as a star: the root sends its whole buffer to every other rank in
// one phase; nobody forwards. Its receivers' messages are plain stored ones
// (core/message_class.h), so on shm with more ranks than cores each receiver
// reads the root's buffer with a single copy: n x (p-1) bytes copied in all,
// spread over every core, one hand-off deep, where a tree copies each byte
// into a FIFO and out again at every hop. Through a FIFO the root copies all
// p-1 messages itself, which the cost model prices (cost_model.cc). With
// more ranks than cores and data beyond the cache (stages_broadcast) the root
// stages its buffer once in scratch, as the direct all_gather does (below):
// 1 copy in and a mapped read per receiver, where the FIFOs cost the root
// p-1 copies in and each receiver one out.
Result<RankSchedule> direct_broadcast(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  if (n == 1) return patterns::local_only(a, a.count, "direct");
  RankSchedule s;
  s.algorithm = "direct";
  if (a.count == 0) return s;
  Phase p;
  const double bytes = static_cast<double>(a.count * dtype_size(a.dt));
  const bool stage = a.oversubscribed && stages_broadcast(bytes, n, static_cast<double>(a.stage_min_bytes),
                                                          static_cast<double>(a.stage_cache_bytes));
  if (r == a.root) {
    BufRef src{kBufSend, 0};
    if (stage) src = stage_in_scratch(a, a.count, s, p);
    // The root's own copy runs while its peers read (no transfer writes recv).
    if (!a.in_place) p.steps.push_back(patterns::overlapped_copy_step({kBufSend, 0}, {kBufRecv, 0}, a.count));
    for (int k = 1; k < n; ++k) {
      p.steps.push_back(patterns::send_step((r + k) % n, src, a.count));
      p.steps.back().announced = stage;
    }
  } else {
    p.steps.push_back(patterns::recv_step(a.root, {kBufRecv, 0}, a.count));
    p.steps.back().announced = stage;
  }
  s.phases.push_back(std::move(p));
  return s;
}

// All-gather as n stars: every rank sends its own block to every peer and
// receives every peer's block, all in one phase; nothing is forwarded, and
// a rank waits on no partner's earlier step (recursive doubling: log2(n)
// dependent exchanges, each a turn on a core when ranks share them).
// With more ranks than cores on shm, from CollArgs::stage_min_bytes, the
// block is first copied once into this rank's scratch and sent from there
// marked announced (Step::announced): each peer then reads it through a
// mapping of the scratch, one copy per reader, where a FIFO costs the
// sender a copy per peer and the reader another. Measured, 2 cores,
// against recursive doubling through the FIFOs (performance.md Run 35):
// 8 ranks 1 MiB 210-260 us / 657-910, 4 ranks 4 MiB 403-855 / 1162-1745.
Result<RankSchedule> direct_all_gather(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  const size_t c = a.count;
  RankSchedule s;
  s.algorithm = "direct";
  if (c == 0) return s;
  Phase p;
  const bool stage = staged_sends(a, c);
  const BufRef src = stage ? stage_in_scratch(a, c, s, p) : BufRef{kBufSend, 0};
  // In place (send == recv + r*c) the executor sees src == dst and skips it;
  // out of place, no receive writes block r, so the copy overlaps the reads.
  p.steps.push_back(patterns::overlapped_copy_step({kBufSend, 0}, {kBufRecv, r * c}, c));
  for (int d = 1; d < n; ++d) {
    const int to = patterns::mod(r + d, n), from = patterns::mod(r - d, n);
    p.steps.push_back(patterns::send_step(to, src, c));
    p.steps.back().announced = stage;
    p.steps.push_back(patterns::recv_step(from, {kBufRecv, from * c}, c));
    p.steps.back().announced = stage;
  }
  s.phases.push_back(std::move(p));
  return s;
}

Result<RankSchedule> direct_sendrecv(const CollArgs& a) {
  RankSchedule s;
  s.algorithm = "p2p";
  Phase p;
  // Local steps run before the phase's communication, in this order: the
  // staging copies of every staged send (its source is also a receive's
  // destination, CommImpl::mark_aliased_sends), then the copies of the
  // sends to self. Regression: both were inserted at the front one by one,
  // so the self copies ran first (in reverse order) and a staged send read
  // data a receive from self had already overwritten.
  std::vector<Step> staging, self_copies;
  auto stage = [&](size_t i, size_t count) {
    Step copy;
    copy.kind = StepKind::kCopy;
    copy.src = {kBufUser + static_cast<BufId>(i), 0};
    copy.dst = {kBufScratch, s.scratch_count};
    copy.count = count;
    staging.push_back(copy);
    const BufRef at = copy.dst;
    s.scratch_count += count;
    return at;
  };
  // Sends to self pair, in order, with receives from self: a local copy.
  std::vector<size_t> self_sends, self_recvs;
  for (size_t i = 0; i < a.p2p.size(); ++i) {
    const P2pOp& op = a.p2p[i];
    if (op.peer == a.rank) {
      (op.is_send ? self_sends : self_recvs).push_back(i);
      continue;
    }
    if (op.count == 0) continue;
    Step st;
    st.peer = op.peer;
    st.count = op.count;
    if (op.is_send && op.stage) {
      st.kind = StepKind::kSend;
      st.src = stage(i, op.count);
    } else if (op.is_send) {
      st.kind = StepKind::kSend;
      st.src = {kBufUser + static_cast<BufId>(i), 0};
    } else {
      st.kind = StepKind::kRecv;
      st.dst = {kBufUser + static_cast<BufId>(i), 0};
    }
    p.steps.push_back(st);
  }
  if (self_sends.size() != self_recvs.size())
    return invalid_usage("group has " + std::to_string(self_sends.size()) + " send(s) to self but " +
                         std::to_string(self_recvs.size()) + " recv(s) from self");
  for (size_t k = 0; k < self_sends.size(); ++k) {
    const P2pOp& snd = a.p2p[self_sends[k]];
    const P2pOp& rcv = a.p2p[self_recvs[k]];
    if (snd.count != rcv.count)
      return invalid_usage("send to self of " + std::to_string(snd.count) + " elements matched with recv from self of " +
                           std::to_string(rcv.count));
    if (snd.count == 0) continue;
    Step st;
    st.kind = StepKind::kCopy;
    st.src = snd.stage ? stage(self_sends[k], snd.count) : BufRef{kBufUser + static_cast<BufId>(self_sends[k]), 0};
    st.dst = {kBufUser + static_cast<BufId>(self_recvs[k]), 0};
    st.count = snd.count;
    self_copies.push_back(st);
  }
  staging.insert(staging.end(), self_copies.begin(), self_copies.end());
  p.steps.insert(p.steps.begin(), staging.begin(), staging.end());
  if (!p.steps.empty()) s.phases.push_back(std::move(p));
  return s;
}

}  // namespace loom
