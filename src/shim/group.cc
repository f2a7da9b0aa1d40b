// NCCL group semantics over loom groups.
//
// State is per thread, as in NCCL. Inside a group, operations are recorded on
// their communicator; the outermost ncclGroupEnd issues each touched comm's
// batch inside one loom group (so sends and receives progress together), on
// every comm before waiting on any (one thread may drive several ranks), and
// then waits (blocking comms) or leaves the work to ncclCommGetAsyncError
// (non-blocking comms, ncclInProgress). Communicators created in the group
// (init or split) are created concurrently and joined here. A call that
// failed inside the group fails the whole group, which is then discarded.
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "shim/alias.h"
#include "shim/shim.h"

namespace loom::shim {

namespace {

struct GroupState {
  int depth = 0;
  std::vector<ncclComm*> comms;      // comms with recorded ops, first-touch order
  std::vector<std::pair<std::shared_future<Status>, bool>> creations;  // (done, blocking)
  Status error;                      // first failed call inside the group
};

thread_local GroupState t_group;

// Alpha-beta cost of one operation on p ranks, in microseconds. A stand-in for
// Loom's tuner: alpha = per-step latency, beta = link bandwidth of host shm.
double estimate_us(const PendingOp& op, int p) {
  constexpr double kAlphaUs = 5.0;
  constexpr double kBytesPerUs = 5000.0;  // 5 GB/s
  const double n = static_cast<double>(op.bytes);
  const double steps = p > 1 ? p - 1 : 0;
  const double frac = p > 0 ? steps / p : 0;
  switch (op.coll) {
    case Collective::kAllReduce: return 2 * steps * kAlphaUs + 2 * frac * n / kBytesPerUs;
    case Collective::kReduceScatter:
    case Collective::kAllGather:
    case Collective::kAllToAll: return steps * kAlphaUs + frac * n / kBytesPerUs;
    case Collective::kBroadcast:
    case Collective::kReduce: return steps * kAlphaUs + n / kBytesPerUs;
    case Collective::kSendRecv: return kAlphaUs + n / kBytesPerUs;
  }
  return 0;
}

GroupState take_group() {
  GroupState g = std::move(t_group);
  t_group = GroupState{};
  return g;
}

}  // namespace

bool in_group() { return t_group.depth > 0; }

void group_record(ncclComm* comm, PendingOp op) {
  auto& comms = t_group.comms;
  if (std::find(comms.begin(), comms.end(), comm) == comms.end()) comms.push_back(comm);
  comm->group_ops.push_back(std::move(op));
}

void group_add_creation(std::shared_future<Status> done, bool blocking) {
  t_group.creations.emplace_back(std::move(done), blocking);
}

void group_fail(const Status& s) {
  if (t_group.error.is_ok()) t_group.error = s;
}

void group_forget(ncclComm* comm) {
  std::erase(t_group.comms, comm);
  comm->group_ops.clear();
}

}  // namespace loom::shim

using namespace loom;
using namespace loom::shim;

extern "C" ncclResult_t pncclGroupStart() {
  return guard("ncclGroupStart", nullptr, [&]() -> Status {
    ++t_group.depth;
    return Status::ok();
  });
}

namespace {
// A CallScope for each communicator of a group being ended.
std::vector<std::unique_ptr<CallScope>> enter_calls(const std::vector<ncclComm*>& comms) {
  std::vector<std::unique_ptr<CallScope>> in;
  for (ncclComm* c : comms) in.push_back(std::make_unique<CallScope>(c));
  return in;
}
}  // namespace

namespace {
// The outermost GroupEnd's work (also SimulateEnd's without a simInfo):
// finish blocking creations, then issue and settle every comm's ops.
Status end_group(GroupState g) {
  auto in_calls = enter_calls(g.comms);  // an abort from another thread waits for us
  Status first = g.error;
  bool in_progress = false;
  // Creations first: operations in the same group may not use them, but
  // the caller expects them ready (blocking) once GroupEnd returns.
  for (auto& [done, blocking] : g.creations) {
    if (!blocking) {
      in_progress = true;
      continue;
    }
    Status s = done.get();
    if (!s.is_ok() && first.is_ok()) first = s.with_context("communicator creation in group");
  }
  if (!first.is_ok()) {
    for (ncclComm* c : g.comms) c->group_ops.clear();
    return first;
  }

  std::vector<std::pair<ncclComm*, Completion>> issued;
  for (ncclComm* c : g.comms) {
    std::vector<PendingOp> ops = std::move(c->group_ops);
    c->group_ops.clear();
    Completion done;
    Status s = issue_batch(c, ops, done);
    if (!s.is_ok()) {
      record_error(c, s);
      if (first.is_ok()) first = s;
    }
    issued.emplace_back(c, std::move(done));
  }
  for (auto& [c, done] : issued) {
    Status s = settle(c, std::move(done));
    if (s.code() == StatusCode::kInProgress) {
      in_progress = true;
    } else if (!s.is_ok()) {
      record_error(c, s);
      if (first.is_ok()) first = s;
    }
  }
  if (!first.is_ok()) return first;
  if (in_progress) return Status(StatusCode::kInProgress, "group in progress");
  return Status::ok();
}

// Ends the group without running its ops (SimulateEnd, or a group that
// failed): blocking creations still complete (they cannot be undone).
Status drop_group(GroupState g, Status first) {
  auto in_calls = enter_calls(g.comms);
  for (ncclComm* c : g.comms) c->group_ops.clear();
  for (auto& [done, blocking] : g.creations)
    if (blocking) {
      Status s = done.get();
      if (!s.is_ok() && first.is_ok()) first = s;
    }
  return first;
}
}  // namespace

extern "C" ncclResult_t pncclGroupEnd() {
  return guard("ncclGroupEnd", nullptr, [&]() -> Status {
    if (t_group.depth == 0) return invalid_usage("ncclGroupEnd without matching ncclGroupStart");
    if (--t_group.depth > 0) return Status::ok();
    return end_group(take_group());
  });
}

// As NCCL's ncclGroupEndInternal(simInfo): the depth is checked and
// decremented first; the outermost call returns the group's error, then a
// NULL simInfo makes it a plain GroupEnd (the ops run), a bad magic ends
// the group with ncclInvalidArgument (the ops dropped), else it estimates
// and drops the ops. Regression: a NULL or bad simInfo was refused before
// the depth was touched, so the group stayed open and poisoned (the next
// standalone call returned success without running; GroupEnd then failed
// with the SimulateEnd error), and a group that had failed was simulated
// as if it had not.
extern "C" ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* info) {
  return guard("ncclGroupSimulateEnd", nullptr, [&]() -> Status {
    if (t_group.depth == 0) return invalid_usage("ncclGroupSimulateEnd without ncclGroupStart");
    if (info != nullptr && info->magic == 0x74685283u) {
      // Concurrent comms overlap; one comm's ops run in sequence.
      double worst = 0;
      for (ncclComm* c : t_group.comms) {
        double t = 0;
        for (const PendingOp& op : c->group_ops) {
          // Loom's tuner (the algorithm it would pick, from the topology's cost
          // model); the plain alpha-beta stand-in only where it has no model.
          auto predicted = c->comm ? c->comm->predict_us(op.coll, op.bytes) : Result<double>(not_supported("no comm"));
          t += predicted.is_ok() ? *predicted : estimate_us(op, c->nranks);
        }
        worst = std::max(worst, t);
      }
      info->estimatedTime = static_cast<float>(worst);
    }
    if (--t_group.depth > 0) return Status::ok();
    GroupState g = take_group();
    if (!g.error.is_ok()) {
      Status err = g.error;
      return drop_group(std::move(g), err);
    }
    if (info == nullptr) return end_group(std::move(g));
    if (info->magic != 0x74685283u)
      return drop_group(std::move(g),
                        invalid_argument("simInfo not initialized with NCCL_SIM_INFO_INITIALIZER (bad magic)"));
    return drop_group(std::move(g), Status::ok());
  });
}

LOOM_NCCL_ALIAS(ncclGroupStart)
LOOM_NCCL_ALIAS(ncclGroupEnd)
LOOM_NCCL_ALIAS(ncclGroupSimulateEnd)
