// Every ring / chain / tree / hypercube / direct / pairwise / hierarchical
// algorithm over the real shared-memory transport (ranks as threads), forced
// with LOOM_ALGO:
// the correctness matrix of its collective (every dtype x op x count x
// in/out-of-place) plus a multi-chunk case, for 2, 3 and 5 ranks.
// LOOM_CHUNK_BYTES is lowered so the pipelined trees run many chunks.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "algorithms/algorithms.h"
#include "common/test_util.h"
#include "topology/discover.h"
#include "topology/tuner.h"

namespace loom {
namespace {

struct Forced {
  const char* spec;  // LOOM_ALGO value
  Collective coll;
  const char* name;  // the registry name the engine must end up running
};

const Forced kForced[] = {
    {"allreduce:ring", Collective::kAllReduce, "ring"},
    {"reduce_scatter:ring", Collective::kReduceScatter, "ring"},
    {"all_gather:ring", Collective::kAllGather, "ring"},
    {"broadcast:chain", Collective::kBroadcast, "chain"},
    {"reduce:chain", Collective::kReduce, "chain"},
    {"allreduce:tree", Collective::kAllReduce, "tree"},
    {"allreduce:recursive_doubling", Collective::kAllReduce, "hypercube"},
    {"allreduce:rabenseifner", Collective::kAllReduce, "rabenseifner"},
    {"allreduce:one_shot", Collective::kAllReduce, "direct"},
    {"allreduce:two_shot", Collective::kAllReduce, "two_shot"},
    {"allreduce:hierarchical", Collective::kAllReduce, "hierarchical"},
    {"reduce_scatter:recursive_halving", Collective::kReduceScatter, "rabenseifner"},
    {"all_gather:hypercube", Collective::kAllGather, "hypercube"},
    {"all_gather:bruck", Collective::kAllGather, "bruck"},
    {"all_gather:direct", Collective::kAllGather, "direct"},
    {"broadcast:direct", Collective::kBroadcast, "direct"},
    {"broadcast:tree", Collective::kBroadcast, "tree"},
    {"broadcast:binomial", Collective::kBroadcast, "binomial"},
    {"reduce:tree", Collective::kReduce, "tree"},
    {"reduce:binomial", Collective::kReduce, "binomial"},
    {"all_to_all:pairwise", Collective::kAllToAll, "pairwise"},
    {"all_to_all:direct", Collective::kAllToAll, "direct"},
};

class ForcedAlgorithm : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(ForcedAlgorithm, Matrix) {
  const Forced& f = kForced[std::get<0>(GetParam())];
  const int n = std::get<1>(GetParam());
  ASSERT_EQ(setenv("LOOM_ALGO", f.spec, 1), 0);
  ASSERT_EQ(setenv("LOOM_CHUNK_BYTES", "8K", 1), 0);
  // Every message the receiver only stores goes single copy, every one it
  // reduces below 256 KiB through the FIFO: both ends must classify each
  // message alike (Step::peer_reduces), or the data or the protocol breaks.
  ASSERT_EQ(setenv("LOOM_SHM_SINGLE_COPY_PLAIN_BYTES", "1", 1), 0);
  ASSERT_EQ(setenv("LOOM_TIMEOUT", "60", 1), 0);  // a mismatch that hangs fails here, not after 300 s

  // The engine's choice goes through the same tuner path: LOOM_ALGO must win
  // over the model for this collective at every size we run (otherwise the
  // matrix below would silently test the default algorithm).
  auto topo = topo::load_system_topology();
  ASSERT_TRUE(topo.is_ok()) << topo.status().to_string();
  auto tuner = topo::Tuner::from_env(topo->graph, n);
  ASSERT_TRUE(tuner.is_ok()) << tuner.status().to_string();
  std::vector<std::string> names;
  for (const Algorithm* a : algorithms_for(f.coll)) names.emplace_back(a->name);
  for (size_t bytes : {size_t{4}, size_t{4092}, size_t{1200004}}) {
    auto sel = (*tuner)->select(f.coll, bytes, n, names);
    ASSERT_TRUE(sel.is_ok());
    EXPECT_EQ(sel->algorithm, f.name) << f.spec << " at " << bytes << " B";
    EXPECT_EQ(sel->source, "LOOM_ALGO");
  }

  auto comms = Comm::init_all(n);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  std::vector<testing::Case> cases;
  for (const auto& c : testing::correctness_matrix(n, /*include_big=*/false))
    if (c.coll == f.coll) cases.push_back(c);
  // Many chunks of 8 KiB: pipelining, uneven halves and blocks.
  for (RedOp op : {RedOp::kSum, RedOp::kAvg}) {
    testing::Case big;
    big.coll = f.coll;
    big.count = 300001;
    big.op = op;
    big.root = n - 1;
    big.in_place = op == RedOp::kAvg;
    cases.push_back(big);
  }
  const auto errors = testing::run_cases_on_threads(*comms, cases);
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << f.spec << " rank " << r;
  for (auto& c : *comms) EXPECT_TRUE(c->destroy().is_ok());
  unsetenv("LOOM_ALGO");
  unsetenv("LOOM_CHUNK_BYTES");
  unsetenv("LOOM_SHM_SINGLE_COPY_PLAIN_BYTES");
  unsetenv("LOOM_TIMEOUT");
}

// The average of fp16 / bf16 / fp8 is NCCL's: every input times T(1/n), then
// summed. n copies of x whose sum the type cannot hold average to x
// (power-of-two values: every partial sum is exact). Regression: Loom summed
// first and divided once: fp16 / bf16 gave inf, fp8 its saturated sum / n
// (e4m3 4 x 256 -> 112, e5m2 4 x 32768 -> 14336).
TEST(AverageOfNarrowTypes, PremultipliesLikeNccl) {
  const int n = 4;
  auto comms = Comm::init_all(n);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  struct Value {
    DataType dt;
    uint16_t bits;  // x in the type's encoding (8-bit types in the low byte)
  };
  const Value values[] = {{DataType::kFloat16, 0x7800},    // 32768
                          {DataType::kBfloat16, 0x7f00},   // 2^127
                          {DataType::kFp8E4M3, 0x78},      // 256
                          {DataType::kFp8E5M2, 0x78}};     // 32768
  for (const Value& v : values) {
    const size_t es = dtype_size(v.dt), count = 5;
    std::vector<std::string> errors(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        Comm& c = *(*comms)[static_cast<size_t>(r)];
        auto fill = [&](std::vector<std::byte>& b) {
          for (size_t i = 0; i < b.size(); i += es) std::memcpy(&b[i], &v.bits, es);
        };
        auto all_x = [&](const std::byte* p, size_t elems) {
          for (size_t i = 0; i < elems; ++i)
            if (std::memcmp(p + i * es, &v.bits, es) != 0) {
              uint16_t got = 0;
              std::memcpy(&got, p + i * es, es);
              return fmt::format("element {} is 0x{:x}", i, got);
            }
          return std::string();
        };
        std::string& err = errors[static_cast<size_t>(r)];
        std::vector<std::byte> send(count * n * es), recv(count * n * es);
        fill(send);
        auto check = [&](const char* what, Result<Work> w, const std::byte* p, size_t elems) {
          if (!err.empty()) return;
          if (!w.is_ok()) { err = std::string(what) + ": " + w.status().to_string(); return; }
          Status st = w->wait();
          if (!st.is_ok()) { err = std::string(what) + ": " + st.to_string(); return; }
          std::string bad = all_x(p, elems);
          if (!bad.empty()) err = std::string(what) + ": " + bad;
        };
        check("allreduce", c.allreduce(send.data(), recv.data(), count, v.dt, RedOp::kAvg), recv.data(), count);
        fill(recv);
        check("allreduce in place", c.allreduce(recv.data(), recv.data(), count, v.dt, RedOp::kAvg), recv.data(), count);
        check("reduce_scatter", c.reduce_scatter(send.data(), recv.data(), count, v.dt, RedOp::kAvg), recv.data(), count);
        fill(recv);
        check("reduce_scatter in place",
              c.reduce_scatter(recv.data(), recv.data() + static_cast<size_t>(r) * count * es, count, v.dt, RedOp::kAvg),
              recv.data() + static_cast<size_t>(r) * count * es, count);
        auto w = c.reduce(send.data(), recv.data(), count, v.dt, RedOp::kAvg, 1);
        if (r == 1) check("reduce", std::move(w), recv.data(), count);
        else if (err.empty() && (!w.is_ok() || !w->wait().is_ok())) err = "reduce failed";
        // The input is the caller's and stays as it was.
        if (err.empty()) {
          std::string bad = all_x(send.data(), count * n);
          if (!bad.empty()) err = "send buffer changed: " + bad;
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << dtype_name(v.dt) << " rank " << r;
  }
  for (auto& c : *comms) EXPECT_TRUE(c->destroy().is_ok());
}

INSTANTIATE_TEST_SUITE_P(Algorithms, ForcedAlgorithm,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(std::size(kForced))),
                                            ::testing::Values(2, 3, 5)),
                         [](const auto& info) {
                           std::string s = kForced[std::get<0>(info.param)].spec;
                           for (char& ch : s)
                             if (ch == ':') ch = '_';
                           return s + "_n" + std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace loom
