// Unit tests of the NCCL shim's internals: the error boundary, PreMulSum
// scaling and the NCCL_* -> LOOM_* environment mapping.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

#include "kernels/float_conv.h"
#include "kernels/host_reduce.h"
#include "shim/shim.h"

namespace loom::shim {
namespace {

TEST(NcclShimErrors, EveryStatusCodeMapsToAnNcclResult) {
  EXPECT_EQ(to_nccl(StatusCode::kOk), ncclSuccess);
  EXPECT_EQ(to_nccl(StatusCode::kInvalidArgument), ncclInvalidArgument);
  EXPECT_EQ(to_nccl(StatusCode::kInvalidUsage), ncclInvalidUsage);
  EXPECT_EQ(to_nccl(StatusCode::kNotSupported), ncclInvalidUsage);
  EXPECT_EQ(to_nccl(StatusCode::kSystemError), ncclSystemError);
  EXPECT_EQ(to_nccl(StatusCode::kRemoteError), ncclRemoteError);
  EXPECT_EQ(to_nccl(StatusCode::kTimeout), ncclRemoteError);
  EXPECT_EQ(to_nccl(StatusCode::kAborted), ncclInvalidUsage);
  EXPECT_EQ(to_nccl(StatusCode::kInternal), ncclInternalError);
  EXPECT_EQ(to_nccl(StatusCode::kInProgress), ncclInProgress);
}

TEST(NcclShimErrors, GuardRecordsTheMessageWithTheApiName) {
  ncclResult_t r = guard("ncclTestCall", nullptr, [] { return invalid_argument("bad thing 42"); });
  EXPECT_EQ(r, ncclInvalidArgument);
  std::string last = ncclGetLastError(nullptr);
  EXPECT_NE(last.find("ncclTestCall"), std::string::npos) << last;
  EXPECT_NE(last.find("bad thing 42"), std::string::npos) << last;
  // Success and in-progress leave the last error alone.
  EXPECT_EQ(guard("x", nullptr, [] { return Status::ok(); }), ncclSuccess);
  EXPECT_EQ(guard("x", nullptr, [] { return Status(StatusCode::kInProgress, "later"); }),
            ncclInProgress);
  EXPECT_EQ(last, ncclGetLastError(nullptr));
}

TEST(NcclShimErrors, NoExceptionCrossesTheBoundary) {
  EXPECT_EQ(guard("t", nullptr, []() -> Status { throw std::runtime_error("boom"); }),
            ncclInternalError);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("boom"), std::string::npos);
  EXPECT_EQ(guard("t", nullptr, []() -> Status { throw std::bad_alloc(); }), ncclSystemError);
  EXPECT_EQ(guard("t", nullptr, []() -> Status { throw 7; }), ncclInternalError);
}

// A thread reads its own last failure; one that failed nothing reads the
// process's last, as NCCL (one ncclLastError per process), not "".
TEST(NcclShimErrors, LastErrorIsPerThread) {
  (void)guard("main", nullptr, [] { return invalid_usage("from main"); });
  std::string other, own;
  std::thread t([&] {
    other = ncclGetLastError(nullptr);
    (void)guard("thread", nullptr, [] { return invalid_usage("from the thread"); });
    own = ncclGetLastError(nullptr);
  });
  t.join();
  EXPECT_NE(other.find("from main"), std::string::npos) << other;
  EXPECT_NE(own.find("from the thread"), std::string::npos) << own;
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("from main"), std::string::npos);
}

template <typename T>
void expect_scaled_int(DataType dt, T x, T s, T want) {
  T out{};
  kernels::scale(&out, &x, 1, dt, &s);
  EXPECT_EQ(out, want) << dtype_name(dt);
}

TEST(NcclShimPremul, IntegersWrapLikeTheGpu) {
  expect_scaled_int<int8_t>(DataType::kInt8, 100, 3, static_cast<int8_t>(44));  // 300 mod 256
  expect_scaled_int<uint8_t>(DataType::kUint8, 200, 2, 144);
  expect_scaled_int<int32_t>(DataType::kInt32, -7, 6, -42);
  expect_scaled_int<uint32_t>(DataType::kUint32, 0x80000000u, 2, 0);
  expect_scaled_int<int64_t>(DataType::kInt64, std::numeric_limits<int64_t>::min(), -1,
                             std::numeric_limits<int64_t>::min());
  expect_scaled_int<uint64_t>(DataType::kUint64, 5, 7, 35);
}

TEST(NcclShimPremul, FloatsScaleEveryElement) {
  float xs[5] = {1, -2, 0.5f, 3, 1e30f}, s = 0.25f, out[5];
  kernels::scale(out, xs, 5, DataType::kFloat32, &s);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], xs[i] * 0.25f);
  double d[2] = {1.5, -3}, ds = 2, dout[2];
  kernels::scale(dout, d, 2, DataType::kFloat64, &ds);
  EXPECT_EQ(dout[0], 3.0);
  EXPECT_EQ(dout[1], -6.0);
}

TEST(NcclShimPremul, NarrowFloatsRoundOnce) {
  using namespace loom::kernels;
  // half: 1/3 * 3 is not exactly 1 in half precision; one rounding of the
  // exact product gives the same bits as the narrow multiply would.
  uint16_t x = float_to_fp16(1.0f / 3), s = float_to_fp16(3.0f), out = 0;
  kernels::scale(&out, &x, 1, DataType::kFloat16, &s);
  EXPECT_EQ(out, float_to_fp16(fp16_to_float(x) * 3.0f));
  uint16_t bx = float_to_bf16(1.5f), bs = float_to_bf16(-2.0f), bout = 0;
  kernels::scale(&bout, &bx, 1, DataType::kBfloat16, &bs);
  EXPECT_EQ(bf16_to_float(bout), -3.0f);
  // FP8 E4M3 saturates at 448 (NCCL's satfinite) instead of overflowing.
  uint8_t e = float_to_fp8e4m3(256.0f), es = float_to_fp8e4m3(4.0f), eout = 0;
  kernels::scale(&eout, &e, 1, DataType::kFp8E4M3, &es);
  EXPECT_EQ(fp8e4m3_to_float(eout), 448.0f);
  uint8_t f = float_to_fp8e5m2(3.0f), fs = float_to_fp8e5m2(2.0f), fout = 0;
  kernels::scale(&fout, &f, 1, DataType::kFp8E5M2, &fs);
  EXPECT_EQ(fp8e5m2_to_float(fout), 6.0f);
}

TEST(NcclShimEnv, NcclVariablesMapToLoomOnesOnce) {
  // apply_nccl_env runs once per process: everything is set up first.
  ::setenv("NCCL_DEBUG_SUBSYS", "INIT,COLL,TUNING", 1);
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  ::setenv("NCCL_TOPO_FILE", "/tmp/topo.xml", 1);
  ::setenv("NCCL_ALGO", "Ring,NVLS", 1);
  ::setenv("NCCL_TOPO_DUMP_FILE", "/tmp/nccl-dump.xml", 1);
  ::setenv("LOOM_TOPO_DUMP_FILE", "/tmp/loom-dump.xml", 1);  // user's LOOM_ value wins
  ::unsetenv("LOOM_DEBUG_SUBSYS");
  ::unsetenv("LOOM_SOCKET_IFNAME");
  ::unsetenv("LOOM_TOPO_FILE");
  ::unsetenv("LOOM_ALGO");
  ::setenv("NCCL_SHM_DISABLE", "1", 1);
  ::unsetenv("LOOM_TRANSPORT");
  apply_nccl_env();
  EXPECT_STREQ(std::getenv("LOOM_TRANSPORT"), "socket");  // NCCL_SHM_DISABLE=1: no /dev/shm between ranks
  ::unsetenv("LOOM_TRANSPORT");
  ::unsetenv("NCCL_SHM_DISABLE");
  EXPECT_STREQ(std::getenv("LOOM_DEBUG_SUBSYS"), "INIT,COLL,TUNE");  // NCCL's TUNING is Loom's TUNE
  EXPECT_STREQ(std::getenv("LOOM_SOCKET_IFNAME"), "lo");
  EXPECT_STREQ(std::getenv("LOOM_TOPO_FILE"), "/tmp/topo.xml");
  // Ring is the only one Loom has of the allowed set: forced for the
  // collectives NCCL_ALGO governs. NVLS has no Loom meaning.
  EXPECT_STREQ(std::getenv("LOOM_ALGO"),
               "allreduce:ring;broadcast:ring;reduce:ring;allgather:ring;reducescatter:ring");
  EXPECT_STREQ(std::getenv("LOOM_TOPO_DUMP_FILE"), "/tmp/loom-dump.xml");
  // Later changes are not re-read (NCCL reads its environment once too).
  ::setenv("NCCL_TOPO_FILE", "/tmp/other.xml", 1);
  apply_nccl_env();
  EXPECT_STREQ(std::getenv("LOOM_TOPO_FILE"), "/tmp/topo.xml");
}

// NCCL's subsystem names select Loom's lines of the same subsystem.
TEST(NcclShimEnv, DebugSubsystemNamesTranslate) {
  EXPECT_EQ(translate_debug_subsys("INIT,COLL"), "INIT,COLL");
  EXPECT_EQ(translate_debug_subsys("GRAPH,tuning, BOOTSTRAP"), "TOPO,TUNE,BOOT");
  EXPECT_EQ(translate_debug_subsys("^BOOTSTRAP,NET"), "^BOOT,NET");
  EXPECT_EQ(translate_debug_subsys("ALLOC,PROXY"), "ALLOC,PROXY");  // none in Loom: ignored there
  EXPECT_EQ(translate_debug_subsys("ALL"), "ALL");
}

TEST(NcclShimEnv, NcclAlgoTranslation) {
  std::vector<std::string> dropped;
  EXPECT_EQ(translate_nccl_algo("Tree", &dropped), "allreduce:tree");
  EXPECT_EQ(translate_nccl_algo("allreduce:tree;broadcast:Ring", &dropped),
            "allreduce:tree;broadcast:ring");
  EXPECT_TRUE(dropped.empty());
  EXPECT_EQ(translate_nccl_algo("Ring,Tree", &dropped), "");  // a choice, not a rule
  EXPECT_EQ(translate_nccl_algo("^NVLS", &dropped), "");
  EXPECT_EQ(translate_nccl_algo("CollNetDirect,PAT", &dropped), "");
  EXPECT_EQ(translate_nccl_algo("nosuchcoll:ring", &dropped), "");  // validated by Loom's parser
  EXPECT_EQ(dropped.size(), 5u);
}

}  // namespace
}  // namespace loom::shim
