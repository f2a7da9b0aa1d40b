/* mpi_bench: the perf suite's sweep over plain MPI collectives, so that
 * compare.sh can put Open MPI and MPICH next to Loom. Built against Open MPI
 * by CMake (mpi_bench) and against MPICH with mpicc.mpich (mpi_bench_mpich).
 *
 * Same conventions as the *_perf binaries: float sum, nccl-tests' size
 * column and busbw factors, out-of-place buffers allocated and touched once,
 * time averaged over ranks, one verification run per size after timing.
 *
 * usage: mpirun -np N mpi_bench -c allreduce|reduce_scatter|all_gather|broadcast
 *            [-s 8,4K,1M] [-n iters] [-w warmup] [-l label] [-f] [-H]
 * -f: fresh inputs, as the *_perf binaries' --fresh: the input (the broadcast
 * buffer at the root) is rewritten before every timed call, and only the
 * calls are timed.
 * -H: buffers in whole 2 MiB pages advised as transparent huge pages, as the
 * *_perf binaries' --thp (single-copy reads pin one page per 2 MiB).
 * Output (rank 0): CSV impl,coll,nranks,size,count,time_us,algbw,busbw,wrong */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include <mpi.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { kAllReduce, kReduceScatter, kAllGather, kBroadcast };

static size_t parse_size(const char* s) {
  char* end = NULL;
  double v = strtod(s, &end);
  if (end == s || v < 0) return (size_t)-1;
  switch (*end) {
    case 'k': case 'K': v *= 1024; ++end; break;
    case 'm': case 'M': v *= 1024 * 1024; ++end; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; ++end; break;
    default: break;
  }
  if (*end == 'B' || *end == 'b') ++end;
  return *end == '\0' ? (size_t)v : (size_t)-1;
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int run(int coll, float* send, float* recv, size_t count) {
  int c = (int)count;
  switch (coll) {
    case kAllReduce: return MPI_Allreduce(send, recv, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    case kReduceScatter: return MPI_Reduce_scatter_block(send, recv, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    case kAllGather: return MPI_Allgather(send, c, MPI_FLOAT, recv, c, MPI_FLOAT, MPI_COMM_WORLD);
    default: return MPI_Bcast(recv, c, MPI_FLOAT, 0, MPI_COMM_WORLD);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int n, rank;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int coll = -1, iters = 20, warmup = 5, fresh = 0, thp = 0;
  const char* label = "mpi";
  const char* names[] = {"allreduce", "reduce_scatter", "all_gather", "broadcast"};
  char sizes_arg[1024] = "8,4K,64K,1M,4M,16M,64M,256M";
  int opt;
  while ((opt = getopt(argc, argv, "c:s:n:w:l:fH")) != -1) {
    switch (opt) {
      case 'c':
        for (int i = 0; i < 4; ++i)
          if (strcmp(optarg, names[i]) == 0) coll = i;
        break;
      case 's': snprintf(sizes_arg, sizeof sizes_arg, "%s", optarg); break;
      case 'n': iters = atoi(optarg); break;
      case 'w': warmup = atoi(optarg); break;
      case 'l': label = optarg; break;
      case 'f': fresh = 1; break;
      case 'H': thp = 1; break;
      default: coll = -2; break;
    }
  }
  if (coll < 0 || iters < 1 || warmup < 0) {
    if (rank == 0) fprintf(stderr, "usage: mpi_bench -c allreduce|reduce_scatter|all_gather|broadcast [-s LIST] [-n N] [-w N] [-l label] [-f] [-H]\n");
    MPI_Finalize();
    return 2;
  }
  size_t sizes[64];
  int nsizes = 0;
  size_t max_bytes = 0;
  for (char* tok = strtok(sizes_arg, ","); tok && nsizes < 64; tok = strtok(NULL, ",")) {
    size_t v = parse_size(tok);
    if (v == (size_t)-1) {
      if (rank == 0) fprintf(stderr, "mpi_bench: bad size '%s'\n", tok);
      MPI_Finalize();
      return 2;
    }
    sizes[nsizes++] = v;
    if (v > max_bytes) max_bytes = v;
  }
  /* Both buffers hold the largest "size" (the largest of send and receive). */
  size_t max_elems = max_bytes / sizeof(float) + 16;
  size_t buf_bytes = max_elems * sizeof(float);
  float* send = NULL;
  float* recv = NULL;
  if (thp) {
    const size_t huge = (size_t)2 << 20;
    buf_bytes = (buf_bytes + huge - 1) / huge * huge;
    if (posix_memalign((void**)&send, huge, buf_bytes) != 0) send = NULL;
    if (posix_memalign((void**)&recv, huge, buf_bytes) != 0) recv = NULL;
    if (send) madvise(send, buf_bytes, MADV_HUGEPAGE);
    if (recv) madvise(recv, buf_bytes, MADV_HUGEPAGE);
  } else {
    send = malloc(buf_bytes);
    recv = malloc(buf_bytes);
  }
  if (!send || !recv) {
    fprintf(stderr, "mpi_bench: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  memset(send, 0, buf_bytes);
  memset(recv, 0, buf_bytes);
  if (rank == 0) printf("impl,coll,nranks,size,count,time_us,algbw,busbw,wrong\n");
  for (int si = 0; si < nsizes; ++si) {
    /* The per-rank block as nccl-tests (and Loom's *_perf) cut it: a multiple
     * of 16 bytes, so every library's row of a size moves the same bytes. */
    size_t total = sizes[si] / sizeof(float), per = (total / (size_t)n) & ~(size_t)3;
    size_t count = (coll == kAllReduce || coll == kBroadcast) ? total : per;
    size_t size_col = (coll == kAllReduce || coll == kBroadcast) ? total * 4 : per * n * 4;
    double factor = coll == kAllReduce ? 2.0 * (n - 1) / n : coll == kBroadcast ? 1.0 : (double)(n - 1) / n;
    if (count == 0) continue;  /* nothing to move at this size and rank count */
    for (int i = 0; i < warmup; ++i) run(coll, send, recv, count);
    MPI_Barrier(MPI_COMM_WORLD);
    /* -f: the same bytes as freshen_input in perf_colls.cc (normal floats). */
    float* in = coll == kBroadcast ? recv : send;
    size_t in_bytes = (coll == kReduceScatter ? per * n : count) * sizeof(float);
    double t0 = now_us(), fresh_us = 0;
    for (int i = 0; i < iters; ++i) {
      if (!fresh) {
        run(coll, send, recv, count);
        continue;
      }
      memset(in, 0x30 + (i & 7), in_bytes);
      double start = now_us();
      run(coll, send, recv, count);
      fresh_us += now_us() - start;
    }
    double us = (fresh ? fresh_us : now_us() - t0) / iters, sum = 0;
    MPI_Allreduce(&us, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    us = sum / n;
    /* Verification: rank r contributes r+1 everywhere. */
    size_t in_elems = coll == kReduceScatter ? per * n : count;
    size_t out_elems = coll == kAllGather ? per * n : count;
    for (size_t i = 0; i < in_elems; ++i) send[i] = (float)(rank + 1);
    for (size_t i = 0; i < out_elems; ++i) recv[i] = -1.0f;
    if (coll == kBroadcast && rank == 0)
      for (size_t i = 0; i < count; ++i) recv[i] = 1.0f;
    run(coll, send, recv, count);
    long long wrong = 0, wrong_sum = 0;
    for (size_t i = 0; i < out_elems; ++i) {
      float want = coll == kBroadcast ? 1.0f : coll == kAllGather ? (float)(i / per + 1) : (float)(n * (n + 1) / 2);
      if (recv[i] != want) ++wrong;
    }
    for (size_t i = 0; i < in_elems; ++i) send[i] = 0;
    MPI_Allreduce(&wrong, &wrong_sum, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    double algbw = size_col / (us * 1e3);
    if (rank == 0)
      printf("%s,%s,%d,%zu,%zu,%.3f,%.4f,%.4f,%lld\n", label, names[coll], n, size_col, count, us, algbw,
             algbw * factor, wrong_sum);
    fflush(stdout);
  }
  free(send);
  free(recv);
  MPI_Finalize();
  return 0;
}
