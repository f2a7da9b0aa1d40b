#include "perf_options.h"

#include <getopt.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/config.h"

namespace loom::perf {

const char* bench_name(Bench b) {
  switch (b) {
    case Bench::kAllReduce: return "allreduce";
    case Bench::kReduceScatter: return "reduce_scatter";
    case Bench::kAllGather: return "all_gather";
    case Bench::kBroadcast: return "broadcast";
    case Bench::kReduce: return "reduce";
    case Bench::kAllToAll: return "alltoall";
    case Bench::kSendRecv: return "sendrecv";
    case Bench::kHypercube: return "hypercube";
  }
  return "?";
}

const char* bench_binary(Bench b) {
  switch (b) {
    case Bench::kAllReduce: return "all_reduce_perf";
    case Bench::kReduceScatter: return "reduce_scatter_perf";
    case Bench::kAllGather: return "all_gather_perf";
    case Bench::kBroadcast: return "broadcast_perf";
    case Bench::kReduce: return "reduce_perf";
    case Bench::kAllToAll: return "alltoall_perf";
    case Bench::kSendRecv: return "sendrecv_perf";
    case Bench::kHypercube: return "hypercube_perf";
  }
  return "?";
}

bool bench_reduces(Bench b) {
  return b == Bench::kAllReduce || b == Bench::kReduceScatter || b == Bench::kReduce;
}
bool bench_rooted(Bench b) { return b == Bench::kBroadcast || b == Bench::kReduce; }

bool bench_collective(Bench b, Collective* out) {
  switch (b) {
    case Bench::kAllReduce: *out = Collective::kAllReduce; return true;
    case Bench::kReduceScatter: *out = Collective::kReduceScatter; return true;
    case Bench::kAllGather: *out = Collective::kAllGather; return true;
    case Bench::kBroadcast: *out = Collective::kBroadcast; return true;
    case Bench::kReduce: *out = Collective::kReduce; return true;
    case Bench::kAllToAll: *out = Collective::kAllToAll; return true;
    case Bench::kSendRecv:
    case Bench::kHypercube: return false;
  }
  return false;
}

void print_usage(FILE* out, const char* prog) {
  fprintf(out,
          "usage: %s [options]\n"
          "nccl-tests options:\n"
          "  -b, --minbytes SIZE     smallest size (default 32M; K/M/G suffixes)\n"
          "  -e, --maxbytes SIZE     largest size (default 32M)\n"
          "  -f, --stepfactor F      multiply the size by F between steps (<= 1: add -i bytes)\n"
          "  -i, --stepbytes SIZE    add SIZE between steps when -f is not given (default 1M)\n"
          "  -n, --iters N           timed iterations per size (default 20)\n"
          "  -w, --warmup_iters N    untimed iterations at the largest and smallest size (default 5)\n"
          "  -m, --agg_iters N       operations aggregated in one group per iteration (default 1)\n"
          "  -c, --check N           verification runs per size, closed-form data; 0 = off (default 1)\n"
          "  -d, --datatype T        int8 uint8 int32 uint32 int64 uint64 half float double bfloat16\n"
          "                          f8e4m3 f8e5m2, or all (default float)\n"
          "  -o, --op OP             sum prod max min avg, or all (default sum)\n"
          "  -r, --root R            root of broadcast / reduce, or all (default 0)\n"
          "  -z, --blocking 0/1      wait for each operation before issuing the next (default 0)\n"
          "  -a, --average 0/1/2/3   time reported across ranks: 0=rank 0, 1=average, 2=min, 3=max (default 1)\n"
          "  -T, --timeout SECONDS   deadline of every wait; a hung operation fails (default LOOM_TIMEOUT)\n"
          "  -J, --output_file FILE  also write the results as JSON to FILE\n"
          "  -R, --local_register 0/1/2  1 or 2: send and receive buffers from loom::mem_alloc (as\n"
          "                          ncclMemAlloc): peers on this host map them and read them with plain\n"
          "                          loads instead of process_vm_readv (default 0: aligned_alloc)\n"
          "Loom options:\n"
          "  -A, --algo ALGO         force the algorithm (sets LOOM_ALGO=<collective>:ALGO before the\n"
          "                          communicator is created; a full LOOM_ALGO spec is passed as is)\n"
          "      --sizes LIST        explicit comma-separated sizes (8,4K,1M), instead of -b/-e/-f/-i\n"
          "      --json[=FILE]       JSON results to FILE, or instead of the table on stdout\n"
          "      --csv[=FILE]        CSV results to FILE, or instead of the table on stdout\n"
          "      --baseline mpi      also time MPI's collective on the same buffers (needs an MPI build,\n"
          "                          launched by mpirun) and print Loom/MPI busbw ratios per size\n"
          "      --plot FILE.png     plot busbw against size with gnuplot\n"
          "      --progress          progress lines on stderr even when it is not a terminal\n"
          "      --oneway            sendrecv_perf: even ranks send to rank+1, odd ranks receive from\n"
          "                          rank-1 (one direction per pair, like a unidirectional iperf3);\n"
          "                          times are the slowest rank's unless -a is given\n"
          "      --fresh             rewrite the send buffer before every operation, untimed, as a\n"
          "                          training step does between calls (nccl-tests reuses one unchanged\n"
          "                          input, which flatters single-copy transports); needs -z 1\n"
          "      --thp               buffers in 2 MiB pages advised as transparent huge pages (the\n"
          "                          header says how much the kernel gave); not with -R\n"
          "      --ab ALGO           per size, also time this run's algorithm against ALGO (on a second\n"
          "                          communicator) in alternating blocks inside this process (each side\n"
          "                          first in half of them), out of place, and print both times, the\n"
          "                          algorithms that ran and B/A\n"
          "      --ab-blocks N       blocks per algorithm for --ab (default 10; -n iterations in all)\n"
          "  -h, --help\n"
          "Ranks come from the environment: run under loomrun, mpirun (MPI bootstrap), srun or torchrun.\n",
          prog);
}

namespace {

bool parse_size(const char* s, size_t* out) {
  uint64_t v;
  if (!parse_bytes(s, &v)) return false;
  *out = v;
  return true;
}

bool parse_int(const char* s, int lo, int hi, int* out) {
  char* end = nullptr;
  long v = strtol(s, &end, 0);
  if (end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

enum LongOnly { kSizes = 1000, kJson, kCsv, kBaseline, kPlot, kProgress, kOneway, kFresh, kThp, kAb, kAbBlocks };

}  // namespace

int parse_options(int argc, char** argv, Bench bench, Options* o) {
  static const option longopts[] = {{"minbytes", required_argument, nullptr, 'b'},
                                    {"maxbytes", required_argument, nullptr, 'e'},
                                    {"stepfactor", required_argument, nullptr, 'f'},
                                    {"stepbytes", required_argument, nullptr, 'i'},
                                    {"iters", required_argument, nullptr, 'n'},
                                    {"warmup_iters", required_argument, nullptr, 'w'},
                                    {"agg_iters", required_argument, nullptr, 'm'},
                                    {"check", required_argument, nullptr, 'c'},
                                    {"datatype", required_argument, nullptr, 'd'},
                                    {"op", required_argument, nullptr, 'o'},
                                    {"root", required_argument, nullptr, 'r'},
                                    {"blocking", required_argument, nullptr, 'z'},
                                    {"average", required_argument, nullptr, 'a'},
                                    {"timeout", required_argument, nullptr, 'T'},
                                    {"output_file", required_argument, nullptr, 'J'},
                                    {"algo", required_argument, nullptr, 'A'},
                                    {"nthreads", required_argument, nullptr, 't'},
                                    {"ngpus", required_argument, nullptr, 'g'},
                                    {"parallel_init", required_argument, nullptr, 'p'},
                                    {"cudagraph", required_argument, nullptr, 'G'},
                                    {"report_cputime", required_argument, nullptr, 'C'},
                                    {"local_register", required_argument, nullptr, 'R'},
                                    {"stream_null", required_argument, nullptr, 'y'},
                                    {"run_cycles", required_argument, nullptr, 'N'},
                                    {"sizes", required_argument, nullptr, kSizes},
                                    {"json", optional_argument, nullptr, kJson},
                                    {"csv", optional_argument, nullptr, kCsv},
                                    {"baseline", required_argument, nullptr, kBaseline},
                                    {"plot", required_argument, nullptr, kPlot},
                                    {"progress", no_argument, nullptr, kProgress},
                                    {"oneway", no_argument, nullptr, kOneway},
                                    {"fresh", no_argument, nullptr, kFresh},
                                    {"thp", no_argument, nullptr, kThp},
                                    {"ab", required_argument, nullptr, kAb},
                                    {"ab-blocks", required_argument, nullptr, kAbBlocks},
                                    {"help", no_argument, nullptr, 'h'},
                                    {nullptr, 0, nullptr, 0}};
  const char* prog = argv[0];
  auto bad = [&](const char* flag, const char* value) {
    fprintf(stderr, "%s: invalid value '%s' for %s (see --help)\n", prog, value, flag);
    return 2;
  };
  optind = 1;
  int ch;
  bool average_given = false;
  while ((ch = getopt_long(argc, argv, "b:e:f:i:n:w:m:c:d:o:r:z:a:T:J:A:t:g:p:G:C:R:y:N:h", longopts, nullptr)) != -1) {
    switch (ch) {
      case 'b': if (!parse_size(optarg, &o->min_bytes)) return bad("-b", optarg); break;
      case 'e': if (!parse_size(optarg, &o->max_bytes)) return bad("-e", optarg); break;
      case 'f': {
        char* end = nullptr;
        o->factor = strtod(optarg, &end);
        if (end == optarg || *end != '\0' || !std::isfinite(o->factor)) return bad("-f", optarg);
        // As nccl-tests: a factor of 1 or less steps by -i bytes instead.
        // Regression: -f 1 was refused.
        if (o->factor <= 1.0) o->factor = 0;
        break;
      }
      case 'i': if (!parse_size(optarg, &o->step) || o->step == 0) return bad("-i", optarg); break;
      case 'n': if (!parse_int(optarg, 1, 1 << 30, &o->iters)) return bad("-n", optarg); break;
      case 'w': if (!parse_int(optarg, 0, 1 << 30, &o->warmup)) return bad("-w", optarg); break;
      case 'm': if (!parse_int(optarg, 1, 1 << 20, &o->agg)) return bad("-m", optarg); break;
      case 'c': if (!parse_int(optarg, 0, 1 << 20, &o->check)) return bad("-c", optarg); break;
      case 'd': {
        o->all_types = std::strcmp(optarg, "all") == 0;
        if (o->all_types) break;
        auto dt = parse_dtype(optarg);
        if (!dt) return bad("-d", optarg);
        o->dt = *dt;
        break;
      }
      case 'o': {
        o->all_ops = std::strcmp(optarg, "all") == 0;
        if (o->all_ops) break;
        auto op = parse_redop(optarg);
        if (!op) return bad("-o", optarg);
        o->op = *op;
        break;
      }
      case 'r':
        o->all_roots = std::strcmp(optarg, "all") == 0;
        if (!o->all_roots && !parse_int(optarg, 0, 1 << 30, &o->root)) return bad("-r", optarg);
        break;
      case 'z': { int z; if (!parse_int(optarg, 0, 1, &z)) return bad("-z", optarg); o->blocking = z != 0; break; }
      case 'a': {
        int a;
        if (!parse_int(optarg, 0, 3, &a)) return bad("-a (0..3)", optarg);
        o->average = static_cast<Average>(a);
        average_given = true;
        break;
      }
      case 'T': {
        char* end = nullptr;
        o->timeout_s = strtod(optarg, &end);
        if (end == optarg || *end != '\0' || o->timeout_s < 0) return bad("-T", optarg);
        break;
      }
      case 'J': o->json_file = optarg; break;
      case 'A': o->algo = optarg; break;
      case 'R':
        if (!parse_int(optarg, 0, 2, &o->local_register)) return bad("-R (0..2)", optarg);
        break;
      case 't': case 'g': case 'p': case 'G': case 'C': case 'y': case 'N':
        o->notes.push_back(std::string("-") + static_cast<char>(ch) + " " + optarg +
                           " ignored (GPU / thread option of nccl-tests; one Loom rank per process)");
        break;
      case kSizes: if (!parse_bytes_list(optarg, &o->sizes)) return bad("--sizes", optarg); break;
      case kJson: if (optarg) o->json_file = optarg; else o->json_stdout = true; break;
      case kCsv: if (optarg) o->csv_file = optarg; else o->csv_stdout = true; break;
      case kBaseline:
        if (std::strcmp(optarg, "mpi") != 0) return bad("--baseline (only 'mpi')", optarg);
        o->baseline_mpi = true;
        break;
      case kPlot: o->plot_file = optarg; break;
      case kProgress: o->progress = true; break;
      case kOneway:
        if (bench != Bench::kSendRecv) {
          fprintf(stderr, "%s: --oneway is a sendrecv_perf option\n", prog);
          return 2;
        }
        o->oneway = true;
        break;
      case kFresh: o->fresh = true; break;
      case kThp: o->thp = true; break;
      case kAb: {
        Collective coll;
        if (!bench_collective(bench, &coll)) {
          fprintf(stderr, "%s: --ab compares algorithms of a collective; %s is a send/recv pattern\n", prog,
                  bench_name(bench));
          return 2;
        }
        if (!*optarg) return bad("--ab", optarg);
        o->ab_algo = optarg;
        break;
      }
      case kAbBlocks:
        if (!parse_int(optarg, 1, 1000000, &o->ab_blocks)) return bad("--ab-blocks (>= 1)", optarg);
        break;
      case 'h': print_usage(stdout, prog); return 0;
      default: print_usage(stderr, prog); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", prog, argv[optind]);
    return 2;
  }
  // One way, a sender may finish before its receiver has the data and an
  // idle rank takes no time: the slowest rank's time is the transfer's.
  if (o->oneway && !average_given) o->average = Average::kMax;
  if (o->sizes.empty() && o->max_bytes < o->min_bytes) {
    fprintf(stderr, "%s: invalid sizes: -b %zu > -e %zu\n", prog, o->min_bytes, o->max_bytes);
    return 2;
  }
  if (o->thp && o->local_register) {
    fprintf(stderr, "%s: --thp is for ordinary buffers; -R's come from loom::mem_alloc (shared memory)\n", prog);
    return 2;
  }
  if (o->fresh && !o->blocking) {
    // Rewriting an input while earlier operations may still read it would
    // race; with -z 1 each operation is over before the next rewrite.
    fprintf(stderr, "%s: --fresh needs -z 1 (each operation waited for before the input is rewritten)\n", prog);
    return 2;
  }
  if (o->json_stdout && o->csv_stdout) {
    fprintf(stderr, "%s: --json and --csv cannot both replace the table on stdout; give one a file\n", prog);
    return 2;
  }
  if (o->baseline_mpi && o->agg > 1) {
    // The MPI side times one blocking call per iteration: against -m grouped
    // Loom ops the ratio would compare different things (regression: it
    // did, 0.18 at -m 1 vs 0.83 at -m 32 for the same 8 B op).
    fprintf(stderr, "%s: --baseline mpi times one MPI call per iteration; use it with -m 1\n", prog);
    return 2;
  }
  if (bench == Bench::kHypercube && o->agg > 1) {
    // Each exchange of the pattern consumes the previous one's output, so
    // merging iterations into one group would race; nccl-tests has the same
    // hazard. Run them one after the other instead.
    o->notes.push_back("-m " + std::to_string(o->agg) + " ignored: hypercube steps depend on each other");
    o->agg = 1;
  }
  return -1;
}

std::vector<size_t> sweep_sizes(const Options& o) {
  if (!o.sizes.empty()) return o.sizes;
  std::vector<size_t> out;
  for (size_t bytes = o.min_bytes; bytes <= o.max_bytes;) {
    out.push_back(bytes);
    size_t next = o.factor > 0 ? static_cast<size_t>(std::ceil(static_cast<double>(bytes) * o.factor)) : bytes + o.step;
    if (next <= bytes) next = bytes + 1;  // -b 0 with -f: move on rather than loop forever
    bytes = next;
  }
  return out;
}

bool ab_a_first(int k) { return k % 2 == 0; }

}  // namespace loom::perf
