// Communicator lifecycle: unique id, init (rank, config, all, scalable),
// split, shrink, finalize, destroy, abort, revoke.
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "core/config.h"
#include "core/hash.h"
#include "core/log.h"
#include "cuda/cuda_loader.h"
#include "shim/alias.h"
#include "shim/shim.h"

using namespace loom;
using namespace loom::shim;

namespace {

constexpr unsigned kConfigMagic = 0xcafebeefu;
// How long ncclCommAbort waits for another thread's call to leave the
// communicator it aborted (woken, it leaves at once unless it waits on a
// CUDA stream).
constexpr double kAbortCallsWaitS = 30.0;

struct ParsedConfig {
  bool blocking = true;
  std::string name;
};

// True when a caller's config (possibly from an older, shorter header) has
// the field at [offset, offset+bytes).
bool has_field(const ncclConfig_t* c, size_t offset, size_t bytes) { return offset + bytes <= c->size; }
#define LOOM_CONFIG_HAS(cfg, field) \
  has_field(cfg, offsetof(ncclConfig_t, field), sizeof(static_cast<ncclConfig_t*>(nullptr)->field))

// The caller's config over `inherit`; nullptr: `inherit` itself.
Result<ParsedConfig> parse_given_config(const ncclConfig_t* cfg, const ParsedConfig& inherit) {
  if (cfg == nullptr) return inherit;
  ParsedConfig out;
  if (cfg->magic != kConfigMagic)
    return invalid_argument("ncclConfig_t not initialized with NCCL_CONFIG_INITIALIZER (bad magic)");
  if (cfg->size < offsetof(ncclConfig_t, blocking))
    return invalid_argument("ncclConfig_t.size " + std::to_string(cfg->size) + " is too small");
  if (LOOM_CONFIG_HAS(cfg, blocking) && cfg->blocking != NCCL_CONFIG_UNDEF_INT) {
    if (cfg->blocking != 0 && cfg->blocking != 1)
      return invalid_argument("ncclConfig_t.blocking must be 0 or 1, got " +
                              std::to_string(cfg->blocking));
    out.blocking = cfg->blocking == 1;
  }
  if (LOOM_CONFIG_HAS(cfg, commName) && cfg->commName != nullptr) out.name = cfg->commName;
  // The remaining fields tune GPU kernels, CollNet or NVLS; Loom's host path
  // has nothing to apply them to, but refuses what NCCL 2.28 refuses
  // (parseCommConfig), so a program that fails on NCCL fails here too.
  // Regression: only magic, size, blocking and CTAPolicy were checked.
  auto set = [&](size_t offset, size_t bytes, int v) {
    return has_field(cfg, offset, bytes) && v != NCCL_CONFIG_UNDEF_INT;
  };
#define LOOM_CONFIG_SET(field) set(offsetof(ncclConfig_t, field), sizeof(cfg->field), cfg->field)
  auto bad = [](const char* field, int v, const char* want) {
    return invalid_argument(std::string("ncclConfig_t.") + field + " = " + std::to_string(v) + ": " + want);
  };
  auto zero_one = [&](const char* field, int v) -> Status {
    return v == 0 || v == 1 ? Status::ok() : bad(field, v, "must be 0 or 1");
  };
  if (LOOM_CONFIG_SET(CTAPolicy) && (cfg->CTAPolicy < 0 || cfg->CTAPolicy > NCCL_CTA_POLICY_ZERO))
    return bad("CTAPolicy", cfg->CTAPolicy, "not a NCCL_CTA_POLICY_* value");
  if (LOOM_CONFIG_SET(cgaClusterSize) && cfg->cgaClusterSize < 0)
    return bad("cgaClusterSize", cfg->cgaClusterSize, "must be >= 0");
  if (LOOM_CONFIG_SET(minCTAs) && cfg->minCTAs <= 0) return bad("minCTAs", cfg->minCTAs, "must be > 0");
  if (LOOM_CONFIG_SET(maxCTAs) && cfg->maxCTAs <= 0) return bad("maxCTAs", cfg->maxCTAs, "must be > 0");
  // NCCL compares the raw fields: a minCTAs given without maxCTAs (INT_MIN,
  // unset) is refused too.
  if (LOOM_CONFIG_HAS(cfg, maxCTAs) && cfg->minCTAs > cfg->maxCTAs)
    return invalid_argument("ncclConfig_t.minCTAs " + std::to_string(cfg->minCTAs) + " > maxCTAs " +
                            (cfg->maxCTAs == NCCL_CONFIG_UNDEF_INT ? std::string("(unset)")
                                                                   : std::to_string(cfg->maxCTAs)));
  if (LOOM_CONFIG_SET(splitShare)) LOOM_RETURN_IF_ERROR(zero_one("splitShare", cfg->splitShare));
  if (LOOM_CONFIG_SET(collnetEnable)) LOOM_RETURN_IF_ERROR(zero_one("collnetEnable", cfg->collnetEnable));
  if (LOOM_CONFIG_SET(shrinkShare)) LOOM_RETURN_IF_ERROR(zero_one("shrinkShare", cfg->shrinkShare));
  if (LOOM_CONFIG_SET(nvlsCTAs) && cfg->nvlsCTAs <= 0) return bad("nvlsCTAs", cfg->nvlsCTAs, "must be > 0");
  constexpr int kNcclMaxChannels = 64;  // NCCL's MAXCHANNELS
  if (LOOM_CONFIG_SET(nChannelsPerNetPeer) &&
      (cfg->nChannelsPerNetPeer <= 0 || cfg->nChannelsPerNetPeer > kNcclMaxChannels))
    return bad("nChannelsPerNetPeer", cfg->nChannelsPerNetPeer, "must be in [1, 64]");
  if (LOOM_CONFIG_SET(nvlinkCentricSched))
    LOOM_RETURN_IF_ERROR(zero_one("nvlinkCentricSched", cfg->nvlinkCentricSched));
#undef LOOM_CONFIG_SET
  return out;
}

// As NCCL (init.cc: copyCommConfig, parseCommConfig, envConfigOverride):
// without a config a communicator takes `inherit` (the parent's settings
// for split/shrink, the defaults for init); a config starts from the
// defaults, not from the parent's; then NCCL_COMM_BLOCKING=0|1 overrides
// `blocking` either way. Regression: the variable only filled in a config's
// unset `blocking`, and a split with a config that left it unset kept the
// parent's (NcclApi.CommBlockingEnvOverridesTheConfig,
// NcclApi.SplitWithAConfigStartsFromTheDefaults).
Result<ParsedConfig> parse_config(const ncclConfig_t* cfg, const ParsedConfig& inherit) {
  LOOM_ASSIGN_OR_RETURN(ParsedConfig out, parse_given_config(cfg, inherit));
  if (std::optional<bool> env = blocking_from_env()) out.blocking = *env;
  return out;
}

loom::Config to_loom(const ParsedConfig& p) {
  loom::Config c;
  c.name = p.name;
  return c;
}

// A split/shrink of `parent` now runs in the background (child_job).
void note_child_job(ncclComm* parent, const std::shared_future<Status>& job) {
  if (parent == nullptr) return;
  std::lock_guard<std::mutex> lock(parent->mu);
  parent->child_job = job;
}

// Whether creating a communicator waits for it: a split or shrink follows
// its parent's mode, not the child's config, as NCCL launches it as an
// async job of the parent (init.cc, ncclCommInitChildComm ->
// ncclAsyncLaunch(..., comm)); an init its own config. Regression: a split
// of a non-blocking parent waited when its config asked for a blocking
// child, and always for NCCL_SPLIT_NOCOLOR, so one thread splitting
// non-blocking ranks in turn waited for the ranks it had not reached
// (NcclCompat.SplitOfNonBlockingParentsNeverWaits).
bool creation_waits(const ParsedConfig& pc, const ncclComm* parent) {
  return parent != nullptr ? parent->blocking : pc.blocking;
}

// Creates the handle and runs `make` now (a creation that waits, outside a
// group) or in the background (one that does not, or inside a group).
// `parent`: the communicator a split/shrink runs on (child_job). The new
// communicator's own mode (later calls) is `pc.blocking`.
Status create(ncclComm_t* out, const ParsedConfig& pc, int nranks, int rank,
              std::function<Result<std::unique_ptr<Comm>>()> make,
              std::shared_ptr<std::atomic<bool>> cancel = nullptr, ncclComm* parent = nullptr) {
  const bool waits = creation_waits(pc, parent);
  auto c = std::make_unique<ncclComm>();
  c->init_cancel = std::move(cancel);
  c->blocking = pc.blocking;
  c->name = pc.name;
  c->rank = rank;
  c->nranks = nranks;
  // A split or shrink lives on its parent's device, as NCCL's child job
  // takes the parent's cudaDev (ncclCommCuDevice). Regression: children
  // reported device 0 (NcclCompat.SplitChildKeepsTheParentsDevice).
  if (parent != nullptr) c->cuda_dev = parent->cuda_dev;
  if (in_group()) {
    auto job = start_creation(c.get(), std::move(make));
    note_child_job(parent, job);
    group_add_creation(job, waits);
    *out = c.release();
    return Status::ok();
  }
  if (!waits) {
    note_child_job(parent, start_creation(c.get(), std::move(make)));
    *out = c.release();
    return Status(StatusCode::kInProgress, "communicator initializing");
  }
  *out = nullptr;
  LOOM_ASSIGN_OR_RETURN(c->comm, make());
  if (c->comm == nullptr) return internal_error("loom returned no communicator");
  c->rank = c->comm->rank();
  c->nranks = c->comm->size();
  *out = c.release();
  return Status::ok();
}

Status check_ranks(int nranks, int rank) {
  if (nranks < 1) return invalid_argument("nranks " + std::to_string(nranks) + " must be >= 1");
  if (rank < 0 || rank >= nranks)
    return invalid_argument("rank " + std::to_string(rank) + " out of range [0, " +
                            std::to_string(nranks) + ")");
  return Status::ok();
}

UniqueId to_loom_id(const ncclUniqueId& id) {
  static_assert(sizeof(ncclUniqueId) == sizeof(UniqueId), "unique id sizes differ");
  UniqueId out;
  std::memcpy(out.bytes, id.internal, sizeof(out.bytes));
  return out;
}

// NCCL_COMM_ID=<host>:<port> (or [v6]:<port>): NCCL's fixed rendezvous
// address (bootstrap.cc, bootstrapGetUniqueId; init.cc,
// ncclCommInitRankDev). Every process makes the same unique id from it
// without exchanging one, and the process of rank 0 hosts the rendezvous
// there when it initialises. Read at each call, as NCCL's ncclGetEnv.
// Regression: the variable was ignored ("has no meaning in Loom"), so each
// process got its own id and the ranks never met
// (NcclCompat.CommIdFromTheEnvironment).
std::optional<std::string> comm_id_env() {
  const char* v = std::getenv("NCCL_COMM_ID");
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

// The id every process derives from NCCL_COMM_ID. Its secret cannot be
// random (nothing is exchanged); it is derived from the port (ranks may
// name the host differently) and LOOM_SECRET, which a launcher may set to
// keep unrelated jobs apart, as NCCL's fixed magic number does less well.
Result<UniqueId> comm_id_from_env(const std::string& text) {
  Result<SockAddr> addr = parse_sockaddr(text);
  if (!addr.is_ok())
    return invalid_argument("NCCL_COMM_ID='" + text + "' is not <host>:<port> or [<ipv6>]:<port> (" +
                            addr.status().message() + ")");
  UidContents uid;
  uid.root = *addr;
  uid.secret = fnv1a("NCCL_COMM_ID|" + std::to_string(addr->port()) + "|" + env_string("LOOM_SECRET", ""));
  return encode_uid(uid);
}

// The device a new communicator lives on: NCCL's ncclCommInitRank* take the
// calling thread's current CUDA device (cudaGetDevice), which
// ncclCommCuDevice reports. Without CUDA: 0. Regression: always 0, also
// after cudaSetDevice (NcclCudaStaged.InitRankRecordsTheCurrentDevice).
int current_cuda_device() {
  const cuda::CudaRuntimeApi* rt = cuda::CudaLoader::get().runtime();
  int dev = 0;
  if (rt != nullptr && rt->get_device != nullptr && rt->get_device(&dev) == cuda::kCudaSuccess) return dev;
  return 0;
}

Status init_rank_config(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank,
                        const ncclConfig_t* config) {
  apply_nccl_env();
  if (out == nullptr) return invalid_argument("comm (output pointer) is NULL");
  // As NCCL's ncclCommInitRankDev, which clears *newcomm on every failure: a
  // program that tests the handle after a refused init must not find the
  // garbage it passed in. Regression: it was left as given
  // (NcclCompat.FailedInitLeavesNoHandle).
  *out = nullptr;
  LOOM_RETURN_IF_ERROR(check_ranks(nranks, rank));
  LOOM_ASSIGN_OR_RETURN(ParsedConfig pc, parse_config(config, ParsedConfig{}));
  UniqueId lid = to_loom_id(id);
  loom::Config lc = to_loom(pc);
  if (rank == 0 && comm_id_env()) {
    // Rank 0 hosts the rendezvous at the id's address (NCCL_COMM_ID's), in
    // the calling thread, before the creation may go to the background.
    LOOM_ASSIGN_OR_RETURN(UidContents uid, decode_uid(lid));
    const double t = lc.timeout_s > 0 ? lc.timeout_s : params::timeout_s();
    Result<SockAddr> bound = start_root(uid.root, uid.secret, t);
    if (!bound.is_ok())
      return bound.status().with_context("rank 0 cannot host the rendezvous at NCCL_COMM_ID " + uid.root.to_string());
  }
  lc.cancel = std::make_shared<std::atomic<bool>>(false);  // ncclCommAbort while it initialises
  Status s = create(
      out, pc, nranks, rank, [lid, nranks, rank, lc] { return Comm::init_rank(lid, nranks, rank, lc); }, lc.cancel);
  if (*out != nullptr) (*out)->cuda_dev = current_cuda_device();
  return s;
}

ParsedConfig settings_of(const ncclComm* c) {
  ParsedConfig p;
  p.blocking = c->blocking;
  p.name = c->name;
  return p;
}

Status split_impl(ncclComm* parent, int color, int key, ncclComm_t* newcomm,
                  const ncclConfig_t* config) {
  if (newcomm == nullptr) return invalid_argument("newcomm is NULL");
  *newcomm = nullptr;
  LOOM_ASSIGN_OR_RETURN(ncclComm * p, live_comm(parent));
  bool revoked;
  {
    std::lock_guard<std::mutex> lock(p->mu);
    revoked = p->revoked;
  }
  // A revoked communicator may be split (loom::Comm::split meets through the
  // bootstrap, not the revoked ring); otherwise it must be usable. splitShare
  // is never acted on: Loom shares no resources between communicators, which
  // is also what NCCL requires while the parent is revoked.
  if (!revoked) LOOM_RETURN_IF_ERROR(ready_comm(parent).status());
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return invalid_argument("color " + std::to_string(color) +
                            " must be >= 0 or NCCL_SPLIT_NOCOLOR");
  LOOM_ASSIGN_OR_RETURN(ParsedConfig pc, parse_config(config, settings_of(p)));
  auto make = [p, color, key] { return p->comm->split(color < 0 ? -1 : color, key); };
  if (color == NCCL_SPLIT_NOCOLOR) {
    // This rank still takes part in the collective split but gets no comm;
    // in the background like any split of its parent's mode.
    if (in_group() || !creation_waits(pc, p)) {
      auto job = start_creation(nullptr, make);
      note_child_job(p, job);
      if (in_group()) {
        group_add_creation(job, creation_waits(pc, p));
        return Status::ok();
      }
      return Status(StatusCode::kInProgress, "split in progress; poll ncclCommGetAsyncError on the parent");
    }
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Comm> none, make());
    (void)none;
    return Status::ok();
  }
  return create(newcomm, pc, -1, -1, make, nullptr, p);
}

}  // namespace

extern "C" ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId) {
  return guard("ncclGetUniqueId", nullptr, [&]() -> Status {
    apply_nccl_env();
    if (uniqueId == nullptr) return invalid_argument("uniqueId is NULL");
    // With NCCL_COMM_ID no root starts here: rank 0's init hosts it there.
    std::optional<std::string> fixed = comm_id_env();
    LOOM_ASSIGN_OR_RETURN(UniqueId id, fixed ? comm_id_from_env(*fixed) : get_unique_id());
    std::memcpy(uniqueId->internal, id.bytes, sizeof(uniqueId->internal));
    return Status::ok();
  });
}

extern "C" ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                                int rank, ncclConfig_t* config) {
  return guard("ncclCommInitRankConfig", nullptr,
               [&] { return init_rank_config(comm, nranks, commId, rank, config); });
}

extern "C" ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                          int rank) {
  return guard("ncclCommInitRank", nullptr,
               [&] { return init_rank_config(comm, nranks, commId, rank, nullptr); });
}

extern "C" ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank,
                                                  int nId, ncclUniqueId* commIds,
                                                  ncclConfig_t* config) {
  return guard("ncclCommInitRankScalable", nullptr, [&]() -> Status {
    // NCCL (init.cc, ncclCommInitRankDev): nId must be in 1..nranks.
    if (nId < 1 || nId > nranks || commIds == nullptr)
      return invalid_argument("need 1 to nranks unique ids (nId=" + std::to_string(nId) +
                              ", nranks=" + std::to_string(nranks) + ")");
    // Loom's rendezvous is a single root; the extra ids (for spreading NCCL's
    // bootstrap) are accepted and unused.
    return init_rank_config(newcomm, nranks, commIds[0], myrank, config);
  });
}

extern "C" ncclResult_t pncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  return guard("ncclCommInitAll", nullptr, [&]() -> Status {
    apply_nccl_env();
    if (comms == nullptr) return invalid_argument("comm array is NULL");
    // NCCL's checks and codes (init.cc): a negative count or device is an
    // invalid argument, a device listed twice a usage error, and no device
    // at all nothing to do.
    if (ndev < 0) return invalid_argument("ndev " + std::to_string(ndev) + " must be >= 0");
    if (ndev == 0) return Status::ok();
    if (devlist != nullptr) {
      std::set<int> seen;
      for (int i = 0; i < ndev; ++i) {
        if (devlist[i] < 0) return invalid_argument("devlist has a negative device " + std::to_string(devlist[i]));
        if (!seen.insert(devlist[i]).second)
          return invalid_usage("devlist names device " + std::to_string(devlist[i]) + " twice");
      }
    }
    ParsedConfig pc;
    pc.blocking = true;  // InitAll returns initialized communicators
    LOOM_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Comm>> all,
                          Comm::init_all(ndev, to_loom(pc)));
    for (int i = 0; i < ndev; ++i) {
      auto c = std::make_unique<ncclComm>();
      c->comm = std::move(all[static_cast<size_t>(i)]);
      c->rank = c->comm->rank();
      c->nranks = c->comm->size();
      c->cuda_dev = devlist != nullptr ? devlist[i] : i;
      comms[i] = c.release();
    }
    return Status::ok();
  });
}

extern "C" ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                       ncclConfig_t* config) {
  return guard("ncclCommSplit", comm, [&] { return split_impl(comm, color, key, newcomm, config); });
}

extern "C" ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList,
                                        int excludeRanksCount, ncclComm_t* newcomm,
                                        ncclConfig_t* config, int shrinkFlags) {
  return guard("ncclCommShrink", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, live_comm(comm));
    if (newcomm == nullptr) return invalid_argument("newcomm is NULL");
    // As NCCL (ncclCommInitChildComm): the list must name at least one rank;
    // only the NCCL_SHRINK_ABORT bit of shrinkFlags is looked at. Regression:
    // an empty list made a duplicate and other flag values were refused.
    if (excludeRanksList == nullptr || excludeRanksCount <= 0)
      return invalid_argument("excludeRanksList must name at least one rank (got " +
                              std::string(excludeRanksList == nullptr ? "NULL" : "a list") + ", count " +
                              std::to_string(excludeRanksCount) + ")");
    for (int i = 0; i < excludeRanksCount; ++i)
      if (excludeRanksList[i] < 0 || excludeRanksList[i] >= c->nranks)
        return invalid_argument("excluded rank " + std::to_string(excludeRanksList[i]) +
                                " out of range");
      else if (excludeRanksList[i] == c->rank)
        return invalid_argument("rank " + std::to_string(c->rank) +
                                " excludes itself (excluded ranks must not call ncclCommShrink)");
    *newcomm = nullptr;
    LOOM_ASSIGN_OR_RETURN(ParsedConfig pc, parse_config(config, settings_of(c)));
    std::vector<int> excluded(excludeRanksList, excludeRanksList + excludeRanksCount);
    const bool abort_first = (shrinkFlags & NCCL_SHRINK_ABORT) != 0;
    // NCCL_SHRINK_ABORT: error recovery, outstanding work is aborted first.
    // Otherwise the parent's outstanding work completes before the shrink.
    if (abort_first) c->comm->abort("ncclCommShrink with NCCL_SHRINK_ABORT");
    (void)drain(c);
    loom::Config lc = to_loom(pc);
    auto make = [c, excluded, abort_first, lc] { return c->comm->shrink(excluded, abort_first, lc); };
    return create(newcomm, pc, -1, -1, make, nullptr, c);
  });
}

extern "C" ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  return guard("ncclCommFinalize", comm, [&]() -> Status {
    // As NCCL (init.cc, ncclCommFinalize): NULL is a no-op, a second call
    // ncclInvalidArgument. Regression: NULL was refused, a second call
    // accepted (NcclApi.FinalizeOfNullAndTwiceAsNccl).
    if (comm == nullptr) return Status::ok();
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, live_comm(comm));
    {
      std::lock_guard<std::mutex> lock(c->mu);
      if (c->revoked) return invalid_usage("ncclCommFinalize after ncclCommRevoke");
      if (c->finalized) return invalid_argument("ncclCommFinalize called twice on this communicator");
    }
    Status s = drain(c);
    std::lock_guard<std::mutex> lock(c->mu);
    c->finalized = true;
    return s;
  });
}

extern "C" ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  return guard("ncclCommDestroy", nullptr, [&]() -> Status {
    if (comm == nullptr) return Status::ok();
    LOOM_RETURN_IF_ERROR(check_handle(comm));
    // As NCCL (ncclCommEnsureReady): not while a split of it still runs.
    if (child_job_running(comm))
      return invalid_argument("a non-blocking split or shrink of this communicator is still running: poll "
                              "ncclCommGetAsyncError on it until ncclSuccess, then destroy it");
    std::unique_ptr<ncclComm> owned(comm);
    // Destroyed inside a group that holds calls of it: they are dropped
    // (the others of the group still run at GroupEnd), as NCCL skips the
    // tasks of a communicator being destroyed. Regression: GroupEnd issued
    // them on the freed communicator (a crash;
    // NcclCompat.DestroyOrAbortInsideAGroupDropsItsCalls).
    group_forget(owned.get());
    if (owned->ready.valid()) (void)owned->ready.get();
    Status drained = drain(owned.get());
    Status s;
    bool failed_before;
    {
      std::lock_guard<std::mutex> lock(owned->mu);
      failed_before = !owned->async_error.is_ok() || owned->revoked;
    }
    if (owned->comm != nullptr) s = owned->comm->destroy();
    owned->magic = ncclComm::kDead;
    owned->comm.reset();
    // Errors already reported by the operations that hit them are not
    // reported again by teardown.
    return failed_before ? Status::ok() : s;
  });
}

extern "C" ncclResult_t pncclCommAbort(ncclComm_t comm) {
  return guard("ncclCommAbort", nullptr, [&]() -> Status {
    if (comm == nullptr) return Status::ok();
    LOOM_RETURN_IF_ERROR(check_handle(comm));
    std::unique_ptr<ncclComm> owned(comm);
    group_forget(owned.get());  // as in ncclCommDestroy
    // Still initialising (non-blocking or grouped init): stop its waits for
    // the peers instead of waiting for them until LOOM_TIMEOUT.
    if (owned->init_cancel) owned->init_cancel->store(true);
    if (owned->ready.valid()) (void)owned->ready.get();
    if (owned->comm != nullptr) owned->comm->abort("ncclCommAbort");
    (void)drain(owned.get());  // aborted work finishes at once
    // A split/shrink of it running in the background uses it: the abort
    // fails the split's exchange over this comm's bootstrap at once; wait for
    // the job to end before freeing (regression: freed under it).
    wait_child_job(owned.get());
    // A call of another thread may still be inside (the hung call a watchdog
    // aborts): woken by the abort, it leaves within moments; free nothing
    // before it has. Regression: it went on into the destroyed loom::Comm
    // and the freed ncclComm (NcclAbort.FromAnotherThreadEndsAHungCall,
    // UBSan/ASan).
    if (!wait_for_calls(owned.get(), kAbortCallsWaitS)) {
      LOOM_WARN(kLogInit, "ncclCommAbort: a call of another thread is still inside the communicator {} s after "
                "the abort; its memory is left allocated", kAbortCallsWaitS);
      owned->magic = ncclComm::kDead;
      (void)owned.release();
      return Status::ok();
    }
    owned->magic = ncclComm::kDead;
    owned->comm.reset();
    return Status::ok();
  });
}

extern "C" ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  return guard("ncclCommRevoke", comm, [&]() -> Status {
    // As NVIDIA's revoke design (and its API tests): NULL is a no-op; a
    // communicator already revoked or finalizing is ncclInvalidArgument.
    // Regression: NULL was refused, and a second revoke or one after
    // Finalize succeeded (NcclCompat.RevokeEdgesAsNccl).
    if (comm == nullptr) return Status::ok();
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, live_comm(comm));
    if (revokeFlags != NCCL_REVOKE_DEFAULT)
      return invalid_argument("revokeFlags must be NCCL_REVOKE_DEFAULT (0)");
    {
      std::lock_guard<std::mutex> lock(c->mu);
      if (c->revoked) return invalid_argument("communicator already revoked");
      if (c->finalized) return invalid_argument("communicator is finalized (ncclCommFinalize)");
    }
    // loom::Comm::revoke ends queued and running operations here and on the
    // peers ("communicator revoked by rank R") and refuses new ones; split,
    // shrink and destroy stay possible. The state (ncclCommGetAsyncError, via
    // poll) is in progress until every operation has ended, then success.
    bool had_work;
    {
      std::lock_guard<std::mutex> lock(c->mu);
      had_work = !c->inflight.empty();
      c->revoked = true;
    }
    c->comm->revoke();
    if (!c->blocking) {
      Status s = poll(c);
      return had_work ? Status(StatusCode::kInProgress, "revoke in progress; poll ncclCommGetAsyncError") : s;
    }
    // Blocking communicator: return once quiescent. Revoked operations end
    // within milliseconds (each also has the communicator's deadline).
    for (;;) {
      Status s = poll(c);
      if (s.code() != StatusCode::kInProgress) return s;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
}

LOOM_NCCL_ALIAS(ncclGetUniqueId)
LOOM_NCCL_ALIAS(ncclCommInitRankConfig)
LOOM_NCCL_ALIAS(ncclCommInitRank)
LOOM_NCCL_ALIAS(ncclCommInitRankScalable)
LOOM_NCCL_ALIAS(ncclCommInitAll)
LOOM_NCCL_ALIAS(ncclCommSplit)
LOOM_NCCL_ALIAS(ncclCommShrink)
LOOM_NCCL_ALIAS(ncclCommFinalize)
LOOM_NCCL_ALIAS(ncclCommDestroy)
LOOM_NCCL_ALIAS(ncclCommAbort)
LOOM_NCCL_ALIAS(ncclCommRevoke)
