#include "topology/tuner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <string>

#include "core/config.h"
#include "topology/paths.h"
#include "topology/topo_log.h"
#include "topology/tuner_plugin.h"

namespace loom::topo {
namespace {

constexpr double kGpuReduceGBps = 1000.0;  // HBM-bound elementwise reduction
constexpr double kCpuReduceGBps = 8.0;     // one core, SIMD, from memory
// One core, SIMD, operands in L2 (mem_bench reduce2 float sum, 64 KiB - 1 MiB:
// 29-41 GB/s on the 2-core reference VM); calls up to kCpuCacheBytes.
constexpr double kCpuReduceCachedGBps = 30.0;
constexpr size_t kCpuCacheBytes = size_t{1} << 20;

// The host's last-level cache (sysfs: the highest cache level of CPU 0, e.g.
// "32768K"); 32 MiB when it cannot be read. sysconf's LEVEL3_CACHE_SIZE is
// not used: it reported 320 MiB on the 32 MiB reference VM.
constexpr double kGpuChannelGBps = 25.0;   // what one GPU channel (a few SMs) drives
constexpr double kCpuChannelGBps = kHostMemBw;
constexpr double kUnknownNetGBps = 1.0;    // no NIC known: assume 10 GbE-class

double beta_of(double bw_GBps) {
  if (!(bw_GBps > 0) || std::isinf(bw_GBps)) bw_GBps = bw_GBps > 0 ? kHostMemBw : kUnknownNetGBps;
  return 1.0 / (bw_GBps * 1e3);  // GB/s = 1e3 bytes/us
}

void worst(LinkCost& w, const LinkCost& l) {
  w.alpha_us = std::max(w.alpha_us, l.alpha_us);
  w.beta_us_per_byte = std::max(w.beta_us_per_byte, l.beta_us_per_byte);
}

}  // namespace

double transport_base_latency_us(TransportKind k) {
  switch (k) {
    case TransportKind::kShm: return 1.0;
    case TransportKind::kCudaIpc: return 1.5;
    case TransportKind::kIb: return 3.0;
    case TransportKind::kSocket: return 20.0;
  }
  return 10.0;
}

PairCosts::PairCosts(const TopoGraph& g, const RankTopology& rt, const TransportPolicy& policy)
    : g_(&g), rt_(&rt), policy_(policy), memo_(2 * static_cast<size_t>(rt.nclasses()) * static_cast<size_t>(rt.nclasses())) {}

LinkCost PairCosts::operator()(int a, int b) const {
  const RankTopology& rt = *rt_;
  const bool same_host = rt.ranks[static_cast<size_t>(a)].host == rt.ranks[static_cast<size_t>(b)].host;
  const size_t nc = static_cast<size_t>(rt.nclasses());
  std::optional<LinkCost>& m =
      memo_[(same_host ? nc * nc : 0) + static_cast<size_t>(rt.slot_class(a)) * nc + static_cast<size_t>(rt.slot_class(b))];
  if (!m) {
    const Path& path = rt.path(a, b);
    TransportChoice t = choose_transport(*g_, rt, a, b, policy_);
    m = LinkCost{transport_base_latency_us(t.kind) + path.latency_us, beta_of(path.bw)};
  }
  return LinkCost{m->alpha_us * alpha_scale_, m->beta_us_per_byte * beta_scale_};
}

Tuner::Tuner(TopoGraph graph, TunerOptions options) : graph_(std::move(graph)), options_(options) {}
Tuner::~Tuner() = default;

Result<std::unique_ptr<Tuner>> Tuner::from_env(TopoGraph graph, int nranks, TunerOptions options) {
  auto t = std::make_unique<Tuner>(std::move(graph), options);
  if (const char* spec = std::getenv("LOOM_ALGO"); spec != nullptr && *spec != '\0') {
    LOOM_ASSIGN_OR_RETURN(AlgoOverride ov, parse_algo_override(spec));
    t->set_override(std::move(ov));
  }
  if (const char* cal = std::getenv("LOOM_TUNE_CALIBRATE"); cal != nullptr && std::strcmp(cal, "1") == 0) {
    t->set_calibration_requested(true);
  }
  // Measured parameters (perf-tests/algo_sweep.sh fits them) replace the topology's.
  // Parsed strictly, each error naming its variable; one of the pair alone
  // is an error. Regression: atof read "abc" as 0 (then "alpha 0 out of
  // range"), and a lone or unparsable variable was dropped silently.
  auto number = [](const char* name, double* out) -> Result<bool> {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return false;
    char* end = nullptr;
    errno = 0;
    *out = std::strtod(v, &end);
    if (end == v || *end != '\0' || errno != 0 || !std::isfinite(*out))
      return invalid_argument(std::string(name) + "='" + v + "' is not a number");
    return true;
  };
  double alpha = 0, bw = 0, red = 0;
  LOOM_ASSIGN_OR_RETURN(bool have_alpha, number("LOOM_TUNE_ALPHA_US", &alpha));
  LOOM_ASSIGN_OR_RETURN(bool have_bw, number("LOOM_TUNE_BW_GBPS", &bw));
  LOOM_ASSIGN_OR_RETURN(bool have_red, number("LOOM_TUNE_REDUCE_GBPS", &red));
  if ((have_alpha || have_bw || have_red) && !(have_alpha && have_bw))
    return invalid_argument("LOOM_TUNE_ALPHA_US and LOOM_TUNE_BW_GBPS go together (LOOM_TUNE_REDUCE_GBPS needs both)");
  if (have_alpha) {
    Status st = t->calibrate(alpha, bw, red);
    if (!st.is_ok()) return st.with_context("LOOM_TUNE_ALPHA_US / LOOM_TUNE_BW_GBPS / LOOM_TUNE_REDUCE_GBPS");
  }
  if (const char* path = std::getenv("LOOM_TUNER_PLUGIN"); path != nullptr && *path != '\0') {
    RankTopology rt = map_ranks(t->graph_, nranks, options.ranks_per_host);
    LOOM_RETURN_IF_ERROR(t->load_plugin(path, nranks, rt.nhosts));
  }
  return t;
}

void Tuner::set_override(AlgoOverride ov) { override_ = std::move(ov); }

Status Tuner::load_plugin(const std::string& path, int nranks, int nhosts) {
  LOOM_ASSIGN_OR_RETURN(plugin_, TunerPlugin::load(path, nranks, nhosts));
  return Status::ok();
}

Status Tuner::calibrate(double alpha_us, double bw_GBps, double gamma_GBps) {
  // alpha 0: a latency below what was measured (algo_sweep.sh rounds).
  if (!(alpha_us >= 0 && alpha_us < 1e7) || !(bw_GBps > 0 && bw_GBps < 1e5) || !(gamma_GBps >= 0)) {
    return invalid_argument("tuner calibration: alpha " + std::to_string(alpha_us) + " us / bandwidth " +
                            std::to_string(bw_GBps) + " GB/s out of range");
  }
  std::lock_guard<std::mutex> lock(mu_);
  cal_alpha_us_ = alpha_us;
  cal_bw_ = bw_GBps;
  if (gamma_GBps > 0) cal_gamma_ = gamma_GBps;
  cache_.clear();
  return Status::ok();
}

Status Tuner::set_hand_off_rounds(double across_us, double within_us) {
  if (!(across_us >= 0 && across_us < 1e7) || !(within_us >= 0 && within_us < 1e7))
    return invalid_argument("tuner hand-off rounds: " + std::to_string(across_us) + " / " + std::to_string(within_us) +
                            " us out of range");
  std::lock_guard<std::mutex> lock(mu_);
  round_across_us_ = across_us;
  round_within_us_ = within_us;
  cache_.clear();
  return Status::ok();
}

CommCost Tuner::derive_cost(int nranks, double* alpha_scale, double* beta_scale) const {
  CommCost c;
  RankTopology rt = map_ranks(graph_, nranks, options_.ranks_per_host);
  const int p = rt.nranks;
  const PairCosts pair(graph_, rt, options_.transport);
  // Every distinct pair's combination, without the O(p^2) loop over ranks.
  const std::vector<int> reps = rt.representatives();
  for (int i = 0; i < p && p > 1; ++i) worst(c.ring, pair(i, (i + 1) % p));
  for (int k = 0; (1 << k) < p; ++k) {
    LinkCost w;
    for (int i = 0; i < p; ++i) {
      int j = i ^ (1 << k);
      if (j < p) worst(w, pair(i, j));
    }
    c.level.push_back(w);
  }
  for (int i : reps) {
    for (int j : reps) {
      if (i != j) worst(c.all, pair(i, j));
    }
  }
  const bool gpu = !rt.ranks.empty() && rt.ranks[0].device >= 0;
  c.gamma_us_per_byte = 1.0 / ((gpu ? kGpuReduceGBps : kCpuReduceGBps) * 1e3);
  if (!gpu) {
    c.gamma_cached_us_per_byte = 1.0 / (kCpuReduceCachedGBps * 1e3);
    c.cache_bytes = kCpuCacheBytes;
  }
  double ring_bw = c.ring.beta_us_per_byte > 0 ? 1.0 / (c.ring.beta_us_per_byte * 1e3) : kHostMemBw;
  c.channel_fraction = std::min(1.0, (gpu ? kGpuChannelGBps : kCpuChannelGBps) / ring_bw);
  c.max_channels = gpu ? 32 : 4;
  // Many messages through one NIC overlap less than through memory.
  // Shared memory: each extra concurrent message costs the receiver about 0.4
  // alpha of its own (fingerprint, copy set-up, doorbell); fitted on 4 and 8
  // ranks, where direct one-shot only ties recursive doubling at 4 ranks.
  c.overlap_us = rt.nhosts > 1 ? 0.5 * c.all.alpha_us : 0.4;
  c.nhosts = std::max(rt.nhosts, 1);
  if (c.nhosts > 1) {
    // Ranks of the first host per NIC; unknown (0) when a rank has none.
    std::map<int, int> per_nic;
    int most = 0;
    for (int r = 0; r < std::min(rt.ranks_per_host, rt.nranks) && (r == 0 || most > 0); ++r) {
      const int nic = rt.ranks[static_cast<size_t>(r)].nic;
      most = nic < 0 ? 0 : std::max(most, ++per_nic[nic]);
    }
    c.ranks_per_nic = most;
  }
  if (c.nhosts == 1) {
    c.single_copy_bytes = params::shm_single_copy_xproc_bytes(p);  // ranks are processes, as usual
    c.single_copy_plain_bytes = params::shm_single_copy_plain_xproc_bytes(p);
    c.oversubscribed = params::oversubscribed(p);
    // Host memory: the FIFO's two copies are beta; a receiver that reduces
    // reads the FIFO in its reduction (cost_model.h). GPUs: beta is the
    // link, not a copy.
    if (!gpu) c.fused_receive_factor = 0.5;
    if (c.oversubscribed) c.cores = params::host_cores();
    if (!gpu) c.llc_bytes = params::broadcast_cache_bytes(p);
    if (options_.map_shared.value_or(params::shm_map_shared() != 0)) {
      c.map_min_bytes = params::shm_map_min_bytes();
      c.map_cache_bytes = params::host_llc_bytes();
      // Oversubscribed, a partial sum read through a mapping costs its
      // reader as much as a FIFO message: the lines were just written by a
      // rank on another core (or swapped out with its turn), and the saved
      // sender copy was never the bottleneck there. Measured, 2 cores,
      // reduce_scatter of 1-4 MiB, ring (2 of 3 steps read mapped) against
      // recursive halving (1 of 2), same bytes per rank, min of 3: 4 ranks
      // 1 MiB 264 / 191 us, 4 MiB 1062 / 756; 8 ranks 4 MiB 2661 / 1818
      // (run 16 alike: 1.38, 1.41, 1.72), which the model with free mapped
      // reads (0) gave to the ring. Reduce with it (binomial's mapped
      // partial sums) stays within 7% of the best at 256K-4M.
      // With a CPU per rank: not measured here; the reads stay free.
      if (c.oversubscribed) {
        c.mapped_factor = 1.0;
        c.stage_min_bytes = params::shm_announced_min_bytes();  // staged direct all_gather, broadcast
      }
    }
  }
  for (int i : reps) {
    for (int j : reps) {
      if (i == j) continue;
      if (rt.ranks[static_cast<size_t>(i)].host == rt.ranks[static_cast<size_t>(j)].host) worst(c.intra, pair(i, j));
      else worst(c.cross, pair(i, j));
    }
  }

  if (alpha_scale) *alpha_scale = 1;
  if (beta_scale) *beta_scale = 1;
  if (cal_alpha_us_ && c.ring.alpha_us > 0) {
    double sa = *cal_alpha_us_ / c.ring.alpha_us;
    double sb = beta_of(*cal_bw_) / c.ring.beta_us_per_byte;
    if (alpha_scale) *alpha_scale = sa;
    if (beta_scale) *beta_scale = sb;
    auto scale = [&](LinkCost& l) {
      l.alpha_us *= sa;
      l.beta_us_per_byte *= sb;
    };
    scale(c.ring);
    scale(c.all);
    scale(c.intra);
    scale(c.cross);
    for (LinkCost& l : c.level) scale(l);
  }
  if (cal_gamma_) {
    // Calibration measures the reduction from memory (4 MiB operands); the
    // cached rate stays at least as fast.
    c.gamma_us_per_byte = 1.0 / (*cal_gamma_ * 1e3);
    if (c.gamma_cached_us_per_byte > 0) c.gamma_cached_us_per_byte = std::min(c.gamma_cached_us_per_byte, c.gamma_us_per_byte);
  }
  if (round_across_us_ && c.oversubscribed && c.cores > 0 && p > c.cores) {
    // A round of the probe is a ring allreduce round of 8 B: each rank sends
    // and receives one message (alpha) for each of the p / cores ranks of a
    // core, plus the hand-off for each of the others (cost_model.cc).
    const double per_core = static_cast<double>(p) / c.cores;
    auto hand_off = [&](double round_us) { return std::max(0.0, (round_us - c.ring.alpha_us * per_core) / (per_core - 1)); };
    c.hand_off_cross_us = hand_off(*round_across_us_);
    c.hand_off_us = hand_off(*round_within_us_);
  }
  return c;
}

Status Tuner::set_measured_offset(Collective coll, int nranks, AlgoKind a, double offset_us) {
  if (!std::isfinite(offset_us) || std::abs(offset_us) > 1e7)
    return invalid_argument("measured offset " + std::to_string(offset_us) + " us out of range");
  std::lock_guard<std::mutex> lock(mu_);
  offsets_[{static_cast<int>(coll), nranks, static_cast<int>(a)}] = offset_us;
  return Status::ok();
}

CommCost Tuner::cost(int nranks) {
  nranks = std::max(nranks, 1);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(nranks);
  if (it != cache_.end()) return it->second;
  CommCost c = derive_cost(nranks);
  cache_.emplace(nranks, c);
  return c;
}

PairCosts Tuner::pair_costs(const RankTopology& rt) {
  double sa = 1, sb = 1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cal_alpha_us_) derive_cost(rt.nranks, &sa, &sb);  // the factors depend on the ring's pairs
  }
  PairCosts pc(graph_, rt, options_.transport);
  pc.scale(sa, sb);
  return pc;
}

std::vector<Estimate> Tuner::estimate_all(Collective coll, size_t bytes, int nranks) {
  CommCost c = cost(nranks);
  std::vector<Estimate> out;
  for (AlgoKind a : algos_for(coll)) {
    if (auto e = estimate(a, coll, bytes, nranks, c)) out.push_back(*e);
  }
  std::stable_sort(out.begin(), out.end(), [](const Estimate& a, const Estimate& b) { return a.us < b.us; });
  return out;
}

Result<Selection> Tuner::select(Collective coll, size_t bytes, int nranks, const std::vector<std::string>& available) {
  std::vector<std::string> names = available;
  if (names.empty()) {
    for (AlgoKind a : algos_for(coll)) names.emplace_back(algo_name(a));
  }
  if (names.empty()) {
    return not_supported(std::string("no algorithm available for ") + collective_name(coll));
  }
  CommCost c = cost(nranks);
  struct Cand {
    std::string name;
    std::optional<AlgoKind> kind;
    std::optional<Estimate> est;
  };
  std::vector<Cand> cands;
  bool probed = false;  // an estimate carries a measured offset
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& n : names) {
      Cand cd{n, parse_algo(n, coll), std::nullopt};
      if (cd.kind) cd.est = estimate(*cd.kind, coll, bytes, nranks, c);
      if (cd.est) {
        auto it = offsets_.find({static_cast<int>(coll), nranks, static_cast<int>(*cd.kind)});
        if (it != offsets_.end()) {
          cd.est->us = std::max(0.0, cd.est->us + it->second);
          probed = true;
        }
      }
      cands.push_back(std::move(cd));
    }
  }
  // Model order: estimated candidates fastest first, the rest after, in the caller's order.
  std::vector<size_t> order(cands.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    double ta = cands[a].est ? cands[a].est->us : std::numeric_limits<double>::infinity();
    double tb = cands[b].est ? cands[b].est->us : std::numeric_limits<double>::infinity();
    return ta < tb;
  });

  size_t chosen = order[0];
  std::string source = cands[chosen].est ? (probed ? "model + probe" : "model") : "first available";
  size_t chunk_override = 0;
  int channel_override = 0;
  bool forced = false;
  if (auto forced_algo = override_.lookup(coll, bytes)) {
    for (size_t i = 0; i < cands.size(); ++i) {
      if (cands[i].kind == forced_algo) {
        chosen = i;
        source = "LOOM_ALGO";
        forced = true;
        break;
      }
    }
    if (!forced) {
      topo_warn(std::string("LOOM_ALGO asks for ") + algo_name(*forced_algo) + " for " + collective_name(coll) +
                " of " + std::to_string(bytes) + " bytes, but it is not available here; using the model's choice");
    }
  }
  if (!forced && plugin_ != nullptr) {
    std::vector<const char*> cnames;
    std::vector<double> pred;
    for (const Cand& cd : cands) {
      cnames.push_back(cd.name.c_str());
      pred.push_back(cd.est ? cd.est->us : -1.0);
    }
    RankTopology rt = map_ranks(graph_, nranks, options_.ranks_per_host);
    loom_tuner_request_v1_t req{static_cast<int>(coll), bytes, nranks, rt.nhosts, static_cast<int>(cands.size()),
                                cnames.data(), pred.data()};
    auto choice = plugin_->choose(req);
    if (!choice.is_ok()) {
      topo_warn(choice.status().to_string() + "; keeping the model's choice");
    } else {
      if (choice->candidate >= 0) {
        chosen = static_cast<size_t>(choice->candidate);
        source = "plugin " + plugin_->name();
      }
      chunk_override = choice->chunk_bytes;
      channel_override = choice->channels;
      if ((chunk_override != 0 || channel_override != 0) && choice->candidate < 0) source = "model+plugin " + plugin_->name();
    }
  }

  Selection s;
  const Cand& win = cands[chosen];
  s.algorithm = win.name;
  s.source = source;
  if (win.est) {
    s.predicted_us = win.est->us;
    s.chunk_bytes = win.est->chunk_bytes;
    s.channels = win.est->channels;
  } else {
    s.chunk_bytes = std::max<size_t>(bytes, 1);
  }
  if (chunk_override != 0) s.chunk_bytes = chunk_override;
  if (channel_override != 0) s.channels = channel_override;
  for (size_t i : order) {
    if (i == chosen || !cands[i].est) continue;
    s.runner_up = cands[i].name;
    s.runner_up_us = cands[i].est->us;
    break;
  }
  return s;
}

}  // namespace loom::topo
