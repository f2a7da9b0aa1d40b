#include "algorithms/algorithms.h"

#include <fmt/format.h>

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
  };
  return kAll;
}

std::vector<const Algorithm*> algorithms_for(Collective coll) {
  std::vector<const Algorithm*> out;
  for (const auto& a : all_algorithms())
    if (a.coll == coll) out.push_back(&a);
  return out;
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
  if (!algorithm.empty()) {
    const Algorithm* a = find_algorithm(args.coll, algorithm);
    if (!a)
      return not_supported(fmt::format("no algorithm '{}' for {}", algorithm, collective_name(args.coll)));
    LOOM_RETURN_IF_ERROR(a->supports(args));
    return a->make(args);
  }
  Status last = not_supported(fmt::format("no algorithm for {}", collective_name(args.coll)));
  for (const Algorithm* a : algorithms_for(args.coll)) {
    Status st = a->supports(args);
    if (st.is_ok()) return a->make(args);
    last = st;
  }
  return last;
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
      return fmt::format("recv_reduce {} from rank {} with {} into {}", s.count, s.peer, ref(s.src), ref(s.dst));
    case StepKind::kCopy: return fmt::format("copy {} {} -> {}", s.count, ref(s.src), ref(s.dst));
    case StepKind::kReduce: return fmt::format("reduce {} {} , {} -> {}", s.count, ref(s.src), ref(s.src2), ref(s.dst));
    case StepKind::kDivide: return fmt::format("divide {} at {}", s.count, ref(s.dst));
  }
  return "?";
}

}  // namespace loom
