// loom-sim: replays the schedules a job would run, at any scale, on a model
// of the machine, and compares them with the tuner's closed-form model.
//
// For each algorithm and size it builds every rank's schedule with
// make_schedule, with the CollArgs the communicator would pass (the same
// placement as loom-topo: tools/placement.h) and the tuner's pipelining
// chunk for that algorithm (as LOOM_ALGO=<it> would run it), then runs a
// discrete-event simulation of them (tools/sim/simulator.h says what is
// modelled) with the cost model's own alpha, beta and gamma. It prints the
// simulated time next to the tuner's prediction, the busbw nccl-tests
// would report, the slowest rank and what held it back, and per size the
// tuner's pick against the simulator's fastest. --check checks the
// schedules' matching and deadlock freedom instead, at the same scale.

#include <sys/resource.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/algorithms.h"
#include "core/config.h"
#include "core/schedule_args.h"
#include "loom/types.h"
#include "perf_colls.h"
#include "placement.h"
#include "sim/schedule_store.h"
#include "sim/simulator.h"
#include "topology/algo_override.h"
#include "topology/cost_model.h"
#include "topology/paths.h"
#include "topology/tuner.h"

using namespace loom;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kMaxRanks = 65536;

struct Args {
  std::string topo_file;
  int nranks = 0;
  int ranks_per_host = 0;
  Collective coll = Collective::kAllReduce;
  std::vector<size_t> sizes = {8, 256, 4096, 32768, 262144, 1u << 21, 1u << 24, 1u << 27};
  std::vector<std::string> algos;  // empty: every one that supports the call
  DataType dt = DataType::kFloat32;
  int root = 0;
  bool json = false, csv = false, check = false, quiet = false;
  uint64_t eager_bytes = 0;
  bool eager_set = false;
  double gap_us = -1;  // < 0: the cost model's overlap_us
  int iters = 1;       // ops back to back; times are per op
};

void usage(FILE* out) {
  std::fprintf(out,
               "usage: loom-sim [--topo-file F] [--nranks N] [--ranks-per-host R] [--coll C] [--sizes LIST]\n"
               "                [--algo A[,B...]] [--dtype T] [--root R] [--eager-bytes B] [--gap-us G]\n"
               "                [--iters N] [--check] [--json | --csv] [--quiet] [--help]\n"
               "  --topo-file F       NCCL-format topology XML (default: LOOM_TOPO_FILE, NCCL_TOPO_FILE or this host)\n"
               "  --nranks N          ranks to place (default: one per GPU, else one per core, at least 2)\n"
               "  --ranks-per-host R  ranks per host (default: number of GPUs; more ranks => more hosts), as loom-topo\n"
               "  --coll C            allreduce | reduce_scatter | all_gather | broadcast | reduce | all_to_all\n"
               "                      (default allreduce)\n"
               "  --sizes LIST        sizes as the perf tables count them (8,4K,1M; default 8 B - 128 MiB)\n"
               "  --algo A[,B...]     algorithms (default: every one that supports the call)\n"
               "  --dtype T           data type (default float32)\n"
               "  --root R            root of broadcast / reduce (default 0)\n"
               "  --eager-bytes B     messages up to B leave without waiting for their receive\n"
               "                      (default LOOM_SHM_FIFO_BYTES, 2M); larger ones wait for it\n"
               "  --gap-us G          a phase's k-th message pays (k-1) x G us on top of its alpha (default: the\n"
               "                      cost model's per-message overlap, CommCost::overlap_us; 0: none)\n"
               "  --iters N           N ops back to back, times per op (default 1: one op's latency). The model\n"
               "                      prices broadcast and reduce per op of such a stream: compare with N large\n"
               "                      enough to amortise a chain's fill (200 for 512 ranks)\n"
               "  --check             instead of timing: check every schedule's matching (each send has its\n"
               "                      receive, same count, in order) and that no rank deadlocks\n"
               "  --json, --csv       machine-readable output\n"
               "  --quiet             no progress lines on stderr\n"
               "Environment: LOOM_ALGO, LOOM_TUNER_PLUGIN, LOOM_TUNE_* as in a job (they steer the tuner's pick\n"
               "and its constants); LOOM_CHUNK_BYTES as in a job (pins the pipelining chunk).\n");
}

bool parse_int(const char* s, int lo, int hi, int& out) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) return false;
  out = static_cast<int>(v);
  return true;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find(',', b);
    if (e == std::string::npos) e = s.size();
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

perf::Bench bench_of(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return perf::Bench::kAllReduce;
    case Collective::kReduceScatter: return perf::Bench::kReduceScatter;
    case Collective::kAllGather: return perf::Bench::kAllGather;
    case Collective::kBroadcast: return perf::Bench::kBroadcast;
    case Collective::kReduce: return perf::Bench::kReduce;
    case Collective::kAllToAll: return perf::Bench::kAllToAll;
    case Collective::kSendRecv: break;
  }
  return perf::Bench::kSendRecv;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

long peak_rss_kb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// A line on stderr now and then for long runs ('\r' on a terminal).
class Progress {
 public:
  explicit Progress(bool on) : on_(on), tty_(isatty(2) != 0) {}
  void begin(std::string what) {
    what_ = std::move(what);
    t0_ = last_ = Clock::now();
    shown_ = false;
  }
  void update(const std::string& text) {
    if (!on_) return;
    const auto now = Clock::now();
    if (now - t0_ < std::chrono::seconds(1) || now - last_ < std::chrono::seconds(tty_ ? 1 : 10)) return;
    last_ = now;
    shown_ = true;
    std::fprintf(stderr, "%s[%s] %s (%.0f s)%s", tty_ ? "\r\033[K" : "", what_.c_str(), text.c_str(), seconds_since(t0_),
                 tty_ ? "" : "\n");
    std::fflush(stderr);
  }
  void end() {
    if (on_ && shown_ && tty_) std::fprintf(stderr, "\r\033[K");
    shown_ = false;
  }

 private:
  bool on_, tty_;
  bool shown_ = false;
  std::string what_;
  Clock::time_point t0_, last_;
};

struct Row {
  size_t bytes = 0;
  std::string algo;
  std::string error;       // the schedule could not be built, simulated or checked
  double sim_us = -1;
  double model_us = -1;    // < 0: the model has no estimate
  size_t chunk_bytes = 0;
  double busbw = 0;
  int slowest = -1;
  std::string critical;
  double critical_share = 0;  // of the slowest rank's finish
  std::array<double, sim::kNumLimits> path_us{};  // its critical path by kind
  uint64_t phases = 0, messages = 0, events = 0;
  size_t store_bytes = 0;
  double build_s = 0, sim_s = 0;
};

struct SizeSummary {
  size_t bytes = 0;
  std::string tuner_pick, tuner_source, sim_best;
  double pick_sim_us = -1, best_sim_us = -1;
  double slower = 0;  // tuner's pick over the best, minus 1
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto next = [&](const char* what) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "loom-sim: %s needs a value\n", what);
        std::exit(2);
      }
      return argv[++i];
    };
    if (s == "--help" || s == "-h") {
      usage(stdout);
      return 0;
    } else if (s == "--topo-file") {
      a.topo_file = next("--topo-file");
    } else if (s == "--nranks") {
      if (!parse_int(next("--nranks"), 1, kMaxRanks, a.nranks)) {
        std::fprintf(stderr, "loom-sim: --nranks must be 1..%d\n", kMaxRanks);
        return 2;
      }
    } else if (s == "--ranks-per-host") {
      if (!parse_int(next("--ranks-per-host"), 1, kMaxRanks, a.ranks_per_host)) {
        std::fprintf(stderr, "loom-sim: --ranks-per-host must be 1..%d\n", kMaxRanks);
        return 2;
      }
    } else if (s == "--coll") {
      const char* v = next("--coll");
      auto c = parse_collective(v);
      if (!c || *c == Collective::kSendRecv) {
        std::fprintf(stderr, "loom-sim: unknown collective '%s'\n", v);
        return 2;
      }
      a.coll = *c;
    } else if (s == "--sizes") {
      const char* v = next("--sizes");
      if (!parse_bytes_list(v, &a.sizes)) {
        std::fprintf(stderr, "loom-sim: bad size in --sizes '%s'\n", v);
        return 2;
      }
    } else if (s == "--algo") {
      a.algos = split(next("--algo"));
    } else if (s == "--dtype") {
      const char* v = next("--dtype");
      auto d = parse_dtype(v);
      if (!d) {
        std::fprintf(stderr, "loom-sim: unknown data type '%s'\n", v);
        return 2;
      }
      a.dt = *d;
    } else if (s == "--root") {
      if (!parse_int(next("--root"), 0, kMaxRanks - 1, a.root)) {
        std::fprintf(stderr, "loom-sim: bad --root\n");
        return 2;
      }
    } else if (s == "--eager-bytes") {
      const char* v = next("--eager-bytes");
      if (!parse_bytes(v, &a.eager_bytes)) {
        std::fprintf(stderr, "loom-sim: bad --eager-bytes '%s'\n", v);
        return 2;
      }
      a.eager_set = true;
    } else if (s == "--gap-us") {
      const char* v = next("--gap-us");
      char* end = nullptr;
      a.gap_us = std::strtod(v, &end);
      if (end == v || *end != '\0' || !(a.gap_us >= 0)) {
        std::fprintf(stderr, "loom-sim: bad --gap-us '%s'\n", v);
        return 2;
      }
    } else if (s == "--iters") {
      if (!parse_int(next("--iters"), 1, 1000000, a.iters)) {
        std::fprintf(stderr, "loom-sim: --iters must be 1..1000000\n");
        return 2;
      }
    } else if (s == "--json") {
      a.json = true;
    } else if (s == "--csv") {
      a.csv = true;
    } else if (s == "--check") {
      a.check = true;
    } else if (s == "--quiet") {
      a.quiet = true;
    } else {
      std::fprintf(stderr, "loom-sim: unknown argument '%s'\n", s.c_str());
      usage(stderr);
      return 2;
    }
  }
  if (a.json && a.csv) {
    std::fprintf(stderr, "loom-sim: --json or --csv, not both\n");
    return 2;
  }
  if (!a.eager_set) a.eager_bytes = params::shm_fifo_bytes();

  Result<topo::ImportResult> loaded = tools::load_topology(a.topo_file);
  if (!loaded.is_ok()) {
    std::fprintf(stderr, "loom-sim: %s\n", loaded.status().to_string().c_str());
    return 1;
  }
  const topo::TopoGraph& g = loaded->graph;
  if (a.nranks == 0) a.nranks = tools::default_nranks(g);
  if (a.root >= a.nranks) {
    std::fprintf(stderr, "loom-sim: --root %d is not a rank of %d\n", a.root, a.nranks);
    return 2;
  }
  topo::TunerOptions topts;
  topts.ranks_per_host = a.ranks_per_host;
  auto tuner_r = topo::Tuner::from_env(g, a.nranks, topts);
  if (!tuner_r.is_ok()) {
    std::fprintf(stderr, "loom-sim: %s\n", tuner_r.status().to_string().c_str());
    return 1;
  }
  topo::Tuner& tuner = **tuner_r;
  const topo::RankTopology rt = topo::map_ranks(tuner.graph(), a.nranks, a.ranks_per_host);
  const int n = rt.nranks;
  const std::vector<int> hosts = tools::host_of_rank(rt);
  const topo::PairCosts pairs = tuner.pair_costs(rt);
  const topo::CommCost cost = tuner.cost(n);
  const size_t es = dtype_size(a.dt);
  const perf::Bench bench = bench_of(a.coll);
  Progress progress(!a.quiet);
  const auto t_start = Clock::now();

  std::vector<Row> rows;
  std::vector<SizeSummary> summaries;
  for (size_t size : a.sizes) {
    const perf::Shape shape = perf::shape_for(bench, size, es, n);
    const size_t model_bytes = shape.size_bytes;  // what a communicator hands the tuner (comm_impl.cc)
    const std::vector<std::string> names = tools::runnable(a.coll, shape.count, a.dt, hosts);
    std::vector<std::string> algos;
    if (a.algos.empty()) {
      algos = names;
    } else {
      for (const std::string& want : a.algos) {
        const Algorithm* al = find_algorithm(a.coll, want);
        algos.push_back(al ? al->name : want);
      }
    }
    SizeSummary sum;
    sum.bytes = model_bytes;
    if (!names.empty()) {
      auto sel = tuner.select(a.coll, model_bytes, n, names);
      if (sel.is_ok()) {
        sum.tuner_pick = sel->algorithm;
        sum.tuner_source = sel->source;
      }
    }
    // The reduction rate the model uses for this size (CommCost: cached rate
    // for calls that fit a core's cache).
    const double gamma = cost.cache_bytes > 0 && cost.gamma_cached_us_per_byte > 0 && model_bytes <= cost.cache_bytes
                             ? cost.gamma_cached_us_per_byte
                             : cost.gamma_us_per_byte;
    const sim::Fabric fabric =
        a.check ? sim::Fabric{} : sim::fabric_for(tuner.graph(), rt, pairs, gamma, a.gap_us >= 0 ? a.gap_us : cost.overlap_us);
    for (const std::string& algo : algos) {
      Row row;
      row.bytes = model_bytes;
      row.algo = algo;
      const std::string label = fmt::format("{} {} {}", collective_name(a.coll), algo, topo::format_size(model_bytes));
      size_t chunk_elems = 0;
      if (auto kind = topo::parse_algo(algo, a.coll)) {
        if (auto est = topo::estimate(*kind, a.coll, model_bytes, n, cost)) {
          row.model_us = est->us;
          row.chunk_bytes = est->chunk_bytes;
          chunk_elems = tuned_chunk_elems(est->chunk_bytes, a.dt);
        }
      }
      auto args_of = [&](int r) {
        CollArgs args = tools::placed_args(a.coll, shape.count, a.dt, hosts, r, a.root);
        args.chunk_elems = chunk_elems;
        return args;
      };
      // Build every rank's schedule into the store.
      const auto t0 = Clock::now();
      progress.begin(label);
      sim::ScheduleStore store(n);
      // make_schedule is O(p) per rank for the ring and the trees, a fifth of
      // a 16k-rank ring's time on one core: batches of ranks are built on
      // every core, then stored in rank order (the store interns on one).
      const int nthreads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 32);
      std::vector<std::optional<Result<RankSchedule>>> batch(static_cast<size_t>(2 * nthreads));
      for (int r0 = 0; r0 < n && row.error.empty(); r0 += static_cast<int>(batch.size())) {
        const int nb = std::min(static_cast<int>(batch.size()), n - r0);
        auto build = [&](int t) {
          for (int i = t; i < nb; i += nthreads) batch[static_cast<size_t>(i)] = make_schedule(args_of(r0 + i), algo);
        };
        std::vector<std::thread> pool;
        for (int t = 1; t < std::min(nthreads, nb); ++t) pool.emplace_back(build, t);
        build(0);
        for (std::thread& th : pool) th.join();
        for (int i = 0; i < nb; ++i) {
          Result<RankSchedule>& s = *batch[static_cast<size_t>(i)];
          if (!s.is_ok()) {
            row.error = fmt::format("rank {}: {}", r0 + i, s.status().to_string());
            break;
          }
          store.add_rank(*s, a.iters);
          batch[static_cast<size_t>(i)].reset();
        }
        progress.update(fmt::format("building schedules: rank {} of {}", r0 + nb, n));
      }
      row.build_s = seconds_since(t0);
      row.phases = store.phases();
      row.messages = store.transfers() / 2;
      row.store_bytes = store.memory_bytes();
      if (row.error.empty()) {
        sim::SimOptions opt;
        opt.elem_bytes = es;
        opt.eager_bytes = a.eager_bytes;
        opt.schedule_of = [&](int r) -> Result<RankSchedule> {  // the ops back to back, as stored
          LOOM_ASSIGN_OR_RETURN(RankSchedule one, make_schedule(args_of(r), algo));
          RankSchedule all = one;
          for (int it = 1; it < a.iters; ++it) all.phases.insert(all.phases.end(), one.phases.begin(), one.phases.end());
          return all;
        };
        opt.progress = [&](double now_us, uint64_t done, uint64_t total) {
          progress.update(a.check ? fmt::format("checking: {} of {} messages", done, total)
                                  : fmt::format("simulating: {} of {} messages, at {:.1f} us", done, total, now_us));
        };
        const auto t1 = Clock::now();
        if (a.check) {
          Status st = sim::check(store, opt);
          if (!st.is_ok()) row.error = st.to_string();
        } else {
          auto res = sim::simulate(store, fabric, opt);
          if (!res.is_ok()) {
            row.error = res.status().to_string();
          } else {
            row.sim_us = res->time_us / a.iters;
            row.slowest = res->slowest_rank;
            row.critical = res->critical_text;
            row.path_us = res->path_us;
            row.events = res->events;
            row.critical_share =
                res->time_us > 0 ? res->path_us[static_cast<size_t>(res->critical)] / res->time_us : 0;
            row.busbw = res->time_us > 0 ? shape.algbw_bytes / row.sim_us / 1e3 * shape.bus_factor : 0;
          }
        }
        row.sim_s = seconds_since(t1);
      }
      progress.end();
      if (row.sim_us >= 0 && (sum.best_sim_us < 0 || row.sim_us < sum.best_sim_us)) {
        sum.best_sim_us = row.sim_us;
        sum.sim_best = row.algo;
      }
      if (row.algo == sum.tuner_pick) sum.pick_sim_us = row.sim_us;
      rows.push_back(std::move(row));
    }
    if (sum.pick_sim_us > 0 && sum.best_sim_us > 0) sum.slower = sum.pick_sim_us / sum.best_sim_us - 1;
    summaries.push_back(sum);
  }
  const double total_s = seconds_since(t_start);

  int failures = 0;
  for (const Row& r : rows) failures += r.error.empty() ? 0 : 1;
  if (a.json) {
    json j;
    j["collective"] = collective_name(a.coll);
    j["nranks"] = n;
    j["nhosts"] = rt.nhosts;
    j["ranks_per_host"] = rt.ranks_per_host;
    j["topology"] = g.source;
    j["dtype"] = dtype_name(a.dt);
    j["mode"] = a.check ? "check" : "time";
    j["eager_bytes"] = a.eager_bytes;
    j["iters"] = a.iters;
    j["gap_us"] = a.gap_us >= 0 ? a.gap_us : cost.overlap_us;
    j["rows"] = json::array();
    for (const Row& r : rows) {
      json o = {{"bytes", r.bytes}, {"algorithm", r.algo}, {"phases", r.phases}, {"messages", r.messages},
                {"build_s", r.build_s}, {"sim_s", r.sim_s}, {"store_bytes", r.store_bytes},
                {"events", r.events}};
      if (!r.error.empty()) o["error"] = r.error;
      if (!a.check && r.error.empty()) {
        o["sim_us"] = r.sim_us;
        o["busbw_GBps"] = r.busbw;
        o["slowest_rank"] = r.slowest;
        o["critical"] = r.critical;
        o["critical_share"] = r.critical_share;
        json path = json::object();
        for (int k = 0; k < sim::kNumLimits; ++k)
          if (r.path_us[static_cast<size_t>(k)] > 0)
            path[sim::limit_name(static_cast<sim::Limit>(k))] = r.path_us[static_cast<size_t>(k)];
        o["critical_path_us"] = path;
      }
      if (!a.check) {
        o["model_us"] = r.model_us >= 0 ? json(r.model_us) : json(nullptr);
        o["chunk_bytes"] = r.chunk_bytes;
        if (r.model_us > 0 && r.sim_us >= 0) o["sim_over_model"] = r.sim_us / r.model_us;
      }
      j["rows"].push_back(o);
    }
    if (!a.check) {
      j["sizes"] = json::array();
      for (const SizeSummary& s : summaries)
        j["sizes"].push_back({{"bytes", s.bytes}, {"tuner_pick", s.tuner_pick}, {"tuner_source", s.tuner_source},
                              {"tuner_pick_sim_us", s.pick_sim_us}, {"sim_best", s.sim_best},
                              {"sim_best_us", s.best_sim_us}, {"tuner_pick_slower", s.slower}});
    }
    j["wall_s"] = total_s;
    j["peak_rss_kb"] = peak_rss_kb();
    std::printf("%s\n", j.dump(2).c_str());
    return failures ? 1 : 0;
  }
  if (a.csv) {
    if (a.check) {
      std::printf("collective,nranks,bytes,algorithm,phases,messages,result\n");
      for (const Row& r : rows)
        std::printf("%s,%d,%zu,%s,%llu,%llu,\"%s\"\n", collective_name(a.coll), n, r.bytes, r.algo.c_str(),
                    static_cast<unsigned long long>(r.phases), static_cast<unsigned long long>(r.messages),
                    r.error.empty() ? "ok" : r.error.c_str());
    } else {
      std::printf("collective,nranks,bytes,algorithm,sim_us,model_us,sim_over_model,busbw_GBps,slowest_rank,critical,"
                  "tuner_pick,sim_best,error\n");
      for (const Row& r : rows) {
        const SizeSummary* s = nullptr;
        for (const SizeSummary& x : summaries)
          if (x.bytes == r.bytes) s = &x;
        std::printf("%s,%d,%zu,%s,%.3f,%.3f,%.3f,%.3f,%d,\"%s\",%d,%d,\"%s\"\n", collective_name(a.coll), n, r.bytes,
                    r.algo.c_str(), r.sim_us, r.model_us, r.model_us > 0 && r.sim_us >= 0 ? r.sim_us / r.model_us : 0.0,
                    r.busbw, r.slowest, r.critical.c_str(), s && s->tuner_pick == r.algo ? 1 : 0,
                    s && s->sim_best == r.algo ? 1 : 0, r.error.c_str());
      }
    }
    return failures ? 1 : 0;
  }

  std::printf("# loom-sim: %s, %d ranks on %d host(s), %d per host, %s, topology %s%s\n", collective_name(a.coll), n,
              rt.nhosts, rt.ranks_per_host, dtype_name(a.dt), g.source.c_str(),
              a.iters > 1 ? fmt::format(", {} ops back to back (times per op)", a.iters).c_str() : "");
  if (a.check) {
    std::printf("# --check: matching (every send has its receive, same count, in order) and deadlock freedom\n");
    std::printf("%10s  %-13s %12s %14s  %s\n", "size", "algorithm", "phases", "messages", "result");
    for (const Row& r : rows)
      std::printf("%10s  %-13s %12llu %14llu  %s\n", topo::format_size(r.bytes).c_str(), r.algo.c_str(),
                  static_cast<unsigned long long>(r.phases), static_cast<unsigned long long>(r.messages),
                  r.error.empty() ? "ok" : r.error.c_str());
  } else {
    std::printf("# sim: simulated time (last rank); model: the tuner's closed form; T = tuner's pick, S = fastest "
                "simulated\n");
    std::printf("%10s  %-13s %2s %12s %12s %7s %9s %7s  %s\n", "size", "algorithm", "", "sim us", "model us", "sim/mod",
                "busbw", "slowest", "critical path: its largest part (share)");
    size_t last_bytes = SIZE_MAX;
    for (const Row& r : rows) {
      const SizeSummary* s = nullptr;
      for (const SizeSummary& x : summaries)
        if (x.bytes == r.bytes) s = &x;
      if (last_bytes != SIZE_MAX && r.bytes != last_bytes) std::printf("\n");
      last_bytes = r.bytes;
      std::string mark = std::string(s && s->tuner_pick == r.algo ? "T" : "") + (s && s->sim_best == r.algo ? "S" : "");
      if (!r.error.empty()) {
        std::printf("%10s  %-13s %2s  error: %s\n", topo::format_size(r.bytes).c_str(), r.algo.c_str(), mark.c_str(),
                    r.error.c_str());
        continue;
      }
      std::printf("%10s  %-13s %2s %12.2f %12s %7s %9.2f %7d  %s (%.0f%%)\n", topo::format_size(r.bytes).c_str(),
                  r.algo.c_str(), mark.c_str(), r.sim_us,
                  r.model_us >= 0 ? fmt::format("{:.2f}", r.model_us).c_str() : "-",
                  r.model_us > 0 ? fmt::format("{:.2f}", r.sim_us / r.model_us).c_str() : "-", r.busbw, r.slowest,
                  r.critical.c_str(), 100 * r.critical_share);
    }
    std::printf("\n# per size: the tuner's pick against the fastest simulated\n");
    for (const SizeSummary& s : summaries) {
      if (s.sim_best.empty()) continue;
      std::printf("%10s  tuner %-13s (%s) %s   sim best %-13s %10.2f us%s\n", topo::format_size(s.bytes).c_str(),
                  s.tuner_pick.c_str(), s.tuner_source.c_str(),
                  s.pick_sim_us >= 0 ? fmt::format("{:10.2f} us", s.pick_sim_us).c_str() : "(not simulated)",
                  s.sim_best.c_str(), s.best_sim_us,
                  s.slower > 0.2 ? fmt::format("   tuner's pick {:.0f}% slower", 100 * s.slower).c_str() : "");
    }
  }
  std::printf("# %zu run(s) in %.1f s, peak RSS %.0f MiB%s\n", rows.size(), total_s, peak_rss_kb() / 1024.0,
              failures ? fmt::format(", {} failed", failures).c_str() : "");
  return failures ? 1 : 0;
}
