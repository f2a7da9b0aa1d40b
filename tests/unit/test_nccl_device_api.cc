// The host side of NCCL 2.28's device API (nccl_device.h), which Loom exports
// so programs built against NCCL 2.28 load (PyTorch 2.11 references
// ncclDevCommCreate/Destroy): the team queries answer for a host-only
// library (LSA team = the rank alone), and everything that would create
// device-side resources fails with ncclInvalidUsage and says why.
#include <gtest/gtest.h>

#include <string>

#include "nccl.h"
#include "unit/nccl_comms.h"

extern "C" {
// Our own declarations of the nccl_device.h host functions (same ABI).
struct TeamAbi {
  int nRanks, rank, stride;
};
struct ncclDevComm;
struct ncclDevCommRequirements;
struct ncclDevResourceRequirements;
struct ncclLsaBarrierHandle;
struct ncclGinBarrierHandle;
struct ncclLLA2AHandle;
ncclResult_t ncclDevCommCreate(ncclComm_t, const ncclDevCommRequirements*, ncclDevComm*);
ncclResult_t ncclDevCommDestroy(ncclComm_t, const ncclDevComm*);
TeamAbi ncclTeamWorld(ncclComm_t);
TeamAbi ncclTeamLsa(ncclComm_t);
TeamAbi ncclTeamRail(ncclComm_t);
int ncclTeamRankToWorld(ncclComm_t, TeamAbi, int);
int ncclTeamRankToLsa(ncclComm_t, TeamAbi, int);
ncclResult_t ncclLsaBarrierCreateRequirement(TeamAbi, int, ncclLsaBarrierHandle*, ncclDevResourceRequirements*);
ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t, TeamAbi, int, ncclGinBarrierHandle*,
                                             ncclDevResourceRequirements*);
int ncclLLA2ACalcSlots(int, int);
ncclResult_t ncclLLA2ACreateRequirement(int, int, ncclLLA2AHandle*, ncclDevResourceRequirements*);
}

namespace {

constexpr int kN = 3;

using Comms = loom::testing::NcclComms<kN>;

TEST(NcclDeviceApi, TeamsDescribeAHostOnlyLibrary) {
  Comms w;
  for (int r = 0; r < kN; ++r) {
    TeamAbi world = ncclTeamWorld(w.c[r]);
    EXPECT_EQ(world.nRanks, kN);
    EXPECT_EQ(world.rank, r);
    EXPECT_EQ(world.stride, 1);
    TeamAbi lsa = ncclTeamLsa(w.c[r]);
    EXPECT_EQ(lsa.nRanks, 1);
    EXPECT_EQ(lsa.rank, 0);
    TeamAbi rail = ncclTeamRail(w.c[r]);
    EXPECT_EQ(rail.nRanks, kN);
    EXPECT_EQ(rail.rank, r);
    for (int p = 0; p < kN; ++p) {
      EXPECT_EQ(ncclTeamRankToWorld(w.c[r], world, p), p);
      EXPECT_EQ(ncclTeamRankToLsa(w.c[r], world, p), p == r ? 0 : -1);
    }
    EXPECT_EQ(ncclTeamRankToWorld(w.c[r], lsa, 0), r);
  }
}

TEST(NcclDeviceApi, DeviceResourcesAreRefusedWithAReason) {
  Comms w;
  alignas(64) char reqs[256] = {};
  alignas(64) char out[4096] = {};
  EXPECT_EQ(ncclDevCommCreate(w.c[0], reinterpret_cast<const ncclDevCommRequirements*>(reqs),
                              reinterpret_cast<ncclDevComm*>(out)),
            ncclInvalidUsage);
  std::string why = ncclGetLastError(w.c[0]);
  EXPECT_NE(why.find("device-initiated communication"), std::string::npos) << why;
  EXPECT_EQ(ncclDevCommCreate(w.c[0], nullptr, reinterpret_cast<ncclDevComm*>(out)), ncclInvalidArgument);
  EXPECT_EQ(ncclDevCommDestroy(w.c[0], reinterpret_cast<const ncclDevComm*>(out)), ncclInvalidUsage);
  TeamAbi world = ncclTeamWorld(w.c[0]);
  EXPECT_EQ(ncclLsaBarrierCreateRequirement(world, 1, nullptr, nullptr), ncclInvalidUsage);
  EXPECT_EQ(ncclGinBarrierCreateRequirement(w.c[0], world, 1, nullptr, nullptr), ncclInvalidUsage);
  EXPECT_EQ(ncclLLA2ACalcSlots(1024, 16), 0);
  EXPECT_EQ(ncclLLA2ACreateRequirement(1, 0, nullptr, nullptr), ncclInvalidUsage);
  // A failed device-API call does not harm the communicator.
  int v[kN] = {1, 2, 3};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kN; ++r)
    ASSERT_EQ(ncclAllReduce(&v[r], &v[r], 1, ncclInt32, ncclSum, w.c[r], nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int r = 0; r < kN; ++r) EXPECT_EQ(v[r], 6);
}

TEST(NcclDeviceApi, InvalidCommunicatorGivesAnEmptyTeam) {
  TeamAbi t = ncclTeamWorld(nullptr);
  EXPECT_EQ(t.nRanks, 0);
}

}  // namespace
