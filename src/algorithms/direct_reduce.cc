// Direct allreduce for small messages on one node, in the manner of the custom
// allreduce of vLLM / TensorRT-LLM, expressed over the FIFOs:
// - one-shot ("direct"): every rank sends its whole input to every peer and
//   reduces all n inputs itself: one step of latency, (n-1) x the data moved;
// - two-shot ("two_shot"): a direct reduce-scatter (block j goes to rank j,
//   which reduces it) then a direct all-gather of the reduced blocks: two
//   steps, 2(n-1)/n of the data moved per rank.
// Incoming data lands in scratch slots and is reduced by local steps in rank
// order 0, 1, ..., n-1 on every rank ((x0 OP x1) OP x2 ...), so every rank
// (one-shot) or the single owner of a block (two-shot) evaluates the same
// expression: identical bits on all ranks and from run to run.
#include <algorithm>
#include <functional>
#include <string>

#include "algorithms/algorithms.h"
#include "algorithms/patterns.h"

namespace loom {
namespace {

using namespace patterns;

// Local steps dst = data(0) OP data(1) OP ... OP data(n-1), left to right.
void reduce_in_rank_order(Phase& p, int n, const std::function<BufRef(int)>& data, BufRef dst, size_t count) {
  p.steps.push_back(reduce_step(data(0), data(1), dst, count));
  for (int j = 2; j < n; ++j) p.steps.push_back(reduce_step(dst, data(j), dst, count));
}

}  // namespace

// One-shot keeps n copies of the message in scratch: limit it to small messages.
constexpr size_t kOneShotMaxBytes = 4u << 20;

Status one_shot_supports(const CollArgs& a) {
  const size_t bytes = a.count * dtype_size(a.dt);
  if (bytes > kOneShotMaxBytes)
    return not_supported("one-shot allreduce keeps nranks copies in scratch: limited to " +
                         std::to_string(kOneShotMaxBytes) + " bytes per rank, got " + std::to_string(bytes));
  return Status::ok();
}

Result<RankSchedule> one_shot_allreduce(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  const size_t c = a.count;
  if (n == 1) return local_only(a, c, "direct");
  RankSchedule s;
  s.algorithm = "direct";
  if (c == 0) return s;
  s.scratch_count = n * c;
  auto slot = [&](int j) { return BufRef{kBufScratch, static_cast<size_t>(j) * c}; };
  Phase p;
  // In place, the result overwrites the input while it is still an operand.
  if (a.in_place) p.steps.push_back(copy_step({kBufSend, 0}, slot(r), c));
  for (int d = 1; d < n; ++d) {
    p.steps.push_back(send_step(mod(r + d, n), {kBufSend, 0}, c));
    p.steps.push_back(recv_step(mod(r - d, n), slot(mod(r - d, n)), c));
  }
  push_phase(s, std::move(p));
  Phase q;
  auto data = [&](int j) { return j == r && !a.in_place ? BufRef{kBufSend, 0} : slot(j); };
  reduce_in_rank_order(q, n, data, {kBufRecv, 0}, c);
  if (a.op == RedOp::kAvg) q.steps.push_back(divide_step({kBufRecv, 0}, c));
  push_phase(s, std::move(q));
  return s;
}

Result<RankSchedule> two_shot_allreduce(const CollArgs& a) {
  const int n = a.nranks, r = a.rank;
  const size_t c = a.count;
  if (n == 1) return local_only(a, c, "two_shot");
  RankSchedule s;
  s.algorithm = "two_shot";
  if (c == 0) return s;
  auto boff = [&](int j) { return block_offset(c, n, j); };
  auto bsz = [&](int j) { return block_size(c, n, j); };
  const size_t slot_elems = bsz(0);  // the largest block
  s.scratch_count = n * slot_elems;
  auto slot = [&](int j) { return BufRef{kBufScratch, static_cast<size_t>(j) * slot_elems}; };
  const size_t mine = bsz(r);
  // Reduce-scatter: block j of every input goes to rank j.
  Phase p;
  if (a.in_place && mine) p.steps.push_back(copy_step({kBufSend, boff(r)}, slot(r), mine));
  for (int d = 1; d < n; ++d) {
    const int to = mod(r + d, n), from = mod(r - d, n);
    if (bsz(to)) p.steps.push_back(send_step(to, {kBufSend, boff(to)}, bsz(to)));
    if (mine) p.steps.push_back(recv_step(from, slot(from), mine));
  }
  push_phase(s, std::move(p));
  // Reduce the owned block in rank order, then all-gather the blocks.
  Phase q;
  if (mine) {
    auto data = [&](int j) { return j == r && !a.in_place ? BufRef{kBufSend, boff(r)} : slot(j); };
    reduce_in_rank_order(q, n, data, {kBufRecv, boff(r)}, mine);
    if (a.op == RedOp::kAvg) q.steps.push_back(divide_step({kBufRecv, boff(r)}, mine));
  }
  for (int d = 1; d < n; ++d) {
    const int to = mod(r + d, n), from = mod(r - d, n);
    if (mine) q.steps.push_back(send_step(to, {kBufRecv, boff(r)}, mine));
    if (bsz(from)) q.steps.push_back(recv_step(from, {kBufRecv, boff(from)}, bsz(from)));
  }
  push_phase(s, std::move(q));
  return s;
}

}  // namespace loom
