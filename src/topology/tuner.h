// Algorithm selection: cost model + LOOM_ALGO + tuner plugin.
//
// The engine asks, per call, which algorithm to run:
//   auto sel = tuner.select(Collective::kAllReduce, bytes, nranks, {"ring", "tree"});
// and gets {algorithm, chunk_bytes, channels, predicted_us, runner_up, ...}.
// Order of authority: LOOM_ALGO (when a rule covers the call and the forced
// algorithm is available) > tuner plugin > cost model (cost_model.h).
//
// Model parameters come from the topology graph: ranks are mapped onto the
// graph (paths.h), each rank pair gets alpha = base latency of its transport
// + path latency and beta = 1 / path bandwidth; CommCost keeps the worst pair
// per distance class. calibrate() replaces them with measured values
// (LOOM_TUNE_CALIBRATE=1 asks the engine to measure and call it).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "loom/status.h"
#include "loom/types.h"
#include "topology/algo_override.h"
#include "topology/cost_model.h"
#include "topology/graph.h"
#include "topology/transport_select.h"

namespace loom::topo {

class TunerPlugin;

struct Selection {
  std::string algorithm;
  size_t chunk_bytes = 0;
  int channels = 1;
  double predicted_us = -1;  // < 0: the model has no estimate for this algorithm
  std::string runner_up;     // empty when there is no second candidate
  double runner_up_us = -1;
  std::string source;        // "model", "LOOM_ALGO", "plugin <name>", "first available"
};

struct TunerOptions {
  int ranks_per_host = 0;  // 0: from the graph (see map_ranks)
  TransportPolicy transport;
  // Whether receivers read mem_alloc buffers through mappings
  // (LOOM_SHM_MAP_SHARED), for the model's mapped reads and staged sends.
  // A communicator passes whether every rank has it on, so every rank
  // prices alike and chooses the same algorithm; unset: this process's own.
  std::optional<bool> map_shared;
};

// Base latency of one message per transport (software + wire), in us.
double transport_base_latency_us(TransportKind k);

// The alpha and beta the cost model gives one message between two ranks of
// a placement: the base latency of the transport the pair uses
// (choose_transport) plus its path's latency, and 1 / the path's bandwidth.
// CommCost's ring, level and all figures are worsts over these; the
// simulator (tools/sim) prices each message with them, so the two differ in
// structure only, not in constants. A pair's cost is a function of the two
// slot classes and of whether they share a host (RankTopology::slot_class):
// computed once per combination, on first use. Holds `g` and `rt`, which
// must outlive it.
class PairCosts {
 public:
  PairCosts(const TopoGraph& g, const RankTopology& rt, const TransportPolicy& policy);
  LinkCost operator()(int a, int b) const;
  // Calibration (Tuner::calibrate): every alpha and beta times these.
  void scale(double alpha, double beta) {
    alpha_scale_ = alpha;
    beta_scale_ = beta;
  }
  const RankTopology& topology() const { return *rt_; }

 private:
  const TopoGraph* g_;
  const RankTopology* rt_;
  TransportPolicy policy_;
  mutable std::vector<std::optional<LinkCost>> memo_;
  double alpha_scale_ = 1, beta_scale_ = 1;
};

class Tuner {
 public:
  explicit Tuner(TopoGraph graph, TunerOptions options = {});
  ~Tuner();
  Tuner(const Tuner&) = delete;
  Tuner& operator=(const Tuner&) = delete;

  // A tuner configured from LOOM_ALGO, LOOM_TUNER_PLUGIN, LOOM_TUNE_CALIBRATE.
  // A malformed LOOM_ALGO or an unloadable plugin is an error.
  static Result<std::unique_ptr<Tuner>> from_env(TopoGraph graph, int nranks, TunerOptions options = {});

  // `available`: algorithm names the engine can run for this call (empty =
  // every algorithm the model knows). Fails only when nothing is available.
  Result<Selection> select(Collective coll, size_t bytes, int nranks, const std::vector<std::string>& available);

  // Model estimates of every known algorithm, fastest first.
  std::vector<Estimate> estimate_all(Collective coll, size_t bytes, int nranks);
  CommCost cost(int nranks);
  // The per-pair costs cost(nranks) is made of, calibrated alike. `rt` is
  // the placement, map_ranks(graph(), nranks, ranks_per_host()), and must
  // outlive the result (as this tuner must).
  PairCosts pair_costs(const RankTopology& rt);
  int ranks_per_host() const { return options_.ranks_per_host; }

  void set_override(AlgoOverride ov);
  const AlgoOverride& override_rules() const { return override_; }
  Status load_plugin(const std::string& path, int nranks, int nhosts);
  const TunerPlugin* plugin() const { return plugin_.get(); }

  bool calibration_requested() const { return calibrate_requested_; }
  void set_calibration_requested(bool v) { calibrate_requested_ = v; }
  // Calibration hook: measured alpha (us) and bandwidth (GB/s) between ring
  // neighbours, and optionally reduction throughput (GB/s, 0 = keep). Other
  // distance classes are scaled by the same ratios.
  Status calibrate(double alpha_us, double bw_GBps, double gamma_GBps = 0);
  // Oversubscribed hand-off probe (core/calibrate.h): the measured time of
  // one round of 8 B exchanges between partners on different cores and on
  // one core. derive_cost takes the model's own alpha per rank of a core out
  // and spreads the rest over the other ranks of the core: CommCost::
  // hand_off_cross_us and hand_off_us.
  Status set_hand_off_rounds(double across_us, double within_us);
  // Oversubscribed algorithm probe (core/calibrate.h, probe_schedules): the
  // measured time minus the model's estimate of algorithm `a` for `coll` at
  // `nranks`, at the probe's size. select() adds it to the model's estimate
  // of `a` at every size: where ranks take turns on the cores, an op's fixed
  // cost is the scheduler's (how often, and how long, a rank waits for a
  // core-mate), which the model's rounds price only roughly; its per-byte
  // terms are kept. Every rank must set the same offsets (agreed figures).
  Status set_measured_offset(Collective coll, int nranks, AlgoKind a, double offset_us);

  const TopoGraph& graph() const { return graph_; }

 private:
  // *alpha_scale / *beta_scale (when given): the calibration's factors on
  // the topology's alpha and beta (1 without calibration).
  CommCost derive_cost(int nranks, double* alpha_scale = nullptr, double* beta_scale = nullptr) const;

  TopoGraph graph_;
  TunerOptions options_;
  AlgoOverride override_;
  std::unique_ptr<TunerPlugin> plugin_;
  bool calibrate_requested_ = false;
  std::optional<double> cal_alpha_us_, cal_bw_, cal_gamma_;
  std::optional<double> round_across_us_, round_within_us_;
  std::map<std::tuple<int, int, int>, double> offsets_;  // (coll, nranks, algo) -> us
  std::mutex mu_;
  std::map<int, CommCost> cache_;
};

}  // namespace loom::topo
