/*
 * A program written for NCCL, compiled against NVIDIA's nccl.h and linked
 * with Loom's libnccl.so.2: 4 ranks as forked processes (host buffers, unique
 * ids shared through files) run every collective for every data type and
 * reduction, Send/Recv in groups, Split, Shrink, PreMulSum, non-blocking init,
 * InitRankScalable, Revoke then Split, Abort (also with peers blocked), GroupSimulateEnd,
 * registration, windows and bad input. Afterwards the parent process checks
 * ncclCommInitAll and grouped ncclCommInitRank from one thread.
 *
 * Every result is checked against a closed form computed from (rank, index),
 * never against another rank's output.
 */
#include <dlfcn.h>
#include <math.h>
#include <nccl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "functional_data.h"

enum { kRanks = 4, kCount = 1031 };

static int g_rank = -1;
static int g_failures = 0;
static char g_dir[256];

#define CHECK(cond, ...)                                                        \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "[rank %d] FAIL %s:%d: ", g_rank, __FILE__, __LINE__);    \
      fprintf(stderr, __VA_ARGS__);                                             \
      fprintf(stderr, "\n");                                                    \
      g_failures++;                                                             \
    }                                                                           \
  } while (0)

/* An unexpected NCCL error ends this rank: its peers would wait forever, so
 * the parent kills them once it sees the failure. */
#define NCCLCHECK(call)                                                                     \
  do {                                                                                      \
    ncclResult_t r_ = (call);                                                               \
    if (r_ != ncclSuccess) {                                                                \
      fprintf(stderr, "[rank %d] FATAL %s:%d: %s -> %d (%s): %s\n", g_rank, __FILE__,       \
              __LINE__, #call, (int)r_, ncclGetErrorString(r_), ncclGetLastError(NULL));    \
      exit(2);                                                                              \
    }                                                                                       \
  } while (0)

/* Expects `call` to fail with `code` and ncclGetLastError to mention `word`. */
#define EXPECT_ERROR(call, code, word)                                                       \
  do {                                                                                       \
    ncclResult_t r_ = (call);                                                                \
    const char* msg_ = ncclGetLastError(NULL);                                               \
    CHECK(r_ == (code), "%s returned %d (%s), want %d", #call, (int)r_,                      \
          ncclGetErrorString(r_), (int)(code));                                              \
    CHECK(msg_ != NULL && strstr(msg_, word) != NULL, "%s: last error '%s' lacks '%s'",       \
          #call, msg_ ? msg_ : "(null)", word);                                              \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- unique ids through files ------------------------------------------ */

static void share_id(const char* tag, ncclUniqueId* id) {
  char path[512], tmp[520];
  snprintf(path, sizeof path, "%s/id_%s", g_dir, tag);
  if (g_rank == 0) {
    NCCLCHECK(ncclGetUniqueId(id));
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    if (f == NULL || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0) {
      perror(tmp);
      exit(2);
    }
    rename(tmp, path); /* atomic: readers never see a partial id */
    return;
  }
  double deadline = now_s() + 60;
  for (;;) {
    FILE* f = fopen(path, "rb");
    if (f != NULL) {
      size_t n = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (n == 1) return;
    }
    if (now_s() > deadline) {
      fprintf(stderr, "[rank %d] no unique id '%s' after 60 s\n", g_rank, tag);
      exit(2);
    }
    usleep(2000);
  }
}

/* Non-blocking calls: poll until the comm leaves ncclInProgress. */
static ncclResult_t wait_comm(ncclComm_t comm) {
  ncclResult_t state = ncclInProgress;
  double deadline = now_s() + 120;
  while (state == ncclInProgress && now_s() < deadline) {
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state == ncclInProgress) usleep(500);
  }
  return state;
}

/* ---- reductions: every dtype x op, closed form ------------------------- */

static void test_reductions(ncclComm_t comm) {
  size_t n = kCount;
  for (int t = 0; t < ncclNumTypes; ++t) {
    size_t es = dtype_size(t);
    unsigned char* send = malloc(n * kRanks * es);
    unsigned char* recv = malloc(n * kRanks * es);
    for (int op = 0; op < ncclNumOps; ++op) {
      /* AllReduce, out of place. */
      for (size_t i = 0; i < n; ++i) put_value(t, send, i, red_input(g_rank, i));
      memset(recv, 0xee, n * es);
      NCCLCHECK(ncclAllReduce(send, recv, n, (ncclDataType_t)t, (ncclRedOp_t)op, comm, NULL));
      int bad = 0;
      for (size_t i = 0; i < n && bad < 3; ++i) {
        double want = red_expected(t, op, kRanks, i), got = get_value(t, recv, i);
        if (got != want) {
          CHECK(0, "allreduce %s/%s [%zu] = %g, want %g", dtype_label(t), op_label(op), i, got, want);
          ++bad;
        }
      }
      /* AllReduce, in place. */
      for (size_t i = 0; i < n; ++i) put_value(t, recv, i, red_input(g_rank, i));
      NCCLCHECK(ncclAllReduce(recv, recv, n, (ncclDataType_t)t, (ncclRedOp_t)op, comm, NULL));
      for (size_t i = 0, bad2 = 0; i < n && bad2 < 3; ++i) {
        double want = red_expected(t, op, kRanks, i), got = get_value(t, recv, i);
        if (got != want) {
          CHECK(0, "allreduce in-place %s/%s [%zu] = %g, want %g", dtype_label(t), op_label(op), i,
                got, want);
          ++bad2;
        }
      }
      /* Reduce to a root that moves with (type, op). */
      int root = (t + op) % kRanks;
      memset(recv, 0xee, n * es);
      NCCLCHECK(ncclReduce(send, g_rank == root ? recv : NULL, n, (ncclDataType_t)t,
                           (ncclRedOp_t)op, root, comm, NULL));
      if (g_rank == root) {
        for (size_t i = 0, bad2 = 0; i < n && bad2 < 3; ++i) {
          double want = red_expected(t, op, kRanks, i), got = get_value(t, recv, i);
          if (got != want) {
            CHECK(0, "reduce %s/%s root %d [%zu] = %g, want %g", dtype_label(t), op_label(op),
                  root, i, got, want);
            ++bad2;
          }
        }
      }
      /* ReduceScatter: rank r gets block r of the reduction of n*kRanks. */
      for (size_t i = 0; i < n * kRanks; ++i) put_value(t, send, i, red_input(g_rank, i));
      memset(recv, 0xee, n * es);
      NCCLCHECK(ncclReduceScatter(send, recv, n, (ncclDataType_t)t, (ncclRedOp_t)op, comm, NULL));
      for (size_t i = 0, bad2 = 0; i < n && bad2 < 3; ++i) {
        double want = red_expected(t, op, kRanks, (size_t)g_rank * n + i);
        double got = get_value(t, recv, i);
        if (got != want) {
          CHECK(0, "reducescatter %s/%s [%zu] = %g, want %g", dtype_label(t), op_label(op), i,
                got, want);
          ++bad2;
        }
      }
    }
    free(send);
    free(recv);
  }
}

/* ---- data movement: raw bytes, every dtype ------------------------------ */

static int check_bytes(const char* what, int t, const unsigned char* buf, size_t offset_elems,
                       size_t n, int src_rank, size_t src_first) {
  size_t es = dtype_size(t);
  for (size_t k = 0; k < n * es; ++k) {
    unsigned char want = pattern_byte(src_rank, src_first * es + k);
    if (buf[offset_elems * es + k] != want) {
      CHECK(0, "%s %s: byte %zu from rank %d is %u, want %u", what, dtype_label(t), k, src_rank,
            buf[offset_elems * es + k], want);
      return 0;
    }
  }
  return 1;
}

static void fill_bytes(unsigned char* buf, size_t bytes, int rank) {
  for (size_t k = 0; k < bytes; ++k) buf[k] = pattern_byte(rank, k);
}

static void test_movement(ncclComm_t comm) {
  size_t n = kCount;
  for (int t = 0; t < ncclNumTypes; ++t) {
    ncclDataType_t dt = (ncclDataType_t)t;
    size_t es = dtype_size(t);
    unsigned char* send = malloc(n * kRanks * es);
    unsigned char* recv = malloc(n * kRanks * es);
    int root = t % kRanks;

    /* AllGather out of place, then in place. */
    fill_bytes(send, n * es, g_rank);
    NCCLCHECK(ncclAllGather(send, recv, n, dt, comm, NULL));
    for (int r = 0; r < kRanks; ++r) check_bytes("allgather", t, recv, (size_t)r * n, n, r, 0);
    memset(recv, 0, n * kRanks * es);
    fill_bytes(recv + (size_t)g_rank * n * es, n * es, g_rank);
    NCCLCHECK(ncclAllGather(recv + (size_t)g_rank * n * es, recv, n, dt, comm, NULL));
    for (int r = 0; r < kRanks; ++r) check_bytes("allgather in-place", t, recv, (size_t)r * n, n, r, 0);

    /* Broadcast out of place, in place, and the deprecated Bcast. */
    fill_bytes(send, n * es, g_rank);
    memset(recv, 0, n * es);
    NCCLCHECK(ncclBroadcast(send, recv, n, dt, root, comm, NULL));
    check_bytes("broadcast", t, recv, 0, n, root, 0);
    fill_bytes(recv, n * es, g_rank);
    NCCLCHECK(ncclBroadcast(recv, recv, n, dt, root, comm, NULL));
    check_bytes("broadcast in-place", t, recv, 0, n, root, 0);
    fill_bytes(recv, n * es, g_rank);
    NCCLCHECK(ncclBcast(recv, n, dt, (root + 1) % kRanks, comm, NULL));
    check_bytes("bcast", t, recv, 0, n, (root + 1) % kRanks, 0);

    /* AlltoAll: block j of rank r's send goes to rank j at block r. */
    fill_bytes(send, n * kRanks * es, g_rank);
    memset(recv, 0, n * kRanks * es);
    NCCLCHECK(ncclAlltoAll(send, recv, n, dt, comm, NULL));
    for (int r = 0; r < kRanks; ++r)
      check_bytes("alltoall", t, recv, (size_t)r * n, n, r, (size_t)g_rank * n);

    /* Gather to root, out of place and in place. */
    fill_bytes(send, n * es, g_rank);
    memset(recv, 0, n * kRanks * es);
    NCCLCHECK(ncclGather(send, recv, n, dt, root, comm, NULL));
    if (g_rank == root)
      for (int r = 0; r < kRanks; ++r) check_bytes("gather", t, recv, (size_t)r * n, n, r, 0);
    memset(recv, 0, n * kRanks * es);
    fill_bytes(recv + (size_t)g_rank * n * es, n * es, g_rank);
    NCCLCHECK(ncclGather(recv + (size_t)g_rank * n * es, recv, n, dt, root, comm, NULL));
    if (g_rank == root)
      for (int r = 0; r < kRanks; ++r) check_bytes("gather in-place", t, recv, (size_t)r * n, n, r, 0);

    /* Scatter from root, out of place and in place. */
    fill_bytes(send, n * kRanks * es, g_rank);
    memset(recv, 0, n * es);
    NCCLCHECK(ncclScatter(send, recv, n, dt, root, comm, NULL));
    check_bytes("scatter", t, recv, 0, n, root, (size_t)g_rank * n);
    fill_bytes(send, n * kRanks * es, g_rank);
    NCCLCHECK(ncclScatter(send, send + (size_t)root * n * es, n, dt, root, comm, NULL));
    if (g_rank != root) check_bytes("scatter in-place", t, send, (size_t)root * n, n, root, (size_t)g_rank * n);
    else check_bytes("scatter in-place (root)", t, send, (size_t)root * n, n, root, (size_t)root * n);

    free(send);
    free(recv);
  }
}

/* ---- point-to-point and groups ------------------------------------------ */

static void test_p2p_and_groups(ncclComm_t comm) {
  size_t n = 4099;
  unsigned char* send = malloc(n * 4 * kRanks);
  unsigned char* recv = malloc(n * 4 * kRanks);
  int next = (g_rank + 1) % kRanks, prev = (g_rank + kRanks - 1) % kRanks;

  /* Ring shift: every rank sends to next and receives from prev, in a group. */
  fill_bytes(send, n * 4, g_rank);
  memset(recv, 0, n * 4);
  NCCLCHECK(ncclGroupStart());
  NCCLCHECK(ncclSend(send, n, ncclFloat, next, comm, NULL));
  NCCLCHECK(ncclRecv(recv, n, ncclFloat, prev, comm, NULL));
  NCCLCHECK(ncclGroupEnd());
  check_bytes("sendrecv ring", ncclFloat, recv, 0, n, prev, 0);

  /* All pairs at once: block p of send goes to p; block p of recv from p. */
  fill_bytes(send, n * 4 * kRanks, g_rank);
  memset(recv, 0, n * 4 * kRanks);
  NCCLCHECK(ncclGroupStart());
  for (int p = 0; p < kRanks; ++p) {
    if (p == g_rank) continue;
    NCCLCHECK(ncclSend(send + (size_t)p * n * 4, n, ncclInt32, p, comm, NULL));
    NCCLCHECK(ncclRecv(recv + (size_t)p * n * 4, n, ncclInt32, p, comm, NULL));
  }
  NCCLCHECK(ncclGroupEnd());
  for (int p = 0; p < kRanks; ++p)
    if (p != g_rank) check_bytes("sendrecv all pairs", ncclInt32, recv, (size_t)p * n, n, p, (size_t)g_rank * n);

  /* Nested groups fusing two collectives on disjoint buffers. */
  float* a = (float*)send;
  float* b = (float*)recv;
  for (size_t i = 0; i < n; ++i) a[i] = (float)(g_rank + 1);
  a[n] = (float)(10 * g_rank);
  NCCLCHECK(ncclGroupStart());
  NCCLCHECK(ncclGroupStart());
  NCCLCHECK(ncclAllReduce(a, a, n, ncclFloat, ncclSum, comm, NULL));
  NCCLCHECK(ncclGroupEnd());
  NCCLCHECK(ncclAllGather(a + n, b, 1, ncclFloat, comm, NULL));
  NCCLCHECK(ncclGroupEnd());
  CHECK(a[0] == 10.0f && a[n - 1] == 10.0f, "grouped allreduce gave %g, %g, want 10", a[0], a[n - 1]);
  for (int r = 0; r < kRanks; ++r) CHECK(b[r] == (float)(10 * r), "grouped allgather [%d] = %g", r, b[r]);

  /* GroupSimulateEnd: estimates, and does not run the group. */
  for (size_t i = 0; i < n; ++i) b[i] = -5.0f;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  NCCLCHECK(ncclGroupStart());
  NCCLCHECK(ncclAllReduce(b, b, n, ncclFloat, ncclSum, comm, NULL));
  NCCLCHECK(ncclGroupSimulateEnd(&sim));
  CHECK(sim.estimatedTime > 0, "simulated time %g, want > 0", sim.estimatedTime);
  CHECK(b[0] == -5.0f && b[n - 1] == -5.0f, "GroupSimulateEnd ran the operation (%g)", b[0]);
  /* A bad simInfo ends the group with ncclInvalidArgument (NCCL's
     ncclGroupEndInternal checks the depth first: outside a group it is
     ncclInvalidUsage). */
  ncclSimInfo_t bad_sim = NCCL_SIM_INFO_INITIALIZER;
  bad_sim.magic = 0;
  NCCLCHECK(ncclGroupStart());
  EXPECT_ERROR(ncclGroupSimulateEnd(&bad_sim), ncclInvalidArgument, "magic");
  EXPECT_ERROR(ncclGroupEnd(), ncclInvalidUsage, "without");

  free(send);
  free(recv);
}

/* ---- split ---------------------------------------------------------------- */

static void test_split(ncclComm_t world) {
  /* Colors by parity; keys reverse the order inside each color. */
  ncclComm_t half = NULL;
  NCCLCHECK(ncclCommSplit(world, g_rank % 2, -g_rank, &half, NULL));
  CHECK(half != NULL, "split returned NULL for a colored rank");
  int count = -1, rank = -1;
  NCCLCHECK(ncclCommCount(half, &count));
  NCCLCHECK(ncclCommUserRank(half, &rank));
  CHECK(count == 2, "split count %d, want 2", count);
  CHECK(rank == (g_rank < 2 ? 1 : 0), "split rank %d, want %d", rank, g_rank < 2 ? 1 : 0);
  int v = g_rank + 1;
  NCCLCHECK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, half, NULL));
  CHECK(v == (g_rank % 2 == 0 ? 1 + 3 : 2 + 4), "split allreduce %d", v);

  /* Both comms in one group (one thread driving two communicators). */
  int w = 1, h = 1;
  NCCLCHECK(ncclGroupStart());
  NCCLCHECK(ncclAllReduce(&w, &w, 1, ncclInt32, ncclSum, world, NULL));
  NCCLCHECK(ncclAllReduce(&h, &h, 1, ncclInt32, ncclSum, half, NULL));
  NCCLCHECK(ncclGroupEnd());
  CHECK(w == kRanks && h == 2, "two-comm group gave %d and %d", w, h);

  /* NCCL_SPLIT_NOCOLOR: rank 3 takes part but gets no communicator. */
  ncclComm_t three = (ncclComm_t)(uintptr_t)1;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.commName = "three";
  NCCLCHECK(ncclCommSplit(world, g_rank == 3 ? NCCL_SPLIT_NOCOLOR : 7, g_rank, &three, &cfg));
  if (g_rank == 3) {
    CHECK(three == NULL, "NOCOLOR split returned a communicator");
  } else {
    NCCLCHECK(ncclCommCount(three, &count));
    CHECK(count == 3, "split of 3 has count %d", count);
    int x = 1;
    NCCLCHECK(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, three, NULL));
    CHECK(x == 3, "allreduce on 3 ranks gave %d", x);
    NCCLCHECK(ncclCommDestroy(three));
  }
  NCCLCHECK(ncclCommFinalize(half));
  NCCLCHECK(ncclCommDestroy(half));
}

/* ---- shrink ------------------------------------------------------------ */

static void test_shrink(ncclComm_t world) {
  /* Bad lists fail locally, before any rendezvous, and leave world usable. */
  ncclComm_t out = NULL;
  int self[1] = {g_rank}, far[1] = {kRanks};
  EXPECT_ERROR(ncclCommShrink(world, self, 1, &out, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument,
               "excludes itself");
  EXPECT_ERROR(ncclCommShrink(world, far, 1, &out, NULL, NCCL_SHRINK_ABORT), ncclInvalidArgument,
               "out of range");

  /* Ranks 0, 1, 3 drop rank 2, which does not call; world stays intact. */
  if (g_rank != 2) {
    int excl[1] = {2};
    ncclComm_t small = NULL;
    NCCLCHECK(ncclCommShrink(world, excl, 1, &small, NULL, NCCL_SHRINK_DEFAULT));
    int count = -1, rank = -1;
    NCCLCHECK(ncclCommCount(small, &count));
    NCCLCHECK(ncclCommUserRank(small, &rank));
    CHECK(count == 3, "shrunk count %d, want 3", count);
    CHECK(rank == (g_rank < 2 ? g_rank : 2), "shrunk rank %d (old %d)", rank, g_rank);
    int v = g_rank + 1;
    NCCLCHECK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, small, NULL));
    CHECK(v == 1 + 2 + 4, "allreduce on the shrunk comm gave %d, want 7", v);
    NCCLCHECK(ncclCommDestroy(small));
  }

  /* Error recovery: a duplicate (a split with one color) is shrunk with
   * NCCL_SHRINK_ABORT by ranks 0, 2, 3 while rank 1 just destroys it. (An
   * empty exclude list is ncclInvalidArgument, as in NCCL.) */
  ncclComm_t dup = NULL;
  EXPECT_ERROR(ncclCommShrink(world, NULL, 0, &dup, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument,
               "at least one rank");
  NCCLCHECK(ncclCommSplit(world, 0, g_rank, &dup, NULL));
  if (g_rank == 1) {
    NCCLCHECK(ncclCommDestroy(dup));
  } else {
    int excl[1] = {1};
    ncclComm_t rest = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.commName = "rest";
    NCCLCHECK(ncclCommShrink(dup, excl, 1, &rest, &cfg, NCCL_SHRINK_ABORT));
    float f[3] = {(float)g_rank, 1.0f, -2.0f};
    NCCLCHECK(ncclAllReduce(f, f, 3, ncclFloat, ncclSum, rest, NULL));
    CHECK(f[0] == 5.0f && f[1] == 3.0f && f[2] == -6.0f, "allreduce after abort+shrink gave %g %g %g", f[0],
          f[1], f[2]);
    NCCLCHECK(ncclCommDestroy(rest));
    (void)ncclCommDestroy(dup);
  }
  int w = 1;
  NCCLCHECK(ncclAllReduce(&w, &w, 1, ncclInt32, ncclSum, world, NULL));
  CHECK(w == kRanks, "world after shrinks gave %d", w);
}

/* ---- PreMulSum --------------------------------------------------------- */

static void test_premulsum(ncclComm_t comm) {
  size_t n = 257;
  for (int t = 0; t < ncclNumTypes; ++t) {
    ncclDataType_t dt = (ncclDataType_t)t;
    size_t es = dtype_size(t);
    unsigned char scalar[8];
    unsigned char* buf = malloc(n * kRanks * es);
    unsigned char* out = malloc(n * kRanks * es);
    put_value(t, scalar, 0, premul_scalar(t, g_rank));
    for (size_t i = 0; i < n * kRanks; ++i) put_value(t, buf, i, premul_input(t, g_rank, i));
    ncclRedOp_t op;
    /* Host-immediate scalar: the value is read now, so overwrite it after. */
    NCCLCHECK(ncclRedOpCreatePreMulSum(&op, scalar, dt, ncclScalarHostImmediate, comm));
    CHECK((int)op >= ncclNumOps, "PreMulSum handle %d is a built-in value", (int)op);
    memset(scalar, 0, sizeof scalar);
    NCCLCHECK(ncclAllReduce(buf, out, n, dt, op, comm, NULL));
    for (size_t i = 0, bad = 0; i < n && bad < 3; ++i) {
      double want = premul_expected(t, kRanks, i), got = get_value(t, out, i);
      if (got != want) {
        CHECK(0, "premulsum allreduce %s [%zu] = %g, want %g", dtype_label(t), i, got, want);
        ++bad;
      }
    }
    NCCLCHECK(ncclReduceScatter(buf, out, n, dt, op, comm, NULL));
    for (size_t i = 0, bad = 0; i < n && bad < 3; ++i) {
      double want = premul_expected(t, kRanks, (size_t)g_rank * n + i), got = get_value(t, out, i);
      if (got != want) {
        CHECK(0, "premulsum reducescatter %s [%zu] = %g, want %g", dtype_label(t), i, got, want);
        ++bad;
      }
    }
    EXPECT_ERROR(ncclAllReduce(buf, out, n, (ncclDataType_t)((t + 1) % ncclNumTypes), op, comm, NULL),
                 ncclInvalidArgument, "PreMulSum");
    NCCLCHECK(ncclRedOpDestroy(op, comm));
    EXPECT_ERROR(ncclAllReduce(buf, out, n, dt, op, comm, NULL), ncclInvalidArgument, "operator");

    /* "Device" residence: the scalar is read when the collective runs. */
    put_value(t, scalar, 0, 0);
    NCCLCHECK(ncclRedOpCreatePreMulSum(&op, scalar, dt, ncclScalarDevice, comm));
    put_value(t, scalar, 0, premul_scalar(t, g_rank));
    NCCLCHECK(ncclReduce(buf, out, n, dt, op, 0, comm, NULL));
    if (g_rank == 0)
      for (size_t i = 0, bad = 0; i < n && bad < 3; ++i) {
        double want = premul_expected(t, kRanks, i), got = get_value(t, out, i);
        if (got != want) {
          CHECK(0, "premulsum reduce (device scalar) %s [%zu] = %g, want %g", dtype_label(t), i,
                got, want);
          ++bad;
        }
      }
    NCCLCHECK(ncclRedOpDestroy(op, comm));
    free(buf);
    free(out);
  }
}

/* ---- bad input: NCCL's result codes and a useful message --------------- */

static void test_bad_input(ncclComm_t comm) {
  float x[4] = {0};
  EXPECT_ERROR(ncclAllReduce(x, x, 4, ncclFloat, ncclSum, NULL, NULL), ncclInvalidArgument, "comm");
  EXPECT_ERROR(ncclSend(x, 4, ncclFloat, 0, NULL, NULL), ncclInvalidArgument, "comm");
  EXPECT_ERROR(ncclCommCount(NULL, (int*)x), ncclInvalidArgument, "comm");
  EXPECT_ERROR(ncclAllReduce(x, x, 4, (ncclDataType_t)ncclNumTypes, ncclSum, comm, NULL),
               ncclInvalidArgument, "datatype");
  EXPECT_ERROR(ncclAllReduce(x, x, 4, (ncclDataType_t)-1, ncclSum, comm, NULL),
               ncclInvalidArgument, "datatype");
  EXPECT_ERROR(ncclAllReduce(x, x, 4, ncclFloat, (ncclRedOp_t)(ncclNumOps + 40), comm, NULL),
               ncclInvalidArgument, "operator");
  EXPECT_ERROR(ncclReduce(x, x, 4, ncclFloat, (ncclRedOp_t)-3, 0, comm, NULL),
               ncclInvalidArgument, "operator");
  EXPECT_ERROR(ncclAllReduce(x, x, SIZE_MAX / 2, ncclFloat, ncclSum, comm, NULL),
               ncclInvalidArgument, "overflow");
  EXPECT_ERROR(ncclAllGather(x, x, SIZE_MAX / 8, ncclInt8, comm, NULL), ncclInvalidArgument,
               "overflow");
  EXPECT_ERROR(ncclSend(x, 4, ncclFloat, kRanks, comm, NULL), ncclInvalidArgument, "peer");
  EXPECT_ERROR(ncclRecv(x, 4, ncclFloat, -1, comm, NULL), ncclInvalidArgument, "peer");
  EXPECT_ERROR(ncclBroadcast(x, x, 4, ncclFloat, kRanks + 3, comm, NULL), ncclInvalidArgument, "root");
  EXPECT_ERROR(ncclAllReduce(NULL, x, 4, ncclFloat, ncclSum, comm, NULL), ncclInvalidArgument,
               "sendbuff");
  /* Memory the process cannot read (as a device pointer would be without
   * CUDA): an error, not a crash. */
  void* hole = mmap(NULL, 8192, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (hole != MAP_FAILED) {
    EXPECT_ERROR(ncclAllReduce(hole, x, 4, ncclFloat, ncclSum, comm, NULL), ncclInvalidArgument,
                 "host memory");
    EXPECT_ERROR(ncclRecv((char*)hole + 4096, 16, ncclFloat, 0, comm, NULL), ncclInvalidArgument,
                 "host memory");
    munmap(hole, 8192);
  }
  EXPECT_ERROR(ncclRedOpDestroy(ncclSum, comm), ncclInvalidArgument, "built-in");
  EXPECT_ERROR(ncclGroupEnd(), ncclInvalidUsage, "GroupStart");
  EXPECT_ERROR(ncclGetVersion(NULL), ncclInvalidArgument, "version");
  EXPECT_ERROR(ncclCommSplit(comm, -7, 0, NULL, NULL), ncclInvalidArgument, "newcomm");
  EXPECT_ERROR(ncclCommRevoke(comm, 5), ncclInvalidArgument, "revokeFlags");

  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclComm_t c = NULL;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.magic = 0x12345678;
  EXPECT_ERROR(ncclCommInitRankConfig(&c, kRanks, id, g_rank, &cfg), ncclInvalidArgument, "magic");
  ncclConfig_t cfg2 = NCCL_CONFIG_INITIALIZER;
  cfg2.blocking = 3;
  EXPECT_ERROR(ncclCommInitRankConfig(&c, kRanks, id, g_rank, &cfg2), ncclInvalidArgument, "blocking");
  EXPECT_ERROR(ncclCommInitRank(&c, kRanks, id, kRanks + 1), ncclInvalidArgument, "rank");
  EXPECT_ERROR(ncclCommInitRank(&c, 0, id, 0), ncclInvalidArgument, "nranks");
  EXPECT_ERROR(ncclCommInitRank(NULL, kRanks, id, 0), ncclInvalidArgument, "NULL");

  for (int r = 0; r <= ncclNumResults; ++r) {
    const char* s = ncclGetErrorString((ncclResult_t)r);
    CHECK(s != NULL && s[0] != '\0', "empty error string for %d", r);
  }
  CHECK(strcmp(ncclGetErrorString(ncclSuccess), ncclGetErrorString(ncclInvalidArgument)) != 0,
        "success and invalid argument share a string");
}

/* ---- registration, windows, memory -------------------------------------- */

static void test_memory(ncclComm_t comm) {
  void* mem = NULL;
  NCCLCHECK(ncclMemAlloc(&mem, 1 << 20));
  CHECK(mem != NULL && (uintptr_t)mem % NCCL_WIN_REQUIRED_ALIGNMENT == 0, "ncclMemAlloc alignment");
  /* Not touched from the host: with a CUDA runtime that sees a GPU it is device memory. */
  void* handle = NULL;
  NCCLCHECK(ncclCommRegister(comm, mem, 1 << 20, &handle));
  CHECK(handle != NULL, "register gave a NULL handle");
  NCCLCHECK(ncclCommDeregister(comm, handle));
  /* NCCL: an unknown handle is ncclInvalidUsage; NULL (a skipped registration) succeeds. */
  EXPECT_ERROR(ncclCommDeregister(comm, handle), ncclInvalidUsage, "registered");
  NCCLCHECK(ncclCommDeregister(comm, NULL));
  ncclWindow_t win = NULL;
  NCCLCHECK(ncclCommWindowRegister(comm, mem, 1 << 20, &win, NCCL_WIN_COLL_SYMMETRIC));
  CHECK(win != NULL, "window register gave NULL");
  NCCLCHECK(ncclCommWindowDeregister(comm, win));
  NCCLCHECK(ncclMemFree(mem));
  int dev = -1;
  NCCLCHECK(ncclCommCuDevice(comm, &dev));
  CHECK(dev == 0, "cuDevice %d, want 0 for a host communicator", dev);
}

/* ---- non-blocking init, scalable init, abort --------------------------- */

static void test_nonblocking(void) {
  ncclUniqueId id;
  share_id("nonblocking", &id);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, kRanks, id, g_rank, &cfg);
  CHECK(r == ncclInProgress || r == ncclSuccess, "non-blocking init returned %d", (int)r);
  CHECK(comm != NULL, "non-blocking init gave no handle");
  NCCLCHECK(wait_comm(comm));
  double v[3] = {g_rank, 1, 2};
  r = ncclAllReduce(v, v, 3, ncclDouble, ncclMax, comm, NULL);
  CHECK(r == ncclInProgress || r == ncclSuccess, "non-blocking allreduce returned %d", (int)r);
  NCCLCHECK(wait_comm(comm));
  CHECK(v[0] == kRanks - 1 && v[1] == 1 && v[2] == 2, "non-blocking allreduce gave %g %g %g", v[0],
        v[1], v[2]);
  r = ncclCommFinalize(comm);
  CHECK(r == ncclInProgress || r == ncclSuccess, "non-blocking finalize returned %d", (int)r);
  NCCLCHECK(wait_comm(comm));
  NCCLCHECK(ncclCommDestroy(comm));
}

static void test_scalable(void) {
  ncclUniqueId id;
  share_id("scalable", &id);
  ncclComm_t comm = NULL;
  NCCLCHECK(ncclCommInitRankScalable(&comm, kRanks, g_rank, 1, &id, NULL));
  long long v = 1LL << (10 * g_rank);
  NCCLCHECK(ncclAllReduce(&v, &v, 1, ncclInt64, ncclSum, comm, NULL));
  CHECK(v == 1 + (1LL << 10) + (1LL << 20) + (1LL << 30), "scalable allreduce gave %lld", v);
  NCCLCHECK(ncclCommDestroy(comm));
}

static void test_abort(void) {
  ncclUniqueId id;
  share_id("abort", &id);
  ncclComm_t comm = NULL;
  NCCLCHECK(ncclCommInitRank(&comm, kRanks, id, g_rank));
  int v = 1;
  NCCLCHECK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL));
  CHECK(v == kRanks, "allreduce before abort gave %d", v);
  if (g_rank == 0) {
    /* Rank 0 leaves; its peers, blocked in an allreduce, must get an error
     * (not hang, not succeed). */
    NCCLCHECK(ncclCommAbort(comm));
    return;
  }
  double t0 = now_s();
  ncclResult_t r = ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL);
  CHECK(r != ncclSuccess, "allreduce with an aborted peer succeeded");
  ncclResult_t async = ncclSuccess;
  NCCLCHECK(ncclCommGetAsyncError(comm, &async));
  CHECK(async != ncclSuccess && async != ncclInProgress, "async error %d after a failed op", (int)async);
  fprintf(stderr, "[rank %d] peer abort seen after %.2f s: %s (%s)\n", g_rank, now_s() - t0,
          ncclGetErrorString(r), ncclGetLastError(comm));
  NCCLCHECK(ncclCommAbort(comm));
}

static void test_revoke_then_split(void) {
  ncclUniqueId id;
  share_id("revoke", &id);
  ncclComm_t comm = NULL;
  NCCLCHECK(ncclCommInitRank(&comm, kRanks, id, g_rank));
  /* Blocking communicator: Revoke returns once it is quiescent. */
  NCCLCHECK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
  ncclResult_t async = ncclInternalError;
  NCCLCHECK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclSuccess, "async state %d after revoke", (int)async);
  int v = 1;
  EXPECT_ERROR(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL), ncclInvalidUsage, "revoked");
  EXPECT_ERROR(ncclCommFinalize(comm), ncclInvalidUsage, "Revoke");
  /* The revoked communicator still splits (across processes). */
  ncclComm_t half = NULL;
  NCCLCHECK(ncclCommSplit(comm, g_rank % 2, g_rank, &half, NULL));
  v = 1 << g_rank;
  NCCLCHECK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, half, NULL));
  CHECK(v == (g_rank % 2 ? 2 + 8 : 1 + 4), "allreduce after revoke + split gave %d", v);
  NCCLCHECK(ncclCommDestroy(half));
  NCCLCHECK(ncclCommDestroy(comm));
}

/* ---- one rank ----------------------------------------------------------- */

static void run_rank(void) {
  int version = 0;
  NCCLCHECK(ncclGetVersion(&version));
  CHECK(version == NCCL_VERSION_CODE, "version %d, want %d", version, NCCL_VERSION_CODE);

  ncclUniqueId id;
  share_id("world", &id);
  ncclComm_t world = NULL;
  NCCLCHECK(ncclCommInitRank(&world, kRanks, id, g_rank));
  int count = 0, rank = -1;
  NCCLCHECK(ncclCommCount(world, &count));
  NCCLCHECK(ncclCommUserRank(world, &rank));
  CHECK(count == kRanks && rank == g_rank, "count %d rank %d", count, rank);

  test_bad_input(world);
  test_memory(world);
  test_reductions(world);
  test_movement(world);
  test_p2p_and_groups(world);
  test_split(world);
  test_shrink(world);
  test_premulsum(world);
  test_nonblocking();
  test_scalable();

  NCCLCHECK(ncclCommFinalize(world));
  NCCLCHECK(ncclCommDestroy(world));
  test_revoke_then_split();
  test_abort();
}

/* ---- single process: InitAll and grouped InitRank ---------------------- */

static void test_single_process(void) {
  ncclComm_t comms[kRanks];
  int devs[kRanks] = {3, 2, 1, 0};
  NCCLCHECK(ncclCommInitAll(comms, kRanks, devs));
  float v[kRanks][8];
  for (int r = 0; r < kRanks; ++r)
    for (int i = 0; i < 8; ++i) v[r][i] = (float)(r * i);
  NCCLCHECK(ncclGroupStart());
  for (int r = 0; r < kRanks; ++r)
    NCCLCHECK(ncclAllReduce(v[r], v[r], 8, ncclFloat, ncclSum, comms[r], NULL));
  NCCLCHECK(ncclGroupEnd());
  for (int r = 0; r < kRanks; ++r) {
    int dev = -1;
    NCCLCHECK(ncclCommCuDevice(comms[r], &dev));
    CHECK(dev == devs[r], "InitAll comm %d device %d, want %d", r, dev, devs[r]);
    for (int i = 0; i < 8; ++i) CHECK(v[r][i] == (float)(6 * i), "InitAll allreduce [%d][%d] = %g", r, i, v[r][i]);
  }
  for (int r = 0; r < kRanks; ++r) NCCLCHECK(ncclCommDestroy(comms[r]));

  /* NCCL's multi-rank-per-thread idiom: InitRank for every rank in a group. */
  ncclUniqueId id;
  NCCLCHECK(ncclGetUniqueId(&id));
  NCCLCHECK(ncclGroupStart());
  for (int r = 0; r < kRanks; ++r) NCCLCHECK(ncclCommInitRank(&comms[r], kRanks, id, r));
  NCCLCHECK(ncclGroupEnd());
  int x[kRanks];
  NCCLCHECK(ncclGroupStart());
  for (int r = 0; r < kRanks; ++r) {
    x[r] = r;
    NCCLCHECK(ncclAllReduce(&x[r], &x[r], 1, ncclInt32, ncclMax, comms[r], NULL));
  }
  NCCLCHECK(ncclGroupEnd());
  for (int r = 0; r < kRanks; ++r) CHECK(x[r] == kRanks - 1, "grouped init allreduce gave %d", x[r]);
  for (int r = 0; r < kRanks; ++r) NCCLCHECK(ncclCommDestroy(comms[r]));
}

int main(void) {
  /* The library must be Loom's, not an NCCL found elsewhere. */
  Dl_info info;
  if (dladdr((void*)ncclGetVersion, &info) == 0 || info.dli_fname == NULL ||
      strstr(info.dli_fname, LOOM_EXPECTED_LIBDIR) == NULL) {
    fprintf(stderr, "FAIL: ncclGetVersion comes from %s, not %s\n",
            info.dli_fname ? info.dli_fname : "?", LOOM_EXPECTED_LIBDIR);
    return 1;
  }
  if (self_test_encoding() != 0) return 1;

  snprintf(g_dir, sizeof g_dir, "/tmp/loom-nccl-functional-XXXXXX");
  if (mkdtemp(g_dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  pid_t pids[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      g_rank = r;
      run_rank();
      if (g_failures != 0) fprintf(stderr, "[rank %d] %d check(s) failed\n", r, g_failures);
      fflush(stderr);
      _exit(g_failures == 0 ? 0 : 1);
    }
  }
  /* Reap; once one rank fails, give the others a moment, then stop them. */
  int failed = 0, left = kRanks;
  double deadline = now_s() + 280, kill_at = 0;
  while (left > 0) {
    int status;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      --left;
      int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      for (int r = 0; r < kRanks; ++r)
        if (pids[r] == p) {
          pids[r] = 0;
          if (!ok) fprintf(stderr, "rank %d failed (status 0x%x)\n", r, status);
        }
      if (!ok && !failed) {
        failed = 1;
        kill_at = now_s() + 5;
      }
      continue;
    }
    if ((kill_at > 0 && now_s() > kill_at) || now_s() > deadline) {
      for (int r = 0; r < kRanks; ++r)
        if (pids[r] > 0) {
          fprintf(stderr, "killing rank %d (still running)\n", r);
          kill(pids[r], SIGKILL);
        }
      failed = 1;
      kill_at = now_s() + 1e9;
      deadline = now_s() + 1e9;
    }
    usleep(10000);
  }
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  if (failed) {
    fprintf(stderr, "nccl_functional: FAILED (multi-process part)\n");
    return 1;
  }

  g_rank = -1; /* the parent, from here on */
  test_single_process();
  if (g_failures != 0) {
    fprintf(stderr, "nccl_functional: FAILED (%d single-process checks)\n", g_failures);
    return 1;
  }
  printf("nccl_functional: OK (4 ranks x %d types x %d ops; movement, p2p, groups, split, shrink, "
         "PreMulSum, non-blocking, scalable, revoke, abort, bad input; InitAll)\n",
         ncclNumTypes, ncclNumOps);
  return 0;
}
