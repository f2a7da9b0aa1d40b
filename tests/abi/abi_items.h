/*
 * Everything of NCCL 2.28.9's nccl.h that the ABI test compares between
 * NVIDIA's header and ours (X-macro list, expanded by abi_dump_real.cc and
 * abi_check.c/.cc). abi_coverage checks that every name the real header
 * defines (macros, enum constants, types, struct fields, functions) appears
 * here, so the list cannot silently fall behind the header.
 *
 * SIZE(type)               sizeof, compile time
 * ALIGN(type)              alignment, compile time
 * OFFSET(type, field)      offsetof, compile time
 * VALUE(name)              integer constant (enum value / macro), compile time
 * EXPR(id, expr)           integer constant expression, compile time
 * RUNTIME(id, expr)        arithmetic expression checked at run time
 * INIT(type, init, field)  field of `type v = init;` checked at run time
 * FUNC(name)               function type, checked at run time from C++ typeid
 * STRING(name)             string macro, checked at run time
 */
#define LOOM_ABI_ITEMS(SIZE, ALIGN, OFFSET, VALUE, EXPR, RUNTIME, INIT, FUNC, STRING)        \
  /* version */                                                                             \
  VALUE(NCCL_MAJOR) VALUE(NCCL_MINOR) VALUE(NCCL_PATCH) VALUE(NCCL_VERSION_CODE)              \
  STRING(NCCL_SUFFIX)                                                                        \
  EXPR(version_2_8_0, NCCL_VERSION(2, 8, 0)) EXPR(version_2_9_0, NCCL_VERSION(2, 9, 0))      \
  EXPR(version_2_28_9, NCCL_VERSION(2, 28, 9)) EXPR(version_3_0_1, NCCL_VERSION(3, 0, 1))    \
  EXPR(version_1_2_3, NCCL_VERSION(1, 2, 3))                                                 \
  /* handles */                                                                             \
  SIZE(ncclComm_t) SIZE(ncclWindow_t) SIZE(cudaStream_t)                                     \
  RUNTIME(NCCL_COMM_NULL, (const void*)NCCL_COMM_NULL == (const void*)0)                                             \
  /* unique id */                                                                           \
  VALUE(NCCL_UNIQUE_ID_BYTES) SIZE(ncclUniqueId) ALIGN(ncclUniqueId)                         \
  OFFSET(ncclUniqueId, internal)                                                             \
  /* results */                                                                             \
  SIZE(ncclResult_t) VALUE(ncclSuccess) VALUE(ncclUnhandledCudaError)                        \
  VALUE(ncclSystemError) VALUE(ncclInternalError) VALUE(ncclInvalidArgument)                 \
  VALUE(ncclInvalidUsage) VALUE(ncclRemoteError) VALUE(ncclInProgress) VALUE(ncclNumResults) \
  /* config markers and flags */                                                            \
  VALUE(NCCL_CONFIG_UNDEF_INT) RUNTIME(NCCL_CONFIG_UNDEF_PTR, (const void*)NCCL_CONFIG_UNDEF_PTR == (const void*)0)    \
  VALUE(NCCL_SPLIT_NOCOLOR) RUNTIME(NCCL_UNDEF_FLOAT, NCCL_UNDEF_FLOAT)                      \
  EXPR(sizeof_NCCL_UNDEF_FLOAT, sizeof(NCCL_UNDEF_FLOAT))                                    \
  VALUE(NCCL_WIN_DEFAULT) VALUE(NCCL_WIN_COLL_SYMMETRIC) VALUE(NCCL_WIN_REQUIRED_ALIGNMENT)  \
  VALUE(NCCL_CTA_POLICY_DEFAULT) VALUE(NCCL_CTA_POLICY_EFFICIENCY)                           \
  VALUE(NCCL_CTA_POLICY_ZERO) VALUE(NCCL_SHRINK_DEFAULT) VALUE(NCCL_SHRINK_ABORT)            \
  VALUE(NCCL_REVOKE_DEFAULT)                                                                 \
  /* ncclConfig_t (struct ncclConfig_v22800) */                                             \
  SIZE(ncclConfig_t) ALIGN(ncclConfig_t)                                    \
  EXPR(sizeof_ncclConfig_v22800, sizeof(struct ncclConfig_v22800))                   \
  OFFSET(ncclConfig_t, size) OFFSET(ncclConfig_t, magic) OFFSET(ncclConfig_t, version)       \
  OFFSET(ncclConfig_t, blocking) OFFSET(ncclConfig_t, cgaClusterSize)                        \
  OFFSET(ncclConfig_t, minCTAs) OFFSET(ncclConfig_t, maxCTAs) OFFSET(ncclConfig_t, netName)  \
  OFFSET(ncclConfig_t, splitShare) OFFSET(ncclConfig_t, trafficClass)                        \
  OFFSET(ncclConfig_t, commName) OFFSET(ncclConfig_t, collnetEnable)                         \
  OFFSET(ncclConfig_t, CTAPolicy) OFFSET(ncclConfig_t, shrinkShare)                          \
  OFFSET(ncclConfig_t, nvlsCTAs) OFFSET(ncclConfig_t, nChannelsPerNetPeer)                   \
  OFFSET(ncclConfig_t, nvlinkCentricSched)                                                   \
  INIT(ncclConfig_t, NCCL_CONFIG_INITIALIZER, size)                                          \
  INIT(ncclConfig_t, NCCL_CONFIG_INITIALIZER, magic)                                         \
  INIT(ncclConfig_t, NCCL_CONFIG_INITIALIZER, version)                                       \
  INIT(ncclConfig_t, NCCL_CONFIG_INITIALIZER, blocking)                                      \
  INIT(ncclConfig_t, NCCL_CONFIG_INITIALIZER, cgaClusterSize)                                \
  INIT(ncclConfig_t, NCCL_CONFIG_INITIALIZER, minCTAs)                                       \
  INIT(ncclConfig_t, NCCL_CONFIG_INITIALIZER, maxCTAs)                                       \
  INIT(ncclConfig_t, NCCL_CONFIG_INITIALIZER, netName)                                       \
  INIT(ncclConfig_t, NCCL_CONFIG_INITIALIZER, splitShare)                                    \
  INIT(ncclConfig_t, NCCL_CONFIG_INITIALIZER, trafficClass)                                  \
  INIT(ncclConfig_t, NCCL_CONFIG_INITIALIZER, commName)                                      \
  INIT(ncclConfig_t, NCCL_CONFIG_INITIALIZER, collnetEnable)                                 \
  INIT(ncclConfig_t, NCCL_CONFIG_INITIALIZER, CTAPolicy)                                     \
  INIT(ncclConfig_t, NCCL_CONFIG_INITIALIZER, shrinkShare)                                   \
  INIT(ncclConfig_t, NCCL_CONFIG_INITIALIZER, nvlsCTAs)                                      \
  INIT(ncclConfig_t, NCCL_CONFIG_INITIALIZER, nChannelsPerNetPeer)                           \
  INIT(ncclConfig_t, NCCL_CONFIG_INITIALIZER, nvlinkCentricSched)                            \
  /* ncclSimInfo_t (struct ncclSimInfo_v22200) */                                           \
  SIZE(ncclSimInfo_t) ALIGN(ncclSimInfo_t)                                   \
  EXPR(sizeof_ncclSimInfo_v22200, sizeof(struct ncclSimInfo_v22200))                 \
  OFFSET(ncclSimInfo_t, size) OFFSET(ncclSimInfo_t, magic) OFFSET(ncclSimInfo_t, version)    \
  OFFSET(ncclSimInfo_t, estimatedTime)                                                       \
  INIT(ncclSimInfo_t, NCCL_SIM_INFO_INITIALIZER, size)                                       \
  INIT(ncclSimInfo_t, NCCL_SIM_INFO_INITIALIZER, magic)                                      \
  INIT(ncclSimInfo_t, NCCL_SIM_INFO_INITIALIZER, version)                                    \
  INIT(ncclSimInfo_t, NCCL_SIM_INFO_INITIALIZER, estimatedTime)                              \
  /* reduction operators */                                                                 \
  SIZE(ncclRedOp_dummy_t) VALUE(ncclNumOps_dummy)                                            \
  SIZE(ncclRedOp_t) VALUE(ncclSum) VALUE(ncclProd) VALUE(ncclMax) VALUE(ncclMin)             \
  VALUE(ncclAvg) VALUE(ncclNumOps) VALUE(ncclMaxRedOp)                                       \
  /* data types */                                                                          \
  SIZE(ncclDataType_t) VALUE(ncclInt8) VALUE(ncclChar) VALUE(ncclUint8) VALUE(ncclInt32)     \
  VALUE(ncclInt) VALUE(ncclUint32) VALUE(ncclInt64) VALUE(ncclUint64) VALUE(ncclFloat16)     \
  VALUE(ncclHalf) VALUE(ncclFloat32) VALUE(ncclFloat) VALUE(ncclFloat64) VALUE(ncclDouble)   \
  VALUE(ncclBfloat16) VALUE(ncclFloat8e4m3) VALUE(ncclFloat8e5m2) VALUE(ncclNumTypes)        \
  /* scalar residence */                                                                    \
  SIZE(ncclScalarResidence_t) VALUE(ncclScalarDevice) VALUE(ncclScalarHostImmediate)         \
  /* functions (both names of each) */                                                      \
  FUNC(ncclMemAlloc) FUNC(pncclMemAlloc) FUNC(ncclMemFree) FUNC(pncclMemFree)                \
  FUNC(ncclGetVersion) FUNC(pncclGetVersion) FUNC(ncclGetUniqueId) FUNC(pncclGetUniqueId)    \
  FUNC(ncclCommInitRankConfig) FUNC(pncclCommInitRankConfig)                                 \
  FUNC(ncclCommInitRank) FUNC(pncclCommInitRank) FUNC(ncclCommInitAll) FUNC(pncclCommInitAll) \
  FUNC(ncclCommFinalize) FUNC(pncclCommFinalize) FUNC(ncclCommDestroy) FUNC(pncclCommDestroy) \
  FUNC(ncclCommAbort) FUNC(pncclCommAbort) FUNC(ncclCommRevoke) FUNC(pncclCommRevoke)        \
  FUNC(ncclCommSplit) FUNC(pncclCommSplit) FUNC(ncclCommShrink) FUNC(pncclCommShrink)        \
  FUNC(ncclCommInitRankScalable) FUNC(pncclCommInitRankScalable)                             \
  FUNC(ncclGetErrorString) FUNC(pncclGetErrorString)                                         \
  FUNC(ncclGetLastError) FUNC(pncclGetLastError)                                             \
  FUNC(ncclResetDebugInit) FUNC(pncclResetDebugInit)                                         \
  FUNC(ncclCommGetAsyncError) FUNC(pncclCommGetAsyncError)                                   \
  FUNC(ncclCommCount) FUNC(pncclCommCount) FUNC(ncclCommCuDevice) FUNC(pncclCommCuDevice)    \
  FUNC(ncclCommUserRank) FUNC(pncclCommUserRank)                                             \
  FUNC(ncclCommRegister) FUNC(pncclCommRegister) FUNC(ncclCommDeregister)                    \
  FUNC(pncclCommDeregister) FUNC(ncclCommWindowRegister) FUNC(pncclCommWindowRegister)       \
  FUNC(ncclCommWindowDeregister) FUNC(pncclCommWindowDeregister)                             \
  FUNC(ncclRedOpCreatePreMulSum) FUNC(pncclRedOpCreatePreMulSum)                             \
  FUNC(ncclRedOpDestroy) FUNC(pncclRedOpDestroy)                                             \
  FUNC(ncclReduce) FUNC(pncclReduce) FUNC(ncclBcast) FUNC(pncclBcast)                        \
  FUNC(ncclBroadcast) FUNC(pncclBroadcast) FUNC(ncclAllReduce) FUNC(pncclAllReduce)          \
  FUNC(ncclReduceScatter) FUNC(pncclReduceScatter) FUNC(ncclAllGather) FUNC(pncclAllGather)  \
  FUNC(ncclAlltoAll) FUNC(pncclAlltoAll) FUNC(ncclGather) FUNC(pncclGather)                  \
  FUNC(ncclScatter) FUNC(pncclScatter) FUNC(ncclSend) FUNC(pncclSend)                        \
  FUNC(ncclRecv) FUNC(pncclRecv) FUNC(ncclGroupStart) FUNC(pncclGroupStart)                  \
  FUNC(ncclGroupEnd) FUNC(pncclGroupEnd) FUNC(ncclGroupSimulateEnd) FUNC(pncclGroupSimulateEnd)
