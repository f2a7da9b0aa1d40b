#include "perf_common.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "algorithms/algorithms.h"
#include "bootstrap/bootstrap.h"
#include "core/comm_impl.h"
#include "loom/comm.h"
#include "loom/memory.h"
#include "perf_colls.h"
#include "perf_mpi.h"
#include "perf_report.h"

namespace loom::perf {
namespace {

// Byte written over receive buffers before a verification run, so that an
// operation that writes nothing is caught: it decodes to no value the
// closed-form data can produce in any type (123 as int8, ~1e36 as float...).
constexpr int kPoison = 0x7b;

// Frees with std::free, or loom::mem_free for buffers of mem_alloc (-R).
struct FreeDeleter {
  bool shared = false;
  void operator()(std::byte* p) const {
    if (shared) (void)mem_free(p);
    else std::free(p);
  }
};
using Buffer = std::unique_ptr<std::byte, FreeDeleter>;

// --thp: whole 2 MiB pages, advised as transparent huge pages before the
// first touch (the kernel's khugepaged setting "madvise"; "always" gives
// them anyway, "never" not at all: thp_bytes() says what was obtained).
constexpr size_t kHugePage = 2 << 20;

Buffer alloc_touched(size_t bytes, bool shared, bool thp) {
  const size_t align = thp ? kHugePage : 4096;
  const size_t rounded = std::max<size_t>((bytes + align - 1) / align * align, align);
  std::byte* p = nullptr;
  if (shared) {
    Result<void*> r = mem_alloc(rounded);
    if (!r.is_ok()) {
      fprintf(stderr, "%s\n", r.status().to_string().c_str());
      return Buffer(nullptr, FreeDeleter{true});
    }
    p = static_cast<std::byte*>(*r);
  } else {
    p = static_cast<std::byte*>(std::aligned_alloc(align, rounded));
    if (p && thp) (void)madvise(p, rounded, MADV_HUGEPAGE);
  }
  if (p) std::memset(p, 1, rounded);  // fault the pages in before timing
  return Buffer(p, FreeDeleter{shared});
}

// Bytes of this process's anonymous memory in transparent huge pages.
size_t thp_bytes() {
  FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (!f) return 0;
  char line[256];
  size_t kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "AnonHugePages: %zu kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

// Combines a per-rank value across ranks with the communicator itself
// (outside any timed region).
class Control {
 public:
  explicit Control(Comm& comm) : comm_(comm) {}
  Result<double> combine(double v, Average how) {
    Waits at_once{comm_};
    Result<Work> w = Status::ok();
    switch (how) {
      case Average::kRank0: w = comm_.broadcast(&v, &v, 1, DataType::kFloat64, 0); break;
      case Average::kAvg: w = comm_.allreduce(&v, &v, 1, DataType::kFloat64, RedOp::kSum); break;
      case Average::kMin: w = comm_.allreduce(&v, &v, 1, DataType::kFloat64, RedOp::kMin); break;
      case Average::kMax: w = comm_.allreduce(&v, &v, 1, DataType::kFloat64, RedOp::kMax); break;
    }
    if (!w.is_ok()) return w.status();
    Status s = w->wait();
    if (!s.is_ok()) return s;
    return how == Average::kAvg ? v / comm_.size() : v;
  }
  Result<double> sum(double v) {
    Waits at_once{comm_};
    auto w = comm_.allreduce(&v, &v, 1, DataType::kFloat64, RedOp::kSum);
    if (!w.is_ok()) return w.status();
    Status s = w->wait();
    if (!s.is_ok()) return s;
    return v;
  }
  Status barrier() { return sum(0).status(); }

 private:
  // Every control op is waited for as soon as it is issued: this thread runs
  // it (Comm::set_caller_waits). Queued instead, each woke the communicator's
  // engine thread, which shares the rank's core, found the op taken and
  // woke again a millisecond later: a scheduler trace put those wake-ups
  // inside the timed loops (performance.md Run 47).
  struct Waits {
    explicit Waits(Comm& c) : comm(c) { comm.set_caller_waits(true); }
    ~Waits() { comm.set_caller_waits(false); }
    Comm& comm;
  };
  Comm& comm_;
};

struct Context {
  Comm& comm;
  Bench bench;
  const Options& o;
  std::byte* send;
  std::byte* recv;
  IssueState state;
};

// Issues `iters` iterations of `agg` operations each and waits for the last.
// --fresh (blocking only): the input is rewritten before every iteration and
// *op_us gets the time of the operations alone.
Status run_ops(Context& c, const Shape& s, bool in_place, int iters, double* op_us = nullptr) {
  const size_t es = dtype_size(c.o.dt);
  Buffers buf = buffers_for(c.bench, c.send, c.recv, s, es, c.comm.rank(), in_place);
  const bool fresh = c.o.fresh && c.o.blocking;
  std::chrono::steady_clock::time_point op_start;
  if (op_us) *op_us = 0;
  Work last;
  // -z: every op is waited for at once, so this thread runs it (no engine hand-off).
  c.comm.set_caller_waits(c.o.blocking);
  struct Reset {
    Comm& comm;
    ~Reset() { comm.set_caller_waits(false); }
  } reset{c.comm};
  for (int i = 0; i < iters; ++i) {
    if (fresh) {
      freshen_input(buf, s, es, i);
      op_start = std::chrono::steady_clock::now();
    }
    if (c.o.agg > 1) c.comm.group_start();
    Status err;
    for (int a = 0; a < c.o.agg && err.is_ok(); ++a) {
      auto w = issue(c.comm, c.bench, buf, s, c.o, &c.state);
      if (!w.is_ok()) err = w.status();
      else if (c.o.agg == 1) last = *w;
    }
    if (c.o.agg > 1) {
      auto g = c.comm.group_end();  // always close the group, even after an error
      if (err.is_ok() && !g.is_ok()) err = g.status();
      if (err.is_ok()) last = *g;
    }
    if (!err.is_ok()) return err;
    if (c.o.blocking) {
      Status w = last.wait();
      if (!w.is_ok()) return w;
      if (fresh && op_us) *op_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - op_start).count();
    }
  }
  return last.valid() ? last.wait() : Status::ok();
}

// nccl-tests' BenchTime: one untimed operation, a barrier, then the timed loop.
Result<double> time_ops(Context& c, const Shape& s, bool in_place, Control& ctl) {
  LOOM_RETURN_IF_ERROR(run_ops(c, s, in_place, 1));
  LOOM_RETURN_IF_ERROR(ctl.barrier());
  double op_us = 0;
  auto t0 = std::chrono::steady_clock::now();
  LOOM_RETURN_IF_ERROR(run_ops(c, s, in_place, c.o.iters, &op_us));
  auto t1 = std::chrono::steady_clock::now();
  const double us = c.o.fresh ? op_us : std::chrono::duration<double, std::micro>(t1 - t0).count();
  return us / (double(c.o.iters) * c.o.agg);
}

struct Verified {
  double wrong = 0;         // wrong elements, all ranks
  double failed_ranks = 0;  // ranks that saw any
};

// For the test of the accounting below only: LOOM_PERF_TEST_CORRUPT=R makes
// rank R flip a byte of its result's first two elements after each
// verification run, so that the row, the footer and the exit code can be
// checked on a failure.
int corrupt_rank() {
  static const int r = [] {
    const char* v = std::getenv("LOOM_PERF_TEST_CORRUPT");
    return v && *v ? std::atoi(v) : -1;
  }();
  return r;
}

// Verification runs: poison, fill closed-form inputs, run once, count.
// `wrong`: elements wrong on all ranks; `failed_ranks`: how many ranks saw
// any (nccl-tests' "Out of bounds values" counts those, per test).
Result<Verified> verify(Context& c, const Shape& s, bool in_place, Control& ctl) {
  const size_t es = dtype_size(c.o.dt);
  const int r = c.comm.rank(), n = c.comm.size();
  Buffers buf = buffers_for(c.bench, c.send, c.recv, s, es, r, in_place);
  Verified v;
  for (int k = 0; k < c.o.check; ++k) {
    std::memset(c.recv, kPoison, std::max(s.send_count, s.recv_count) * es);
    fill_inputs(c.bench, buf, s, c.o, r, n);
    auto w = issue(c.comm, c.bench, buf, s, c.o, &c.state);
    if (!w.is_ok()) return w.status();
    LOOM_RETURN_IF_ERROR(w->wait());
    if (r == corrupt_rank())  // two elements, when there are two
      for (size_t e = 0; e < std::min<size_t>(2, s.recv_count); ++e) buf.recv[e * es] ^= std::byte{0xff};
    std::string first;
    size_t wrong = count_wrong(c.bench, buf, s, c.o, r, n, &first);
    if (wrong > 0)
      fprintf(stderr, "rank %d: %s %zu B %s: %zu wrong elements; first: %s\n", r, bench_name(c.bench), s.size_bytes,
              in_place ? "in-place" : "out-of-place", wrong, first.c_str());
    auto total = ctl.sum(static_cast<double>(wrong));
    if (!total.is_ok()) return total.status();
    auto ranks = ctl.sum(wrong > 0 ? 1.0 : 0.0);
    if (!ranks.is_ok()) return ranks.status();
    v.wrong = *total;
    v.failed_ranks = *ranks;
    if (v.wrong > 0) break;
  }
  return v;
}

// --ab: this run's communicator (A) against one forcing another algorithm
// (B), out of place, in alternating blocks with a barrier before each; the
// mean time per op of each, this rank's.
struct AbTimes {
  double a_us = 0, b_us = 0;
  std::string a_algo, b_algo;  // what ran, from each communicator's flight recorder
};
// The algorithm of the communicator's newest recorded op ("" if none). The
// flight recorder keeps the first 8 characters of its name: the registry's
// one name that starts so is given whole ("hypercub" -> hypercube).
// Regression: algo_sweep.sh's confirmation compared "hypercub" with
// "hypercube" and counted no round.
std::string last_algorithm(Comm& comm) {
  const nlohmann::json st = comm.impl()->diag_state();
  const auto& ops = st.value("ops", nlohmann::json::array());
  const std::string rec = ops.empty() ? "" : ops.back().value("algo", "");
  std::string whole;
  for (const Algorithm& a : all_algorithms()) {
    const std::string name = a.name;
    if (name.compare(0, rec.size(), rec) != 0) continue;
    if (!whole.empty() && whole != name) return rec;  // not unique: as recorded
    whole = name;
  }
  return rec.empty() || whole.empty() ? rec : whole;
}

Result<AbTimes> time_ab(Context& a, Context& b, const Shape& s, Control& ctl) {
  LOOM_RETURN_IF_ERROR(run_ops(a, s, false, 1));
  LOOM_RETURN_IF_ERROR(run_ops(b, s, false, 1));
  const int blocks = a.o.ab_blocks;
  const int per_block = std::max(1, a.o.iters / blocks);
  AbTimes t;
  // A, B, then B, A, ...: each side runs first in half the blocks. In a
  // fixed order the position itself told (4 ranks, broadcast 16 KiB,
  // binomial against binomial: B/A 0.46-0.48; 2-rank allreduce 16 KiB ring
  // against ring 1.14-1.16).
  for (int k = 0; k < blocks; ++k) {
    Context* order[2] = {&a, &b};
    if (!ab_a_first(k)) std::swap(order[0], order[1]);
    for (Context* c : order) {
      LOOM_RETURN_IF_ERROR(ctl.barrier());
      auto t0 = std::chrono::steady_clock::now();
      double op_us = 0;  // --fresh: the ops alone, as time_ops (regression: the rewrite was timed)
      LOOM_RETURN_IF_ERROR(run_ops(*c, s, false, per_block, &op_us));
      const double us = c->o.fresh ? op_us
                                   : std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      (c == &a ? t.a_us : t.b_us) += us;
      // Read now: the next barrier is an allreduce on A's communicator.
      if (k == blocks - 1) (c == &a ? t.a_algo : t.b_algo) = last_algorithm(c->comm);
    }
  }
  const double ops = static_cast<double>(blocks) * per_block * a.o.agg;
  t.a_us /= ops;
  t.b_us /= ops;
  return t;
}

Measure make_measure(double us, const Shape& s, double wrong) {
  Measure m;
  m.time_us = us;
  m.algbw = us > 0 ? s.algbw_bytes / (us * 1e3) : 0;  // bytes/us/1e3 = decimal GB/s
  m.busbw = m.algbw * s.bus_factor;
  m.wrong = wrong;
  return m;
}

// The LOOM_ALGO value that forces `algo` for the bench's collective (a value
// with ':' is a full spec already).
std::string algo_spec(Collective coll, const std::string& algo) {
  return algo.find(':') != std::string::npos ? algo : std::string(collective_name(coll)) + ":" + algo;
}

// -A: LOOM_ALGO must be in the environment before the communicator exists.
std::string apply_algo_flag(Bench bench, const Options& o, std::vector<std::string>* header) {
  if (o.algo.empty()) {
    const char* env = std::getenv("LOOM_ALGO");
    return env && *env ? std::string("LOOM_ALGO=") + env : "auto";
  }
  Collective coll = Collective::kAllReduce;  // unused when -A is a full spec
  if (o.algo.find(':') == std::string::npos && !bench_collective(bench, &coll)) {
    header->push_back(std::string("-A ") + o.algo + " ignored: " + bench_name(bench) + " is a send/recv pattern");
    return "auto";
  }
  const std::string spec = algo_spec(coll, o.algo);
  setenv("LOOM_ALGO", spec.c_str(), 1);
  return "LOOM_ALGO=" + spec;
}

bool is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

// nccl-tests' "Using devices" block: one line per rank (host memory here).
std::vector<std::string> rank_lines(Comm& comm) {
  struct Ident {
    int64_t pid;
    char host[56];
  };
  Ident me{};
  me.pid = getpid();
  snprintf(me.host, sizeof me.host, "%s", host_name().c_str());
  std::vector<Ident> all(static_cast<size_t>(comm.size()));
  auto w = comm.all_gather(&me, all.data(), sizeof(Ident), DataType::kUint8);
  std::vector<std::string> out;
  if (!w.is_ok() || !w->wait().is_ok()) return out;
  out.push_back("Using devices");
  char line[160];
  for (int r = 0; r < comm.size(); ++r) {
    snprintf(line, sizeof line, " Rank %2d Group  0 Pid %6lld on %10s device  - host memory", r,
             static_cast<long long>(all[r].pid), all[r].host);
    out.push_back(line);
  }
  return out;
}

}  // namespace

int perf_main(int argc, char** argv, Collective coll) {
  Bench b = Bench::kAllReduce;
  switch (coll) {
    case Collective::kAllReduce: b = Bench::kAllReduce; break;
    case Collective::kReduceScatter: b = Bench::kReduceScatter; break;
    case Collective::kAllGather: b = Bench::kAllGather; break;
    case Collective::kBroadcast: b = Bench::kBroadcast; break;
    case Collective::kReduce: b = Bench::kReduce; break;
    case Collective::kAllToAll: b = Bench::kAllToAll; break;
    case Collective::kSendRecv: b = Bench::kSendRecv; break;
  }
  return perf_main(argc, argv, b);
}

int perf_main(int argc, char** argv, Bench bench) {
  setlinebuf(stdout);
  Options o;
  if (int rc = parse_options(argc, argv, bench, &o); rc >= 0) return rc;
  std::vector<std::string> header;
  const std::string algo = apply_algo_flag(bench, o, &header);

  // Under mpirun there is no rendezvous address in the environment: MPI
  // carries the unique id. --baseline mpi needs MPI in any case.
  const bool env_has_root = std::getenv("LOOM_ROOT_ADDR") || std::getenv("MASTER_ADDR");
  const bool use_mpi = o.baseline_mpi || (launched_by_mpi() && !env_has_root && mpi_built());
  if (o.baseline_mpi && !launched_by_mpi()) {
    fprintf(stderr, "%s: --baseline mpi needs an MPI launch (mpirun -np N %s ...)\n", argv[0], argv[0]);
    return 2;
  }
  if (use_mpi) {
    Status s = mpi_init(&argc, &argv);
    if (!s.is_ok()) {
      fprintf(stderr, "%s: %s\n", argv[0], s.to_string().c_str());
      return 2;
    }
  }
  Config cfg;
  cfg.timeout_s = o.timeout_s;
  cfg.name = bench_name(bench);
  auto comm_r = use_mpi ? comm_from_mpi_world(cfg) : Comm::init_from_env(cfg);
  if (!comm_r.is_ok()) {
    fprintf(stderr, "%s: %s\n", argv[0], comm_r.status().to_string().c_str());
    if (launched_by_mpi() && !mpi_built())
      fprintf(stderr, "%s: this build has no MPI; under mpirun set LOOM_ROOT_ADDR=host:port for the rendezvous\n",
              argv[0]);
    mpi_finalize();
    return 1;
  }
  std::unique_ptr<Comm> comm_owner = std::move(*comm_r);
  Comm& comm = *comm_owner;
  const int n = comm.size(), rank = comm.rank();
  const bool print = rank == 0;
  // --ab: a second communicator of the same ranks whose tuner is forced to
  // the other algorithm (LOOM_ALGO is read when a communicator is created).
  std::unique_ptr<Comm> comm_b;
  std::string ab_spec;
  if (!o.ab_algo.empty()) {
    Collective coll = Collective::kAllReduce;
    (void)bench_collective(bench, &coll);
    ab_spec = algo_spec(coll, o.ab_algo);
    const char* prev = std::getenv("LOOM_ALGO");
    const std::string saved = prev ? prev : "";
    setenv("LOOM_ALGO", ab_spec.c_str(), 1);
    auto b = comm.split(0, rank);
    if (prev) setenv("LOOM_ALGO", saved.c_str(), 1);
    else unsetenv("LOOM_ALGO");
    if (!b.is_ok()) {
      fprintf(stderr, "%s: --ab %s: %s\n", argv[0], o.ab_algo.c_str(), b.status().to_string().c_str());
      (void)comm.destroy();
      mpi_finalize();
      return 1;
    }
    comm_b = std::move(*b);
  }
  auto finish = [&](int rc) {
    if (comm_b) (void)comm_b->destroy();
    (void)comm.destroy();
    comm_owner.reset();
    mpi_finalize();
    return rc;
  };
  if (bench_rooted(bench) && !o.all_roots && o.root >= n) {
    if (print) fprintf(stderr, "%s: root %d out of range [0, %d)\n", argv[0], o.root, n);
    return finish(2);
  }

  RunInfo info;
  info.bench = bench;
  info.nranks = n;
  info.host = host_name();
  info.bootstrap = use_mpi ? "mpi" : "env";
  info.algorithm = algo;
  info.opts = o;
  if (o.baseline_mpi) info.mpi_library = mpi_library_version();
  std::vector<std::string> lines = rank_lines(comm);
  lines.insert(lines.begin(), header.begin(), header.end());
  lines.push_back("Algorithm: " + algo);
  Collective coll;
  if (bench_collective(bench, &coll)) {
    std::string names;
    for (const Algorithm* a : algorithms_for(coll)) names += std::string(names.empty() ? "" : ", ") + a->name;
    lines.push_back("Algorithms available for " + std::string(collective_name(coll)) + ": " + names);
  }
  if (o.baseline_mpi) lines.push_back("Baseline: " + info.mpi_library);
  if (comm_b)
    lines.push_back("A/B: A = " + algo + ", B = LOOM_ALGO=" + ab_spec + "; per size, out of place, " +
                    std::to_string(o.ab_blocks) + " alternating blocks of " +
                    std::to_string(std::max(1, o.iters / o.ab_blocks)) + " iterations each, in this process");
  if (o.oneway)
    lines.push_back(std::string("Pattern: one way (--oneway): even ranks send to rank + 1, odd ranks receive") +
                    (o.average == Average::kMax ? "; times: slowest rank" : ""));
  const std::vector<size_t> sizes = sweep_sizes(o);
  // -d all / -o all / -r all: one sweep per combination, types outermost,
  // then ops, then roots (nccl-tests' nesting).
  struct Combo {
    DataType dt;
    RedOp op;
    int root;
  };
  std::vector<Combo> combos;
  for (int t = 0; t < (o.all_types ? kNumDataTypes : 1); ++t) {
    const DataType dt = o.all_types ? static_cast<DataType>(t) : o.dt;
    const bool ops = o.all_ops && bench_reduces(bench);
    for (int p = 0; p < (ops ? kNumRedOps : 1); ++p) {
      const RedOp op = ops ? static_cast<RedOp>(p) : o.op;
      const bool roots = o.all_roots && bench_rooted(bench);
      for (int r = 0; r < (roots ? n : 1); ++r) combos.push_back({dt, op, roots ? r : o.root});
    }
  }
  size_t buf_bytes = 0;
  for (const Combo& cb : combos) {
    const size_t ces = dtype_size(cb.dt);
    for (size_t bytes : sizes) {
      Shape s = shape_for(bench, bytes, ces, n);
      buf_bytes = std::max({buf_bytes, s.send_count * ces, s.recv_count * ces});
    }
  }
  const bool shared = o.local_register > 0;
  const size_t huge_before = o.thp ? thp_bytes() : 0;
  Buffer sendb = alloc_touched(buf_bytes + 64, shared, o.thp),
         recvb = alloc_touched(buf_bytes + 64, shared, o.thp);
  if (!sendb || !recvb) {
    fprintf(stderr, "rank %d: cannot allocate 2 x %zu bytes\n", rank, buf_bytes);
    return finish(1);
  }
  if (o.thp) {
    const size_t after = thp_bytes();
    const size_t got = after - std::min(after, huge_before);
    char line[200];
    snprintf(line, sizeof line, "Buffers: transparent huge pages advised (--thp): %.1f of %.1f MiB in huge pages on rank %d",
             static_cast<double>(got) / (1 << 20),
             2.0 * static_cast<double>((buf_bytes + 64 + kHugePage - 1) / kHugePage * kHugePage) / (1 << 20), rank);
    lines.push_back(line);
  }
  Report report(info);
  if (print) report.begin(lines);

  if (bench == Bench::kHypercube && !is_pow2(n)) {
    if (print) {
      printf("nRanks %d is not a power of 2, skipping\n", n);
      bool bw_ok = true;
      report.finish(0, 0, false, &bw_ok);
    }
    return finish(0);
  }
  Context ctx{comm, bench, o, sendb.get(), recvb.get(), {}};
  Context ctx_b{comm_b ? *comm_b : comm, bench, o, sendb.get(), recvb.get(), {}};
  Control ctl(comm);
  bool failed = false;
  auto fail = [&](const Status& s) {
    fprintf(stderr, "rank %d: %s\n", rank, s.to_string().c_str());
    failed = true;
  };

  // The progress line counts every combination's sizes.
  std::vector<size_t> progress_sizes;
  for (size_t k = 0; k < combos.size(); ++k) progress_sizes.insert(progress_sizes.end(), sizes.begin(), sizes.end());
  Progress progress(print && (o.progress || isatty(STDERR_FILENO)), bench_name(bench), progress_sizes);
  double wrong_total = 0, failed_tests = 0;
  for (size_t ci = 0; ci < combos.size() && !failed; ++ci) {
    // ctx and ctx_b read the options through a reference: this combination.
    o.dt = combos[ci].dt;
    o.op = combos[ci].op;
    o.root = combos[ci].root;
    const size_t es = dtype_size(o.dt);
    // nccl-tests warms up at the largest size, then at the smallest.
    if (!sizes.empty() && o.warmup > 0) {
      size_t largest = *std::max_element(sizes.begin(), sizes.end());
      size_t smallest = *std::min_element(sizes.begin(), sizes.end());
      for (size_t bytes : {largest, smallest}) {
        Status s = run_ops(ctx, shape_for(bench, bytes, es, n), false, std::max(1, o.warmup / o.agg));
        if (!s.is_ok()) {
          fail(s);
          break;
        }
      }
    }

    for (size_t i = 0; i < sizes.size() && !failed; ++i) {
      if (print) progress.start(ci * sizes.size() + i);
      const Shape s = shape_for(bench, sizes[i], es, n);
      Row row;
      row.size_bytes = s.size_bytes;
      row.count = s.count;
      row.dt = o.dt;
      row.op = o.op;
      row.root = o.root;
      for (int ip = 0; ip < 2 && !failed; ++ip) {
        auto us = time_ops(ctx, s, ip == 1, ctl);
        if (!us.is_ok()) { fail(us.status()); break; }
        auto t = ctl.combine(*us, o.average);
        if (!t.is_ok()) { fail(t.status()); break; }
        double wrong = -1;
        if (o.check > 0) {
          auto w = verify(ctx, s, ip == 1, ctl);
          if (!w.is_ok()) { fail(w.status()); break; }
          wrong = w->wrong;
          wrong_total += wrong;
          failed_tests += w->failed_ranks;
        }
        (ip == 0 ? row.out_of_place : row.in_place) = make_measure(*t, s, wrong);
      }
      if (failed) break;
      if (o.baseline_mpi) {
        Buffers buf = buffers_for(bench, ctx.send, ctx.recv, s, es, rank, false);
        fill_inputs(bench, buf, s, o, rank, n);
        mpi_barrier();
        auto us = mpi_time(bench, buf, s, o, o.iters, std::max(1, o.warmup));
        // Every rank takes the same branch: the type/op check is rank-independent.
        if (us.is_ok()) {
          auto t = ctl.combine(*us, o.average);
          if (!t.is_ok()) { fail(t.status()); break; }
          row.has_mpi = true;
          row.mpi = make_measure(*t, s, -1);
        } else if (print && i == 0 && (ci == 0 || combos[ci].dt != combos[ci - 1].dt)) {
          fprintf(stderr, "--baseline mpi: %s\n", us.status().to_string().c_str());
        }
      }
      std::string ab_line;
      if (comm_b) {
        auto t = time_ab(ctx, ctx_b, s, ctl);
        if (!t.is_ok()) { fail(t.status()); break; }
        auto ta = ctl.combine(t->a_us, o.average);
        auto tb = ta.is_ok() ? ctl.combine(t->b_us, o.average) : ta;
        if (!tb.is_ok()) { fail(tb.status()); break; }
        const std::string& ran_a = t->a_algo;
        const std::string& ran_b = t->b_algo;
        char buf[256];
        snprintf(buf, sizeof buf, "#  A/B %12zu  A %s %.3f us  B %s %.3f us  B/A %.3f", s.size_bytes,
                 ran_a.empty() ? "?" : ran_a.c_str(), *ta, ran_b.empty() ? "?" : ran_b.c_str(), *tb,
                 *ta > 0 ? *tb / *ta : 0.0);
        ab_line = buf;
      }
      if (print) {
        progress.done();
        report.add(row);
        // A comment line (nccl-tests style) after the row: on stdout with the
        // table, on stderr when stdout carries JSON or CSV.
        if (!ab_line.empty()) fprintf(o.json_stdout || o.csv_stdout ? stderr : stdout, "%s\n", ab_line.c_str());
      }
    }
  }
  if (print) progress.done();
  // Leave together, before rank 0 spends time on files and plots: a peer
  // that exits while another still holds the communicator looks like a death.
  if (!failed) (void)ctl.barrier();
  if (comm_b) (void)comm_b->destroy();
  (void)comm.destroy();
  bool files_ok = true;
  bool bw_ok = true;
  if (print) files_ok = report.finish(wrong_total, failed_tests, failed, &bw_ok);
  // The printing rank judges the bandwidth (NCCL_TESTS_MIN_BW); the other
  // ranks keep no report, their code follows the data check alone (the
  // launcher fails the job when any rank does).
  int rc = failed ? 1 : (wrong_total == 0 && files_ok && bw_ok ? 0 : 1);
  return finish(rc);
}

}  // namespace loom::perf
