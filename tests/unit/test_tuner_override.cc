// LOOM_ALGO grammar, and forcing through the tuner.
#include <cmath>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "algorithms/algorithms.h"
#include "common/test_util.h"
#include "test_topology_util.h"
#include "topology/algo_override.h"
#include "topology/topo_xml.h"
#include "topology/tuner.h"

namespace loom::topo {
namespace {

TEST(AlgoOverride, ParsesTheDocumentedExample) {
  auto r = parse_algo_override("allreduce:0-64K:hypercube,64K-:ring;broadcast:tree");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const AlgoOverride& ov = r.value();
  ASSERT_EQ(ov.rules.size(), 3u);
  EXPECT_EQ(ov.lookup(Collective::kAllReduce, 0), AlgoKind::kHypercube);
  EXPECT_EQ(ov.lookup(Collective::kAllReduce, 65535), AlgoKind::kHypercube);
  EXPECT_EQ(ov.lookup(Collective::kAllReduce, 65536), AlgoKind::kRing);  // half-open ranges
  EXPECT_EQ(ov.lookup(Collective::kAllReduce, 1ull << 40), AlgoKind::kRing);
  EXPECT_EQ(ov.lookup(Collective::kBroadcast, 123), AlgoKind::kTree);
  EXPECT_FALSE(ov.lookup(Collective::kAllGather, 1).has_value());
  EXPECT_EQ(ov.to_string(), "allreduce:0-64K:hypercube,64K-:ring;broadcast:0-:tree");
  // The canonical form parses to the same rules.
  auto again = parse_algo_override(ov.to_string());
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->to_string(), ov.to_string());
}

TEST(AlgoOverride, WhitespaceCaseAliasesAndUnits) {
  auto r = parse_algo_override(" AllReduce : 1KiB - 2MB : Recursive_Doubling ; bcast:ring ; all_to_all:-1G:bruck;");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->lookup(Collective::kAllReduce, 1024), AlgoKind::kHypercube);
  EXPECT_FALSE(r->lookup(Collective::kAllReduce, 1023).has_value());
  EXPECT_FALSE(r->lookup(Collective::kAllReduce, 2u << 20).has_value());
  EXPECT_EQ(r->lookup(Collective::kBroadcast, 5), AlgoKind::kChain);
  EXPECT_EQ(r->lookup(Collective::kAllToAll, 0), AlgoKind::kBruck);
  EXPECT_TRUE(parse_algo_override("").is_ok());
  EXPECT_EQ(parse_size("64K").value(), 65536u);
  EXPECT_EQ(parse_size("3G").value(), 3ull << 30);
  EXPECT_EQ(parse_size("17").value(), 17u);
  EXPECT_EQ(format_size(1u << 20), "1M");
  EXPECT_EQ(format_size(1000), "1000");
}

TEST(AlgoOverride, PreciseErrors) {
  struct Case {
    const char* spec;
    const char* expect;
  };
  const Case cases[] = {
      {"allreduc:ring", "column 1: unknown collective 'allreduc'"},
      {"allreduce:rng", "column 11: unknown algorithm 'rng'"},
      {"allreduce:0-64K:ring;broadcast:pairwise", "column 32: algorithm 'pairwise' cannot run broadcast"},
      {"allreduce:64K:ring", "column 11: range '64K' needs a '-'"},
      {"allreduce:64K-1K:ring", "column 11: empty range '64K-1K'"},
      {"allreduce:0-64Q:ring", "column 13: size '64Q' has an unknown unit"},
      {"allreduce:x-1K:ring", "column 11: size 'x' does not start with a number"},
      {"allreduce:0-99999999999999999999:ring", "overflows"},
      {"allreduce:0-99999999999T:ring", "overflows"},
      {"allreduce:0-64K:ring,32K-:tree", "column 22: range of '32K-:tree' overlaps"},
      {"allreduce:ring;allreduce:tree", "overlaps an earlier rule for allreduce"},
      {"allreduce:", "no algorithm after 'allreduce:'"},
      {"allreduce:ring,", "column 16: empty item"},
      {"allreduce:0-1K:", "column 16: missing algorithm name"},
      {"ring", "column 1: expected 'collective:algorithm'"},
  };
  for (const Case& c : cases) {
    auto r = parse_algo_override(c.spec);
    ASSERT_FALSE(r.is_ok()) << c.spec;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << c.spec << " -> " << r.status().message();
    EXPECT_EQ(r.status().message().rfind("LOOM_ALGO", 0), 0u);
  }
  EXPECT_FALSE(parse_algo_override(std::string(5000, 'a')).is_ok());
}

TopoGraph flat_host() {
  auto r = graph_from_xml_text("<system><cpu numaid=\"0\"/></system>", "flat");
  EXPECT_TRUE(r.is_ok());
  return r.value().graph;
}

TEST(AlgoOverride, ForcingChangesTheSelection) {
  Tuner t(flat_host());
  const std::vector<std::string> avail = {"ring", "hypercube", "tree"};
  auto model_small = t.select(Collective::kAllReduce, 256, 8, avail);
  auto model_large = t.select(Collective::kAllReduce, 256u << 20, 8, avail);
  ASSERT_TRUE(model_small.is_ok() && model_large.is_ok());
  ASSERT_EQ(model_small->algorithm, "hypercube");
  ASSERT_EQ(model_large->algorithm, "ring");
  // The opposite of the model's choice, by size.
  t.set_override(parse_algo_override("allreduce:0-64K:ring,64K-:hypercube").value());
  auto small = t.select(Collective::kAllReduce, 256, 8, avail);
  auto large = t.select(Collective::kAllReduce, 256u << 20, 8, avail);
  EXPECT_EQ(small->algorithm, "ring");
  EXPECT_EQ(small->source, "LOOM_ALGO");
  EXPECT_EQ(small->runner_up, "hypercube");  // the model's best is still shown
  EXPECT_EQ(large->algorithm, "hypercube");
  EXPECT_GT(large->predicted_us, model_large->predicted_us);
  // A forced algorithm the engine cannot run falls back to the model (with a warning).
  testing::QuietTopo quiet;
  t.set_override(parse_algo_override("allreduce:rabenseifner").value());
  auto fb = t.select(Collective::kAllReduce, 256, 8, avail);
  EXPECT_EQ(fb->algorithm, "hypercube");
  EXPECT_EQ(fb->source, "model");
}

// The oversubscribed algorithm probe (LOOM_TUNE_PROBE_ALGOS) hands the tuner
// measured minus modelled times; select() adds them to that algorithm's
// estimate for that collective and rank count only, at every size.
TEST(TunerProbe, MeasuredOffsetsMoveTheChoice) {
  Tuner t(flat_host());
  const std::vector<std::string> avail = {"ring", "hypercube", "direct"};
  auto before = t.select(Collective::kAllReduce, 8, 8, avail);
  ASSERT_TRUE(before.is_ok());
  ASSERT_EQ(before->source, "model");
  ASSERT_FALSE(before->runner_up.empty());
  const std::string first = before->algorithm, second = before->runner_up;
  const double a = before->predicted_us, b = before->runner_up_us;
  // Measured: the model's choice 5 us slower than its runner-up's estimate.
  const double off = b - a + 5;
  ASSERT_TRUE(t.set_measured_offset(Collective::kAllReduce, 8, *parse_algo(first, Collective::kAllReduce), off).is_ok());
  auto after = t.select(Collective::kAllReduce, 8, 8, avail);
  ASSERT_TRUE(after.is_ok());
  EXPECT_EQ(after->algorithm, second);
  EXPECT_EQ(after->source, "model + probe");
  EXPECT_DOUBLE_EQ(after->predicted_us, b);
  EXPECT_EQ(after->runner_up, first);
  EXPECT_DOUBLE_EQ(after->runner_up_us, a + off);
  // Another rank count or collective keeps the model's figures.
  EXPECT_EQ(t.select(Collective::kAllReduce, 8, 4, avail)->source, "model");
  EXPECT_EQ(t.select(Collective::kAllGather, 64, 8, {"ring", "hypercube", "direct"})->source, "model");
  // Large sizes: the offset is a fixed cost; the ring stays ahead.
  EXPECT_EQ(t.select(Collective::kAllReduce, 256u << 20, 8, avail)->algorithm, "ring");
  // A negative offset never prices an algorithm below zero.
  ASSERT_TRUE(t.set_measured_offset(Collective::kAllReduce, 8, AlgoKind::kRing, -1e6).is_ok());
  auto ring = t.select(Collective::kAllReduce, 8, 8, avail);
  EXPECT_EQ(ring->algorithm, "ring");
  EXPECT_EQ(ring->predicted_us, 0.0);
  EXPECT_FALSE(t.set_measured_offset(Collective::kAllReduce, 8, AlgoKind::kRing, std::nan("")).is_ok());
}

TEST(AlgoOverride, FromEnvironment) {
  setenv("LOOM_ALGO", "broadcast:binomial", 1);
  setenv("LOOM_TUNE_CALIBRATE", "1", 1);
  auto t = Tuner::from_env(flat_host(), 4);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_TRUE(t.value()->calibration_requested());
  auto s = t.value()->select(Collective::kBroadcast, 1u << 26, 4, {});
  EXPECT_EQ(s->algorithm, "binomial");
  setenv("LOOM_ALGO", "broadcast:binomal", 1);
  auto bad = Tuner::from_env(flat_host(), 4);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("unknown algorithm 'binomal'"), std::string::npos);
  unsetenv("LOOM_ALGO");
  unsetenv("LOOM_TUNE_CALIBRATE");
}

// LOOM_TUNE_* are parsed strictly and named in errors; alpha 0 (what
// algo_sweep.sh printed for small alphas, rounded) is accepted. Regression:
// atof read "abc" as 0, alpha 0 failed every init, and a lone or
// unparsable variable was ignored silently.
TEST(AlgoOverride, TuneVariablesAreParsedStrictly) {
  struct Case {
    const char *alpha, *bw, *red;
    const char* error;  // nullptr: accepted
  };
  const Case cases[] = {
      {"0.0", "2.78", nullptr, nullptr},
      {"1.5", "2.78", "8", nullptr},
      {"abc", "2.78", nullptr, "LOOM_TUNE_ALPHA_US='abc' is not a number"},
      {"1.5", "nan", nullptr, "LOOM_TUNE_BW_GBPS='nan' is not a number"},
      {"1.5", "2.78", "fast", "LOOM_TUNE_REDUCE_GBPS='fast' is not a number"},
      {"1.5", nullptr, nullptr, "go together"},
      {nullptr, nullptr, "8", "go together"},
  };
  for (const Case& k : cases) {
    auto set = [](const char* name, const char* v) { v ? setenv(name, v, 1) : unsetenv(name); };
    set("LOOM_TUNE_ALPHA_US", k.alpha);
    set("LOOM_TUNE_BW_GBPS", k.bw);
    set("LOOM_TUNE_REDUCE_GBPS", k.red);
    auto t = Tuner::from_env(flat_host(), 4);
    const std::string label = std::string(k.alpha ? k.alpha : "-") + "/" + (k.bw ? k.bw : "-") + "/" + (k.red ? k.red : "-");
    if (k.error == nullptr) {
      EXPECT_TRUE(t.is_ok()) << label << ": " << t.status().to_string();
    } else {
      ASSERT_FALSE(t.is_ok()) << label;
      EXPECT_NE(t.status().message().find(k.error), std::string::npos) << label << ": " << t.status().to_string();
    }
  }
  unsetenv("LOOM_TUNE_ALPHA_US");
  unsetenv("LOOM_TUNE_BW_GBPS");
  unsetenv("LOOM_TUNE_REDUCE_GBPS");
}

Collective collective_named(const std::string& name) {
  for (int c = 0; c < kNumCollectives; ++c)
    if (name == collective_name(static_cast<Collective>(c))) return static_cast<Collective>(c);
  ADD_FAILURE() << "no collective named " << name;
  return Collective::kAllReduce;
}

// The pairwise path and transport tables cover the first ranks only (JSON
// 256, text 64): they grow as n^2. Regression: 1024 ranks wrote 265 MB of
// JSON (2.4 GB of memory), 4096 ranks 168 MB of text.
TEST(TopoCli, LargeJobsListTheFirstRanksPaths) {
  const std::string topo = "env -u LOOM_ALGO -u LOOM_TUNER_PLUGIN LOOM_TOPO_QUIET=1 " + loom::testing::build_bin("loom-topo") +
                           " --topo-file " + testing::shared_topology("azure-ndv4.xml") + " --nranks 300";
  nlohmann::json j = nlohmann::json::parse(loom::testing::run_command(topo + " --json"), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["nranks"], 300);
  EXPECT_EQ(j["ranks"].size(), 300u);
  EXPECT_EQ(j["paths_ranks"], 256);
  ASSERT_EQ(j["paths"].size(), 256u);
  EXPECT_EQ(j["paths"][0].size(), 256u);
  EXPECT_EQ(j["paths"][0][8]["type"], "NET");
  EXPECT_EQ(j["transports"].size(), 256u * 255u);
  const std::string text = loom::testing::run_command(topo);
  EXPECT_NE(text.find("Path matrix (type / GB/s) of the first 64 of 300 ranks:"), std::string::npos) << text.substr(0, 2000);
  EXPECT_EQ(text.find(" r64 "), std::string::npos);
}

// loom-topo --estimates prints what select() weighs: for every collective
// and size its cheapest row is the algorithm the Selection table names.
// Only algorithms a job can run appear in either (registered for the
// collective). Regression: both listed every kind the model prices, so
// the tool named a direct or pairwise reduce_scatter and a direct
// all_gather, which no job can pick.
TEST(TopoCli, EstimatesAgreeWithTheSelection) {
  const std::string topo = "env -u LOOM_ALGO -u LOOM_TUNER_PLUGIN LOOM_TOPO_QUIET=1 " + loom::testing::build_bin("loom-topo") +
                           " --topo-file " + testing::shared_topology("azure-ndv4.xml") + " --nranks 8";
  std::istringstream est(loom::testing::run_command(topo + " --estimates --sizes 8,2M,16M"));
  std::string line;
  ASSERT_TRUE(std::getline(est, line));
  EXPECT_EQ(line, "collective,bytes,algorithm,predicted_us,chunk_bytes");
  std::map<std::pair<std::string, std::string>, std::pair<double, std::string>> cheapest;
  int rows = 0;
  while (std::getline(est, line)) {
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string x; std::getline(ls, x, ',');) f.push_back(x);
    ASSERT_EQ(f.size(), 5u) << line;
    EXPECT_NE(find_algorithm(collective_named(f[0]), f[2]), nullptr) << "not a runnable algorithm: " << line;
    const double us = std::stod(f[3]);
    EXPECT_GT(us, 0) << line;
    auto key = std::make_pair(f[0], f[1]);
    if (!cheapest.count(key) || us < cheapest[key].first) cheapest[key] = {us, f[2]};
    ++rows;
  }
  EXPECT_GT(rows, 3 * 7);  // several algorithms for most collectives, 3 sizes
  std::istringstream sel(loom::testing::run_command(topo));
  int checked = 0;
  while (std::getline(sel, line)) {
    std::istringstream ls(line);
    std::string coll, bytes, algo;
    if (!(ls >> coll >> bytes >> algo)) continue;
    const std::string b = bytes == "8" ? "8" : bytes == "2M" ? "2097152" : bytes == "16M" ? "16777216" : "";
    const auto key = std::make_pair(coll, b);
    if (b.empty() || !cheapest.count(key)) continue;
    EXPECT_EQ(algo, cheapest[key].second) << coll << " " << bytes;
    EXPECT_NE(find_algorithm(collective_named(coll), algo), nullptr) << "not a runnable algorithm: " << line;
    ++checked;
  }
  EXPECT_GE(checked, 12) << "Selection rows at 8 B / 2M / 16M not found";
}

// --hand-off A,W gives the estimates a job's tuner weighed after its
// hand-off probe (the TUNE log's "a round A us across cores, W us within
// one"): with more ranks than cores they grow with the rounds.
TEST(TopoCli, HandOffRoundsReachTheEstimates) {
  const int ranks = 4 * std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));  // oversubscribed anywhere
  const std::string topo = "env -u LOOM_ALGO -u LOOM_TUNER_PLUGIN LOOM_TOPO_QUIET=1 " + loom::testing::build_bin("loom-topo") +
                           " --nranks " + std::to_string(ranks) + " --estimates --sizes 8";
  auto ring_us = [&](const std::string& extra) {
    std::istringstream est(loom::testing::run_command(topo + extra));
    for (std::string line; std::getline(est, line);)
      if (line.rfind("allreduce,8,ring,", 0) == 0) return std::stod(line.substr(17));
    ADD_FAILURE() << "no allreduce,8,ring row with '" << extra << "'";
    return 0.0;
  };
  const double slow = ring_us(" --hand-off 100,200"), fast = ring_us(" --hand-off 0,0");
  EXPECT_GT(slow, fast + 100);
  const std::string bad = loom::testing::run_command(topo + " --hand-off 5 2>&1; echo rc=$?");
  EXPECT_NE(bad.find("--hand-off wants ACROSS_US,WITHIN_US"), std::string::npos) << bad;
  EXPECT_NE(bad.find("rc=2"), std::string::npos) << bad;
}

}  // namespace
}  // namespace loom::topo
