#include "algorithms/algorithms.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "core/message_class.h"

namespace loom {
namespace {

Status always(const CollArgs&) { return Status::ok(); }

}  // namespace

const std::vector<Algorithm>& all_algorithms() {
  static const std::vector<Algorithm> kAll = {
      {"ring", Collective::kAllReduce, "ring reduce-scatter then ring all-gather; bandwidth-optimal, 2(n-1) steps",
       always, ring_allreduce},
      {"ring", Collective::kReduceScatter, "ring with double-buffered partial sums; n-1 steps", always,
       ring_reduce_scatter},
      {"ring", Collective::kAllGather, "ring forwarding of blocks; n-1 steps", always, ring_all_gather},
      {"chain", Collective::kBroadcast, "pipelined chain from the root (ring cut at the root), chunked", always,
       chain_broadcast},
      {"chain", Collective::kReduce, "pipelined chain ending at the root, chunked", always, chain_reduce},
      {"direct", Collective::kAllToAll, "every rank sends block j to rank j, all peers at once", always,
       direct_all_to_all},
      {"p2p", Collective::kSendRecv, "the group's sends and receives, all at once", always, direct_sendrecv},
      // Issue 5 families (tree.cc, hypercube.cc, direct_reduce.cc, hierarchical.cc, direct.cc).
      {"tree", Collective::kAllReduce, "double binary tree, reduce up + broadcast down, chunk-pipelined", always,
       tree_allreduce},
      {"hypercube", Collective::kAllReduce, "recursive doubling, full vector per step; fold for non-power-of-two",
       always, hypercube_allreduce},
      {"rabenseifner", Collective::kAllReduce, "recursive halving reduce-scatter + recursive doubling all-gather",
       always, rabenseifner_allreduce},
      {"direct", Collective::kAllReduce, "one-shot: every rank receives every input and reduces in rank order",
       one_shot_supports, one_shot_allreduce},
      {"two_shot", Collective::kAllReduce, "direct reduce-scatter then direct all-gather", always,
       two_shot_allreduce},
      {"hierarchical", Collective::kAllReduce, "reduce inside each host, allreduce across hosts, broadcast inside",
       hierarchical_supports, hierarchical_allreduce},
      {"rabenseifner", Collective::kReduceScatter, "recursive halving; fold for non-power-of-two", always,
       halving_reduce_scatter},
      {"hypercube", Collective::kAllGather, "recursive doubling; fold for non-power-of-two", always,
       hypercube_all_gather},
      {"bruck", Collective::kAllGather, "Bruck's ceil(log2 n) steps, any n", always, bruck_all_gather},
      {"direct", Collective::kAllGather, "every rank sends its block to every peer at once; nothing forwarded", always,
       direct_all_gather},
      {"tree", Collective::kBroadcast, "pipelined binary tree from the root", always, tree_broadcast},
      {"binomial", Collective::kBroadcast, "binomial tree, pipelined in chunks", always, binomial_broadcast},
      {"direct", Collective::kBroadcast, "the root sends to every rank at once; nothing forwarded", always,
       direct_broadcast},
      {"tree", Collective::kReduce, "pipelined binary tree to the root", always, tree_reduce},
      {"binomial", Collective::kReduce, "binomial tree, pipelined in chunks; far-first on one host", always, binomial_reduce},
      {"pairwise", Collective::kAllToAll, "n-1 pairwise exchanges, one peer at a time", always, pairwise_all_to_all},
  };
  return kAll;
}

std::vector<const Algorithm*> algorithms_for(Collective coll) {
  std::vector<const Algorithm*> out;
  for (const auto& a : all_algorithms())
    if (a.coll == coll) out.push_back(&a);
  return out;
}

std::vector<std::string> runnable_algorithms(const CollArgs& args) {
  std::vector<std::string> names;
  for (const Algorithm* algo : algorithms_for(args.coll))
    if (algo->supports(args).is_ok()) names.emplace_back(algo->name);
  return names;
}

const Algorithm* find_algorithm(Collective coll, const std::string& name) {
  for (const auto& a : all_algorithms())
    if (a.coll == coll && name == a.name) return &a;
  // "ring" is accepted for broadcast/reduce (the chain is a ring cut open).
  if (name == "ring" && (coll == Collective::kBroadcast || coll == Collective::kReduce))
    return find_algorithm(coll, "chain");
  return nullptr;
}

Result<RankSchedule> make_schedule(const CollArgs& args, const std::string& algorithm) {
  if (args.nranks < 1) return invalid_argument(fmt::format("nranks {} < 1", args.nranks));
  if (args.rank < 0 || args.rank >= args.nranks)
    return invalid_argument(fmt::format("rank {} out of range [0, {})", args.rank, args.nranks));
  if ((args.coll == Collective::kBroadcast || args.coll == Collective::kReduce) &&
      (args.root < 0 || args.root >= args.nranks))
    return invalid_argument(fmt::format("root {} out of range [0, {})", args.root, args.nranks));
  if (!is_valid(args.dt)) return invalid_argument("invalid data type");
  for (const auto& p : args.p2p)
    if (p.peer < 0 || p.peer >= args.nranks)
      return invalid_argument(fmt::format("peer {} out of range [0, {})", p.peer, args.nranks));
  auto make = [&](const Algorithm* a) -> Result<RankSchedule> {
    Result<RankSchedule> s = a->make(args);
    if (s.is_ok()) {
      s->reduced_class = moves_as_reduced(args.coll, args.nranks, std::strcmp(a->name, "direct") == 0);
      // Send/recv: a fingerprint on every message (the ends may group them
      // differently). Regression: Groups.SenderGroupsTwoMessagesReceiverDoesNot
      // and ...ReceiverGroups...: "out of step", a hang, or a second
      // message whose first 32 bytes were the header.
      mark_first_contacts(*s, args.coll == Collective::kSendRecv);
    }
    return s;
  };
  if (!algorithm.empty()) {
    const Algorithm* a = find_algorithm(args.coll, algorithm);
    if (!a)
      return not_supported(fmt::format("no algorithm '{}' for {}", algorithm, collective_name(args.coll)));
    LOOM_RETURN_IF_ERROR(a->supports(args));
    return make(a);
  }
  Status last = not_supported(fmt::format("no algorithm for {}", collective_name(args.coll)));
  for (const Algorithm* a : algorithms_for(args.coll)) {
    Status st = a->supports(args);
    if (st.is_ok()) return make(a);
    last = st;
  }
  return last;
}

namespace {
// RankSchedule::short_path and max_transfer_count, once the first contacts
// are marked.
void mark_short_path(RankSchedule& s) {
  size_t transfers = 0, largest = 0;
  for (const Phase& ph : s.phases) {
    size_t in_phase = 0;
    for (const Step& st : ph.steps) {
      if (!is_comm_step(st.kind) || st.count == 0) continue;
      if (!st.first_contact || st.peer < 0 || ++in_phase > RankSchedule::kShortPathMaxTransfers) return;
      largest = std::max(largest, st.count);
    }
    transfers += in_phase;
  }
  s.short_path = transfers > 0;
  s.max_transfer_count = largest;
}
}  // namespace

void mark_first_contacts(RankSchedule& s, bool every_message) {
  std::vector<uint8_t> sent, received;  // per peer: a transfer already marked
  for (Phase& ph : s.phases)
    for (Step& st : ph.steps) {
      st.first_contact = false;
      if (!is_comm_step(st.kind) || st.count == 0 || st.peer < 0) continue;
      auto& seen = st.kind == StepKind::kSend ? sent : received;
      if (static_cast<size_t>(st.peer) >= seen.size()) seen.resize(static_cast<size_t>(st.peer) + 1, 0);
      if (seen[static_cast<size_t>(st.peer)] && !every_message) continue;
      seen[static_cast<size_t>(st.peer)] = 1;
      st.first_contact = true;
    }
  s.contacts_marked = true;
  s.single_exchange = false;
  s.short_path = false;
  s.max_transfer_count = 0;
  // Send/recv groups keep the general path: their headers are per message.
  if (every_message) return;
  mark_short_path(s);
  if (s.phases.empty() || s.phases[0].steps.size() != 2) return;
  for (size_t i = 1; i < s.phases.size(); ++i)
    for (const Step& st : s.phases[i].steps)
      if (is_comm_step(st.kind)) return;
  const Step& snd = s.phases[0].steps[0];
  const Step& rcv = s.phases[0].steps[1];
  s.single_exchange = snd.kind == StepKind::kSend &&
                      (rcv.kind == StepKind::kRecv || rcv.kind == StepKind::kRecvReduce) && snd.peer >= 0 &&
                      snd.peer == rcv.peer && snd.count > 0 && snd.count == rcv.count && snd.first_contact &&
                      rcv.first_contact;
  if (s.single_exchange) s.short_path = false;  // run_exchange's
}

std::string describe(const Step& s) {
  auto ref = [](BufRef b) {
    const char* names[] = {"send", "recv", "scratch"};
    std::string base = b.buf < kBufUser ? names[b.buf] : fmt::format("buf{}", b.buf - kBufUser);
    return b.offset ? fmt::format("{}+{}", base, b.offset) : base;
  };
  switch (s.kind) {
    case StepKind::kSend: return fmt::format("send {} from {} to rank {}", s.count, ref(s.src), s.peer);
    case StepKind::kRecv: return fmt::format("recv {} from rank {} into {}", s.count, s.peer, ref(s.dst));
    case StepKind::kRecvReduce:
      return s.incoming_first
                 ? fmt::format("recv_reduce {} from rank {} (its partial first) with {} into {}", s.count, s.peer,
                               ref(s.src), ref(s.dst))
                 : fmt::format("recv_reduce {} from rank {} with {} into {}", s.count, s.peer, ref(s.src), ref(s.dst));
    case StepKind::kCopy: return fmt::format("copy {} {} -> {}", s.count, ref(s.src), ref(s.dst));
    case StepKind::kReduce: return fmt::format("reduce {} {} , {} -> {}", s.count, ref(s.src), ref(s.src2), ref(s.dst));
    case StepKind::kDivide: return fmt::format("divide {} at {}", s.count, ref(s.dst));
  }
  return "?";
}

}  // namespace loom
