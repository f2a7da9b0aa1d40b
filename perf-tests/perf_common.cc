#include "perf_common.h"

#include <getopt.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/algorithms.h"
#include "core/config.h"
#include "bootstrap/bootstrap.h"
#include "loom/comm.h"
#include "verifiable.h"

namespace loom::perf {
namespace {

struct Options {
  size_t min_bytes = 32 << 20;
  size_t max_bytes = 32 << 20;
  double factor = 0;   // -f; 0 = use step
  size_t step = 1 << 20;  // -i
  int iters = 20;      // -n
  int warmup = 5;      // -w
  int check = 1;       // -c
  DataType dt = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  int root = 0;
  bool blocking = false;  // -z: wait for each op before issuing the next
};

void usage(const char* prog) {
  printf(
      "usage: %s [options]\n"
      "  -b, --minbytes SIZE   smallest size (default 32M; K/M/G suffixes)\n"
      "  -e, --maxbytes SIZE   largest size (default 32M)\n"
      "  -f, --stepfactor F    multiply the size by F between steps\n"
      "  -i, --stepbytes SIZE  add SIZE between steps (when -f is not given; default 1M)\n"
      "  -n, --iters N         timed iterations per size (default 20)\n"
      "  -w, --warmup_iters N  untimed iterations first (default 5)\n"
      "  -c, --check 0/1       verify results in closed form (default 1)\n"
      "  -d, --datatype T      int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2\n"
      "  -o, --op OP           sum prod max min avg (default sum)\n"
      "  -r, --root R          root for broadcast/reduce (default 0)\n"
      "  -z, --blocking 0/1    wait for each operation before the next (default 0)\n"
      "  -h, --help\n"
      "Ranks come from the environment: run under loomrun, mpirun, srun or torchrun.\n",
      prog);
}

bool parse_size(const char* s, size_t* out) {
  uint64_t v;
  if (!parse_bytes(s, &v)) return false;
  *out = v;
  return true;
}

// nccl-tests conventions: the "size" column and the busbw factor per collective.
struct Shape {
  size_t send_count, recv_count;  // elements in the buffers
  size_t count;                   // the per-call count argument
  double bus_factor;
};

Shape shape_for(Collective c, size_t bytes, size_t es, int n) {
  size_t total = bytes / es;
  switch (c) {
    case Collective::kAllReduce: return {total, total, total, 2.0 * (n - 1) / n};
    case Collective::kReduceScatter: {
      size_t per = total / n;
      return {per * n, per, per, double(n - 1) / n};
    }
    case Collective::kAllGather: {
      size_t per = total / n;
      return {per, per * n, per, double(n - 1) / n};
    }
    case Collective::kAllToAll: {
      size_t per = total / n;
      return {per * n, per * n, per, double(n - 1) / n};
    }
    default: return {total, total, total, 1.0};
  }
}

Result<Work> issue(Comm& comm, Collective c, const void* send, void* recv, size_t count, const Options& o) {
  const int n = comm.size(), r = comm.rank();
  switch (c) {
    case Collective::kAllReduce: return comm.allreduce(send, recv, count, o.dt, o.op);
    case Collective::kReduceScatter: return comm.reduce_scatter(send, recv, count, o.dt, o.op);
    case Collective::kAllGather: return comm.all_gather(send, recv, count, o.dt);
    case Collective::kBroadcast: return comm.broadcast(send, recv, count, o.dt, o.root);
    case Collective::kReduce: return comm.reduce(send, recv, count, o.dt, o.op, o.root);
    case Collective::kAllToAll: return comm.all_to_all(send, recv, count, o.dt);
    case Collective::kSendRecv: {
      comm.group_start();
      (void)comm.send(send, count, o.dt, (r + 1) % n);
      (void)comm.recv(recv, count, o.dt, (r - 1 + n) % n);
      return comm.group_end();
    }
  }
  return invalid_argument("collective");
}

bool reduces(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduceScatter || c == Collective::kReduce;
}

// The send/recv pointers of one call; in place follows NCCL's layout rules.
std::pair<std::byte*, std::byte*> buffers_for(Collective c, std::byte* send, std::byte* recv, const Shape& s, size_t es,
                                              int r, bool in_place) {
  if (!in_place) return {send, recv};
  if (c == Collective::kReduceScatter) return {recv, recv + r * s.count * es};
  if (c == Collective::kAllGather) return {recv + r * s.count * es, recv};
  return {recv, recv};
}

// Fills inputs, runs once, counts wrong elements on this rank.
size_t verify_once(Comm& comm, Collective c, std::byte* send, std::byte* recv, const Shape& s, const Options& o,
                   bool in_place, Status* err) {
  const int n = comm.size(), r = comm.rank();
  const size_t es = dtype_size(o.dt);
  const RedOp fop = reduces(c) ? o.op : RedOp::kSum;
  auto [sp, rp] = buffers_for(c, send, recv, s, es, r, in_place);
  verifiable::fill(sp, s.send_count, o.dt, fop, r);
  auto w = issue(comm, c, sp, rp, s.count, o);
  *err = w.is_ok() ? w->wait() : w.status();
  if (!err->is_ok()) return 0;
  std::string first;
  switch (c) {
    case Collective::kAllReduce: return verifiable::count_wrong_reduced(rp, s.count, o.dt, o.op, n, 0, &first);
    case Collective::kReduceScatter:
      return verifiable::count_wrong_reduced(rp, s.count, o.dt, o.op, n, r * s.count, &first);
    case Collective::kReduce:
      return r == o.root ? verifiable::count_wrong_reduced(rp, s.count, o.dt, o.op, n, 0, &first) : 0;
    case Collective::kBroadcast: return verifiable::count_wrong_copied(rp, s.count, o.dt, fop, o.root, 0, &first);
    case Collective::kAllGather: {
      size_t w2 = 0;
      for (int b = 0; b < n; ++b) w2 += verifiable::count_wrong_copied(rp + b * s.count * es, s.count, o.dt, fop, b, 0, &first);
      return w2;
    }
    case Collective::kAllToAll: {
      size_t w2 = 0;
      for (int b = 0; b < n; ++b)
        w2 += verifiable::count_wrong_copied(rp + b * s.count * es, s.count, o.dt, fop, b, r * s.count, &first);
      return w2;
    }
    case Collective::kSendRecv:
      return verifiable::count_wrong_copied(rp, s.count, o.dt, fop, (r - 1 + n) % n, 0, &first);
  }
  return 0;
}

// Times iters operations; returns microseconds per operation on this rank.
double time_ops(Comm& comm, Collective c, std::byte* send, std::byte* recv, const Shape& s, const Options& o,
                bool in_place, int iters, Status* err) {
  const int r = comm.rank();
  const size_t es = dtype_size(o.dt);
  auto [sp, rp] = buffers_for(c, send, recv, s, es, r, in_place);
  auto t0 = std::chrono::steady_clock::now();
  Work last;
  for (int i = 0; i < iters; ++i) {
    auto w = issue(comm, c, sp, rp, s.count, o);
    if (!w.is_ok()) {
      *err = w.status();
      return 0;
    }
    if (o.blocking) {
      *err = w->wait();
      if (!err->is_ok()) return 0;
    }
    last = *w;
  }
  *err = last.wait();
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / std::max(1, iters);
}

// Sum of a double over ranks (for averaging times and totalling #wrong).
double sum_over_ranks(Comm& comm, double v) {
  auto w = comm.allreduce(&v, &v, 1, DataType::kFloat64, RedOp::kSum);
  if (w.is_ok()) (void)w->wait();
  return v;
}

const char* nccl_type_name(DataType dt) {
  switch (dt) {
    case DataType::kInt8: return "int8";
    case DataType::kUint8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kUint32: return "uint32";
    case DataType::kInt64: return "int64";
    case DataType::kUint64: return "uint64";
    case DataType::kFloat16: return "half";
    case DataType::kFloat32: return "float";
    case DataType::kFloat64: return "double";
    case DataType::kBfloat16: return "bfloat16";
    case DataType::kFp8E4M3: return "f8e4m3";
    case DataType::kFp8E5M2: return "f8e5m2";
  }
  return "?";
}

}  // namespace

int perf_main(int argc, char** argv, Collective coll) {
  Options o;
  static option longopts[] = {{"minbytes", required_argument, nullptr, 'b'},
                              {"maxbytes", required_argument, nullptr, 'e'},
                              {"stepfactor", required_argument, nullptr, 'f'},
                              {"stepbytes", required_argument, nullptr, 'i'},
                              {"iters", required_argument, nullptr, 'n'},
                              {"warmup_iters", required_argument, nullptr, 'w'},
                              {"check", required_argument, nullptr, 'c'},
                              {"datatype", required_argument, nullptr, 'd'},
                              {"op", required_argument, nullptr, 'o'},
                              {"root", required_argument, nullptr, 'r'},
                              {"blocking", required_argument, nullptr, 'z'},
                              {"help", no_argument, nullptr, 'h'},
                              {nullptr, 0, nullptr, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "b:e:f:i:n:w:c:d:o:r:z:h", longopts, nullptr)) != -1) {
    switch (ch) {
      case 'b': if (!parse_size(optarg, &o.min_bytes)) { fprintf(stderr, "bad -b %s\n", optarg); return 2; } break;
      case 'e': if (!parse_size(optarg, &o.max_bytes)) { fprintf(stderr, "bad -e %s\n", optarg); return 2; } break;
      case 'f': o.factor = atof(optarg); break;
      case 'i': if (!parse_size(optarg, &o.step)) { fprintf(stderr, "bad -i %s\n", optarg); return 2; } break;
      case 'n': o.iters = atoi(optarg); break;
      case 'w': o.warmup = atoi(optarg); break;
      case 'c': o.check = atoi(optarg); break;
      case 'd': {
        auto dt = parse_dtype(optarg);
        if (!dt) { fprintf(stderr, "unknown data type '%s'\n", optarg); return 2; }
        o.dt = *dt;
        break;
      }
      case 'o': {
        auto op = parse_redop(optarg);
        if (!op) { fprintf(stderr, "unknown op '%s'\n", optarg); return 2; }
        o.op = *op;
        break;
      }
      case 'r': o.root = atoi(optarg); break;
      case 'z': o.blocking = atoi(optarg) != 0; break;
      case 'h': usage(argv[0]); return 0;
      default: usage(argv[0]); return 2;
    }
  }
  if (o.factor != 0 && o.factor <= 1.0) { fprintf(stderr, "-f must be > 1\n"); return 2; }
  if (o.max_bytes < o.min_bytes) { fprintf(stderr, "-e must be >= -b\n"); return 2; }

  auto comm_r = Comm::init_from_env();
  if (!comm_r.is_ok()) {
    fprintf(stderr, "%s: %s\n", argv[0], comm_r.status().to_string().c_str());
    return 1;
  }
  Comm& comm = **comm_r;
  const int n = comm.size(), rank = comm.rank();
  const size_t es = dtype_size(o.dt);
  const bool rooted = coll == Collective::kBroadcast || coll == Collective::kReduce;
  if (rooted && (o.root < 0 || o.root >= n)) {
    if (rank == 0) fprintf(stderr, "root %d out of range [0, %d)\n", o.root, n);
    return 2;
  }
  const bool print = rank == 0;
  if (print) {
    printf("# Loom %s benchmark: %d ranks, %s, %s\n", collective_name(coll), n, nccl_type_name(o.dt), redop_name(o.op));
    printf("#  nThread 1 nGpus 0 minBytes %zu maxBytes %zu step: %g(%s) warmup iters: %d iters: %d agg iters: 1 validation: %d blocking: %d\n",
           o.min_bytes, o.max_bytes, o.factor ? o.factor : double(o.step), o.factor ? "factor" : "bytes", o.warmup,
           o.iters, o.check, o.blocking ? 1 : 0);
    auto algos = algorithms_for(coll);
    printf("# Topology: %d rank(s) on host %s, transport shm (POSIX shared-memory FIFOs, futex wake-ups)\n", n,
           host_name().c_str());
    for (const Algorithm* a : algos)
      printf("# Algorithm %s for %s: %s%s\n", a->name, collective_name(coll), a->description,
             a == algos.front() ? " [selected]" : "");
    printf("#\n");
    printf("#%75s%32s\n", "out-of-place", "in-place");
    printf("#%11s %13s %9s %7s %7s %8s %7s %7s %6s %8s %7s %7s %6s\n", "size", "count", "type", "redop", "root", "time",
           "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    printf("#%11s %13s %9s %7s %7s %8s %7s %7s %6s %8s %7s %7s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
           "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    fflush(stdout);
  }
  // Buffers sized for the largest step, allocated once and touched once.
  Shape maxs = shape_for(coll, o.max_bytes, es, n);
  size_t alloc = std::max(maxs.send_count, maxs.recv_count) * es + 64;
  std::vector<std::byte> sendv(alloc, std::byte{1}), recvv(alloc, std::byte{2});
  double bw_sum = 0;
  int bw_count = 0;
  double wrong_total = 0;
  bool failed = false;
  for (size_t bytes = o.min_bytes; bytes <= o.max_bytes;) {
    Shape s = shape_for(coll, bytes, es, n);
    size_t eff_bytes = std::max(s.send_count, s.recv_count) * es;  // nccl-tests "size"
    if (coll == Collective::kAllReduce || rooted || coll == Collective::kSendRecv) eff_bytes = s.count * es;
    double t[2] = {0, 0}, wrong[2] = {0, 0};
    for (int ip = 0; ip < 2 && !failed; ++ip) {
      Status err;
      time_ops(comm, coll, sendv.data(), recvv.data(), s, o, ip == 1, o.warmup, &err);
      double us = err.is_ok() ? time_ops(comm, coll, sendv.data(), recvv.data(), s, o, ip == 1, o.iters, &err) : 0;
      if (err.is_ok() && o.check) {
        wrong[ip] = static_cast<double>(verify_once(comm, coll, sendv.data(), recvv.data(), s, o, ip == 1, &err));
      }
      if (!err.is_ok()) {
        fprintf(stderr, "rank %d: %s\n", rank, err.to_string().c_str());
        failed = true;
        break;
      }
      t[ip] = sum_over_ranks(comm, us) / n;
      wrong[ip] = o.check ? sum_over_ranks(comm, wrong[ip]) : -1;
    }
    if (failed) break;
    if (print) {
      printf("%12zu %13zu %9s %7s %7d", eff_bytes, eff_bytes / es, nccl_type_name(o.dt),
             reduces(coll) ? redop_name(o.op) : "none", rooted ? o.root : -1);
      for (int ip = 0; ip < 2; ++ip) {
        double algbw = t[ip] > 0 ? double(eff_bytes) / (t[ip] * 1e3) : 0;  // decimal GB/s
        double busbw = algbw * s.bus_factor;
        bw_sum += busbw;
        ++bw_count;
        if (o.check) printf(" %8.2f %7.2f %7.2f %6.0f", t[ip], algbw, busbw, wrong[ip]);
        else printf(" %8.2f %7.2f %7.2f %6s", t[ip], algbw, busbw, "N/A");
      }
      printf("\n");
      fflush(stdout);
    }
    wrong_total += std::max(0.0, wrong[0]) + std::max(0.0, wrong[1]);
    size_t next = o.factor ? static_cast<size_t>(std::ceil(bytes * o.factor)) : bytes + o.step;
    if (next <= bytes) break;
    bytes = next;
  }
  if (print && !failed) {
    printf("# Out of bounds values : %.0f %s\n", wrong_total, wrong_total == 0 ? "OK" : "FAILED");
    printf("# Avg bus bandwidth    : %g \n", bw_count ? bw_sum / bw_count : 0.0);
    printf("#\n");
  }
  (void)comm.destroy();
  return failed ? 1 : (wrong_total == 0 ? 0 : 1);
}

}  // namespace loom::perf
