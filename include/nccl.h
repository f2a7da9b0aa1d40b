/*
 * nccl.h — Loom's NCCL-compatible C interface.
 *
 * Programs written for NCCL compile against this header unchanged and run on
 * Loom's libnccl.so.2. The binary interface (type sizes, struct layouts, enum
 * and macro values, function signatures) is that of NCCL 2.28.9; the text is
 * Loom's own. tests/abi checks every layout and value against NVIDIA's header.
 *
 * CUDA is optional. When <cuda_runtime.h> is reachable it is included (as
 * NVIDIA's header does) so cudaStream_t and the half/bfloat16 types are CUDA's.
 * Otherwise cudaStream_t is declared here as the same opaque pointer type
 * CUDA uses (struct CUstream_st *), which keeps the ABI and lets a later
 * #include <cuda_runtime.h> coexist. Define LOOM_NCCL_NO_CUDA to never
 * include CUDA headers.
 *
 * Loom specifics (host buffers, what each call does on Loom) are documented in
 * docs/nccl-compat.md.
 */
#ifndef NCCL_H_
#define NCCL_H_

#if !defined(LOOM_NCCL_NO_CUDA) && defined(__has_include)
#if __has_include(<cuda_runtime.h>)
#define LOOM_NCCL_HAVE_CUDA_HEADERS 1
#endif
#endif

#ifdef LOOM_NCCL_HAVE_CUDA_HEADERS
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#if CUDART_VERSION >= 11000
#include <cuda_bf16.h>
#endif
#if defined(__cplusplus) && CUDART_VERSION >= 11080
#include <cuda_fp8.h>
#endif
#else
/* Same tag as CUDA's driver_types.h, so both declarations name one type. */
struct CUstream_st;
typedef struct CUstream_st *cudaStream_t;
#endif

#include <limits.h>
#include <stddef.h>

/* Library version: 2.28.9. */
#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""
#define NCCL_VERSION_CODE 22809
/* Versions up to 2.8 used X*1000+Y*100+Z; later ones X*10000+Y*100+Z. */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

/* Handles. The structs behind them belong to the library. */
typedef struct ncclComm *ncclComm_t;
typedef struct ncclWindow_vidmem *ncclWindow_t;
#define NCCL_COMM_NULL NULL

/* Rendezvous token: created by one rank, copied verbatim to all others. */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* Result of every call that can fail. */
/* In C++ the enums get int as their fixed underlying type (same size and
 * values as in C), so any int a caller passes is a valid value and reading a
 * bad ncclDataType_t or ncclRedOp_t is a checked error, not undefined
 * behaviour. */
#ifdef __cplusplus
#define NCCL_LOOM_ENUM_ enum : int
#else
#define NCCL_LOOM_ENUM_ enum
#endif

typedef NCCL_LOOM_ENUM_ {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

/* "Not set" markers used by NCCL_CONFIG_INITIALIZER and friends. */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_UNDEF_FLOAT -1.0f

/* ncclCommSplit color meaning "this rank joins no new communicator". */
#define NCCL_SPLIT_NOCOLOR -1

/* ncclCommWindowRegister flags and the alignment symmetric windows need. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* Values of ncclConfig_t.CTAPolicy. */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* ncclCommShrink flags: plain shrink, or abort the parent's work first. */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* ncclCommRevoke flags (only the default exists). */
#define NCCL_REVOKE_DEFAULT 0x00

/*
 * Communicator options. Always start from NCCL_CONFIG_INITIALIZER: the
 * library reads size/magic/version to tell which fields a caller built with
 * an older header has, and leaves every field still "undefined" at its
 * default.
 */
typedef struct ncclConfig_v22800 {
  size_t size;          /* sizeof(ncclConfig_t) of the caller's header */
  unsigned int magic;   /* 0xcafebeef */
  unsigned int version; /* NCCL_VERSION code of the caller's header */
  int blocking;         /* 0: calls may return ncclInProgress */
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char *netName;
  int splitShare;
  int trafficClass;
  const char *commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                              \
  {                                                                          \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT, \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT, \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                         \
  }

/* Filled in by ncclGroupSimulateEnd. Start from NCCL_SIM_INFO_INITIALIZER. */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;  /* 0x74685283 */
  unsigned int version;
  float estimatedTime; /* microseconds */
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER \
  { sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_UNDEF_FLOAT }

/*
 * Reduction operators. Values from ncclNumOps up to ncclMaxRedOp are handles
 * made by ncclRedOpCreatePreMulSum. ncclRedOp_dummy_t only measures the
 * compiler's enum size so that ncclMaxRedOp never widens the type.
 */
typedef NCCL_LOOM_ENUM_ { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef NCCL_LOOM_ENUM_ {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

/* Element types (several have two spellings). */
typedef NCCL_LOOM_ENUM_ {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives and when it is read:
 * Device = read while the collective runs; HostImmediate = read at creation. */
typedef NCCL_LOOM_ENUM_ { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

/*
 * Every function exists twice: nccl* (weak, may be interposed by a profiler)
 * and pnccl* (the implementation), as in NCCL.
 */

/* Memory suitable for registration and symmetric windows. */
ncclResult_t ncclMemAlloc(void **ptr, size_t size);
ncclResult_t pncclMemAlloc(void **ptr, size_t size);
ncclResult_t ncclMemFree(void *ptr);
ncclResult_t pncclMemFree(void *ptr);

/* Version code of the loaded library (NCCL_VERSION_CODE form). */
ncclResult_t ncclGetVersion(int *version);
ncclResult_t pncclGetVersion(int *version);

/* Creates a rendezvous token; call on one rank and share it with all. */
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId *uniqueId);

/* Communicator creation. Every rank calls with the same nranks and id. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t *config);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
/* ndev communicators of one process; comm has room for ndev handles. */
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
ncclResult_t pncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
/* Like InitRankConfig with nId tokens (same list on every rank). */
ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId *commIds, ncclConfig_t *config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId *commIds, ncclConfig_t *config);

/* Teardown: Finalize flushes, Destroy frees, Abort stops everything now.
 * Revoke stops in-flight work but keeps the handle for Destroy. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags);

/* New communicators from an existing one. config NULL = inherit. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                            ncclConfig_t *config);
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                            ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                             ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags);

/* Errors. */
const char *ncclGetErrorString(ncclResult_t result);
const char *pncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);
const char *pncclGetLastError(ncclComm_t comm);
__attribute__((deprecated("ncclResetDebugInit is not part of the supported NCCL API")))
void ncclResetDebugInit();
__attribute__((deprecated("pncclResetDebugInit is not part of the supported NCCL API")))
void pncclResetDebugInit();
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);

/* Queries. */
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int *rank);

/* Buffer registration and symmetric memory windows. */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void *handle);
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                    int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                     int winFlags);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

/* Custom operator: each rank multiplies its input by *scalar, then sums. */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/*
 * Collectives. Counts are in elements. In-place forms: sendbuff == recvbuff
 * (Reduce, Broadcast, AllReduce); recvbuff == sendbuff + rank*recvcount
 * (ReduceScatter); sendbuff == recvbuff + rank*sendcount (AllGather);
 * sendbuff == recvbuff + root*count (Gather); recvbuff == sendbuff +
 * root*count (Scatter).
 */
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t pncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                         cudaStream_t stream);
/* Deprecated in-place broadcast. */
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm,
                            cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGather(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm,
                          cudaStream_t stream);

/* Point-to-point; the peer posts the matching call with the same count and
 * type. Group sends and receives that must progress together. */
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

/* Groups: calls between Start and End (nestable, across communicators) are
 * submitted together by the outermost End. SimulateEnd closes the group
 * without running it and reports an estimated time. */
ncclResult_t ncclGroupStart();
ncclResult_t pncclGroupStart();
ncclResult_t ncclGroupEnd();
ncclResult_t pncclGroupEnd();
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t *simInfo);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_H_ */
