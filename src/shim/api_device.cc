// The host side of NCCL 2.28's device-initiated communication API
// (nccl_device.h: device communicators, teams, barrier and LL all-to-all
// resource requirements).
//
// Loom runs collectives on the host and gives kernels no access to peer
// memory, so there is no device communicator to create: ncclDevCommCreate and
// the *CreateRequirement calls fail with ncclInvalidUsage and say why. The
// symbols must still exist: a program built against NCCL 2.28 (PyTorch 2.11's
// libtorch_cuda.so, for one) references them and would not load without them.
// The team queries are answered for what Loom is: the world team is every
// rank, and the load/store-accessible (LSA) team of a rank is the rank alone,
// which makes the rail team (the LSA team's outer factor) the world.
//
// The declarations are ours; ABI: a team is three ints {nRanks, rank, stride}
// returned by value, handles and requirement structs are only passed by
// pointer (checked against NVIDIA's headers by tests/abi/check_symbols.sh for
// the names and abi/check_device_api for the layout where CUDA's headers exist).
#include "shim/alias.h"
#include "shim/shim.h"

using namespace loom;
using namespace loom::shim;

extern "C" {
struct LoomNcclTeam {
  int nRanks;
  int rank;
  int stride;
};
struct ncclDevComm;                   // opaque here: never created
struct ncclDevCommRequirements;       // read only by ncclDevCommCreate
struct ncclDevResourceRequirements;   // filled by the *CreateRequirement calls
struct ncclLsaBarrierHandle;
struct ncclGinBarrierHandle;
struct ncclLLA2AHandle;

ncclResult_t pncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements* reqs, ncclDevComm* out);
ncclResult_t pncclDevCommDestroy(ncclComm_t comm, const ncclDevComm* dev_comm);
LoomNcclTeam pncclTeamWorld(ncclComm_t comm);
LoomNcclTeam pncclTeamLsa(ncclComm_t comm);
LoomNcclTeam pncclTeamRail(ncclComm_t comm);
int pncclTeamRankToWorld(ncclComm_t comm, LoomNcclTeam team, int rank);
int pncclTeamRankToLsa(ncclComm_t comm, LoomNcclTeam team, int rank);
ncclResult_t pncclLsaBarrierCreateRequirement(LoomNcclTeam team, int n_barriers, ncclLsaBarrierHandle* out_handle,
                                              ncclDevResourceRequirements* out_req);
ncclResult_t pncclGinBarrierCreateRequirement(ncclComm_t comm, LoomNcclTeam team, int n_barriers,
                                              ncclGinBarrierHandle* out_handle, ncclDevResourceRequirements* out_req);
int pncclLLA2ACalcSlots(int max_elts, int max_elt_size);
ncclResult_t pncclLLA2ACreateRequirement(int n_blocks, int n_slots, ncclLLA2AHandle* out_handle,
                                         ncclDevResourceRequirements* out_req);
}

namespace {

constexpr const char* kNoDeviceApi =
    "NCCL's device-initiated communication API (ncclDevComm, LSA/GIN barriers, LL all-to-all) is not "
    "available in Loom: its collectives run on the host and kernels get no access to peer memory; use the "
    "host collectives (ncclAllReduce, ...) instead";

Status no_device_api(const char* api) { return invalid_usage(std::string(api) + ": " + kNoDeviceApi); }

// Rank and size of a usable communicator; {0, 0} for an invalid one (the team
// calls return values, not status codes, as in NCCL).
LoomNcclTeam world_of(ncclComm_t comm) {
  auto c = ready_comm(comm);
  if (!c.is_ok()) return {0, 0, 1};
  return {(*c)->nranks, (*c)->rank, 1};
}

}  // namespace

extern "C" ncclResult_t pncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements* reqs, ncclDevComm* out) {
  return guard("ncclDevCommCreate", comm, [&]() -> Status {
    if (reqs == nullptr || out == nullptr) return invalid_argument("requirements or output is NULL");
    return no_device_api("ncclDevCommCreate");
  });
}

extern "C" ncclResult_t pncclDevCommDestroy(ncclComm_t comm, const ncclDevComm* dev_comm) {
  return guard("ncclDevCommDestroy", comm, [&]() -> Status {
    if (dev_comm == nullptr) return invalid_argument("devComm is NULL");
    return invalid_usage("ncclDevCommDestroy: no device communicator was created (ncclDevCommCreate is not "
                         "available in Loom)");
  });
}

extern "C" LoomNcclTeam pncclTeamWorld(ncclComm_t comm) { return world_of(comm); }

extern "C" LoomNcclTeam pncclTeamLsa(ncclComm_t comm) {
  LoomNcclTeam w = world_of(comm);
  return w.nRanks > 0 ? LoomNcclTeam{1, 0, 1} : w;
}

extern "C" LoomNcclTeam pncclTeamRail(ncclComm_t comm) { return world_of(comm); }

extern "C" int pncclTeamRankToWorld(ncclComm_t comm, LoomNcclTeam team, int rank) {
  LoomNcclTeam w = world_of(comm);
  return w.rank + (rank - team.rank) * team.stride;
}

extern "C" int pncclTeamRankToLsa(ncclComm_t comm, LoomNcclTeam team, int rank) {
  // The LSA team is this rank alone: index 0 for itself, -1 for anyone else.
  return pncclTeamRankToWorld(comm, team, rank) == world_of(comm).rank ? 0 : -1;
}

extern "C" ncclResult_t pncclLsaBarrierCreateRequirement(LoomNcclTeam, int, ncclLsaBarrierHandle*,
                                                         ncclDevResourceRequirements*) {
  return guard("ncclLsaBarrierCreateRequirement", nullptr,
               [&]() -> Status { return no_device_api("ncclLsaBarrierCreateRequirement"); });
}

extern "C" ncclResult_t pncclGinBarrierCreateRequirement(ncclComm_t comm, LoomNcclTeam, int, ncclGinBarrierHandle*,
                                                         ncclDevResourceRequirements*) {
  return guard("ncclGinBarrierCreateRequirement", comm,
               [&]() -> Status { return no_device_api("ncclGinBarrierCreateRequirement"); });
}

// Slots only size a device-side LL all-to-all buffer, which Loom never
// allocates: 0, and ncclLLA2ACreateRequirement then fails with the reason.
extern "C" int pncclLLA2ACalcSlots(int, int) { return 0; }

extern "C" ncclResult_t pncclLLA2ACreateRequirement(int, int, ncclLLA2AHandle*, ncclDevResourceRequirements*) {
  return guard("ncclLLA2ACreateRequirement", nullptr,
               [&]() -> Status { return no_device_api("ncclLLA2ACreateRequirement"); });
}

LOOM_NCCL_ALIAS(ncclDevCommCreate)
LOOM_NCCL_ALIAS(ncclDevCommDestroy)
LOOM_NCCL_ALIAS(ncclTeamWorld)
LOOM_NCCL_ALIAS(ncclTeamLsa)
LOOM_NCCL_ALIAS(ncclTeamRail)
LOOM_NCCL_ALIAS(ncclTeamRankToWorld)
LOOM_NCCL_ALIAS(ncclTeamRankToLsa)
LOOM_NCCL_ALIAS(ncclLsaBarrierCreateRequirement)
LOOM_NCCL_ALIAS(ncclGinBarrierCreateRequirement)
LOOM_NCCL_ALIAS(ncclLLA2ACalcSlots)
LOOM_NCCL_ALIAS(ncclLLA2ACreateRequirement)
