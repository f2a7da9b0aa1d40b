// Properties of the tree / hypercube / direct / hierarchical generators that
// the closed-form matrix (test_schedules.cc) cannot see:
// - every allreduce algorithm gives every rank identical bits for floating
//   point with non-integer inputs (where reduction order matters), and the
//   direct algorithms equal the rank-order sum exactly;
// - hierarchical allreduce is correct for several host layouts;
// - tree shapes, pipelining depth and fold step counts are what the docs say;
// - supports() rejects what an algorithm cannot serve.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "algorithms/algorithms.h"
#include "algorithms/interpreter.h"
#include "algorithms/patterns.h"
#include "common/test_util.h"
#include "kernels/host_reduce.h"

namespace loom {
namespace {

struct RunResult {
  std::string error;
  std::vector<std::vector<std::byte>> out;  // recv buffer per rank
  std::vector<RankSchedule> scheds;
};

// Runs an allreduce with the named algorithm over per-rank inputs in memory.
RunResult run_allreduce(const std::string& algo, const std::vector<std::vector<std::byte>>& in, size_t count, DataType dt,
                  RedOp op, bool in_place, const std::vector<int>& hosts = {}, size_t chunk = 0) {
  RunResult run;
  const int n = static_cast<int>(in.size());
  const size_t bytes = count * dtype_size(dt);
  std::vector<std::vector<std::byte>> send(in);
  run.out.assign(n, std::vector<std::byte>(std::max<size_t>(bytes, 1), std::byte{0x5a}));
  std::vector<std::vector<std::byte*>> bufs(n);
  // The average of fp16 / bf16 / fp8 as CommImpl::run_sub runs it: inputs
  // pre-multiplied by T(1/n), summed out of place.
  if (testing::premultiply_avg(send, count, dt, op)) {
    op = RedOp::kSum;
    in_place = false;
  }
  for (int r = 0; r < n; ++r) {
    if (in_place) std::memcpy(run.out[r].data(), in[r].data(), bytes);
    bufs[r] = {in_place ? run.out[r].data() : send[r].data(), run.out[r].data()};
    CollArgs a;
    a.coll = Collective::kAllReduce;
    a.count = count;
    a.dt = dt;
    a.op = op;
    a.nranks = n;
    a.rank = r;
    a.in_place = in_place;
    a.chunk_elems = chunk;
    a.host_of_rank = hosts;
    auto s = make_schedule(a, algo);
    if (!s.is_ok()) {
      run.error = s.status().to_string();
      return run;
    }
    run.scheds.push_back(std::move(s).value());
  }
  Status st = interpret(run.scheds, bufs, dt, op);
  if (!st.is_ok()) run.error = st.to_string();
  return run;
}

// Non-integer inputs: sums depend on the association, so any rank that
// evaluates a different expression shows up as a bit difference.
std::vector<std::vector<std::byte>> random_inputs(int n, size_t count, DataType dt, RedOp op, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<std::vector<std::byte>> in(n, std::vector<std::byte>(std::max<size_t>(count * dtype_size(dt), 1)));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      double v = dist(rng) * 1000.0 + 1e-3 * dist(rng);
      if (op == RedOp::kProd) v = 1.0 + dist(rng) * 0.3;
      if (dt == DataType::kFloat32) {
        float f = static_cast<float>(v);
        std::memcpy(in[r].data() + i * 4, &f, 4);
      } else {
        std::memcpy(in[r].data() + i * 8, &v, 8);
      }
    }
  }
  return in;
}

// An allreduce call of `count` elements as rank r of n sees it.
CollArgs allreduce_args(int n, int r, size_t count) {
  CollArgs a;
  a.coll = Collective::kAllReduce;
  a.count = count;
  a.nranks = n;
  a.rank = r;
  return a;
}

std::vector<std::string> allreduce_algorithms() {
  std::vector<std::string> names;
  for (const Algorithm* a : algorithms_for(Collective::kAllReduce)) names.emplace_back(a->name);
  return names;
}

TEST(AlgorithmProps, EveryAllreduceGivesIdenticalBitsOnEveryRank) {
  const auto names = allreduce_algorithms();
  ASSERT_GE(names.size(), 7u);  // ring, tree, hypercube, rabenseifner, direct, two_shot, hierarchical
  size_t cases = 0;
  for (const std::string& algo : names) {
    for (int n : {2, 3, 4, 5, 6, 7, 8, 11, 16, 17}) {
      for (size_t count : {size_t{1}, size_t{6}, size_t{37}, size_t{515}}) {
        for (DataType dt : {DataType::kFloat32, DataType::kFloat64}) {
          for (RedOp op : {RedOp::kSum, RedOp::kProd, RedOp::kAvg}) {
            auto in = random_inputs(n, count, dt, op, 1000 * n + count);
            const bool in_place = (n + count) % 2;
            RunResult run = run_allreduce(algo, in, count, dt, op, in_place, {}, 7);
            ASSERT_EQ(run.error, "") << algo << " n=" << n;
            for (int r = 1; r < n; ++r) {
              ASSERT_EQ(std::memcmp(run.out[0].data(), run.out[r].data(), count * dtype_size(dt)), 0)
                  << algo << ": rank " << r << " differs from rank 0, n=" << n << " count=" << count << " "
                  << dtype_name(dt) << " " << redop_name(op);
            }
            // Sanity against a double-precision reference (loose: fp32 rounding).
            if (dt == DataType::kFloat64 && op == RedOp::kSum) {
              for (size_t i = 0; i < count; ++i) {
                double ref = 0, got = 0;
                for (int r = 0; r < n; ++r) {
                  double v;
                  std::memcpy(&v, in[r].data() + i * 8, 8);
                  ref += v;
                }
                std::memcpy(&got, run.out[0].data() + i * 8, 8);
                ASSERT_NEAR(got, ref, 1e-9 * n * 1000) << algo << " n=" << n << " i=" << i;
              }
            }
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 1000u);
}

// Max and min let a NaN through only from their left operand, and a sum of
// two NaNs keeps the left one's payload: partners that each reduce the other's
// message must put the same one first (Step::incoming_first), or the ranks
// return different bits. Regression: recursive doubling reduces the
// partner's message as it arrives; with its operand order flipped on one side
// ranks disagree here (and nowhere in the finite-input test above).
TEST(AlgorithmProps, EveryAllreduceGivesIdenticalBitsWithNaNs) {
  size_t cases = 0;
  for (const std::string& algo : allreduce_algorithms()) {
    for (int n : {2, 3, 4, 5, 8}) {
      for (bool in_place : {false, true}) {
        for (RedOp op : {RedOp::kMax, RedOp::kMin, RedOp::kSum}) {
          const size_t count = 12;
          // float32: rank r holds a NaN of payload r + 1 in every element i
          // with (i + r) % 3 == 0, a finite value elsewhere.
          std::vector<std::vector<std::byte>> in(n, std::vector<std::byte>(count * 4));
          for (int r = 0; r < n; ++r)
            for (size_t i = 0; i < count; ++i) {
              const uint32_t bits = (i + static_cast<size_t>(r)) % 3 == 0
                                        ? 0x7fc00000u | static_cast<uint32_t>(r + 1)
                                        : std::bit_cast<uint32_t>(static_cast<float>(r) * 0.37f - static_cast<float>(i));
              std::memcpy(in[r].data() + i * 4, &bits, 4);
            }
          RunResult run = run_allreduce(algo, in, count, DataType::kFloat32, op, in_place);
          ASSERT_EQ(run.error, "") << algo << " n=" << n;
          for (int r = 1; r < n; ++r)
            ASSERT_EQ(std::memcmp(run.out[0].data(), run.out[r].data(), count * 4), 0)
                << algo << ": rank " << r << " differs from rank 0, n=" << n << " " << redop_name(op)
                << (in_place ? " in place" : "");
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 100u);
}

// The direct algorithms promise the sum in rank order 0, 1, ..., n-1.
TEST(AlgorithmProps, DirectAllreduceEqualsRankOrderReduction) {
  for (const char* algo : {"direct", "two_shot"}) {
    for (int n : {2, 3, 5, 8, 13}) {
      const size_t count = 301;
      auto in = random_inputs(n, count, DataType::kFloat32, RedOp::kSum, 77 + n);
      RunResult run = run_allreduce(algo, in, count, DataType::kFloat32, RedOp::kSum, false);
      ASSERT_EQ(run.error, "");
      std::vector<std::byte> ref(in[0]);
      for (int r = 1; r < n; ++r) kernels::reduce2(ref.data(), ref.data(), in[r].data(), count, DataType::kFloat32, RedOp::kSum);
      for (int r = 0; r < n; ++r)
        ASSERT_EQ(std::memcmp(ref.data(), run.out[r].data(), count * 4), 0) << algo << " n=" << n << " rank " << r;
    }
  }
}

TEST(AlgorithmProps, HierarchicalIsCorrectForHostLayouts) {
  const std::vector<std::vector<int>> layouts = {
      {0, 0, 1, 1},                    // two hosts, contiguous
      {0, 1, 0, 1, 0, 1},              // round robin
      {7, 7, 7, 3, 9, 9},              // uneven, arbitrary host ids
      {0, 1, 2, 3, 4},                 // one rank per host (odd count of hosts: fold)
      {0, 0, 0, 0, 0, 0, 0},           // one host
      {0, 0, 1, 1, 1, 2, 3, 3, 3, 3},  // four hosts, uneven
  };
  for (const auto& hosts : layouts) {
    const int n = static_cast<int>(hosts.size());
    for (int d = 0; d < kNumDataTypes; ++d) {
      for (int o = 0; o < kNumRedOps; ++o) {
        for (size_t count : {size_t{1}, size_t{17}, size_t{100}}) {
          const DataType dt = static_cast<DataType>(d);
          const RedOp op = static_cast<RedOp>(o);
          std::vector<std::vector<std::byte>> in(n, std::vector<std::byte>(count * dtype_size(dt)));
          for (int r = 0; r < n; ++r) testing::fill(in[r].data(), count, dt, op, r, n);
          RunResult run = run_allreduce("hierarchical", in, count, dt, op, (count + d) % 2, hosts);
          ASSERT_EQ(run.error, "");
          for (int r = 0; r < n; ++r) {
            std::string first;
            size_t wrong = testing::count_wrong_reduced(run.out[r].data(), count, dt, op, n, 0, &first);
            ASSERT_EQ(wrong, 0u) << "hosts " << fmt::format("{}", fmt::join(hosts, ",")) << " rank " << r << " "
                                 << dtype_name(dt) << " " << redop_name(op) << ": " << first;
          }
        }
      }
    }
    // Only leaders talk across hosts.
    RunResult run = run_allreduce("hierarchical", std::vector<std::vector<std::byte>>(n, std::vector<std::byte>(64)), 16,
                            DataType::kFloat32, RedOp::kSum, false, hosts);
    ASSERT_EQ(run.error, "");
    for (int r = 0; r < n; ++r) {
      bool leader = true;
      for (int q = 0; q < r; ++q) leader = leader && hosts[q] != hosts[r];
      for (const Phase& p : run.scheds[r].phases)
        for (const Step& s : p.steps)
          if (is_comm_step(s.kind) && hosts[s.peer] != hosts[r]) {
            EXPECT_TRUE(leader) << "rank " << r;
          }
    }
  }
}

// depth is the number of ancestors, counted by walking the parents; a tree
// of 2^20 positions has depth 20. Regression: btree_node asked btree_node for
// each ancestor, which computed that ancestor's depth again (2^depth calls per
// node): 4096 ranks spent seconds in the tuner at init, 2^20 never finished.
TEST(AlgorithmProps, BinaryTreeDepthCountsAncestors) {
  for (int n : {2, 3, 7, 64, 100, 4096, 5000}) {
    for (int i = 0; i < n; ++i) {
      int depth = 0;
      for (int p = patterns::btree_node(n, i).parent; p >= 0; p = patterns::btree_node(n, p).parent) ++depth;
      ASSERT_EQ(patterns::btree_node(n, i).depth, depth) << "n=" << n << " node " << i;
    }
  }
  EXPECT_EQ(patterns::btree_depth(1 << 20), 20);
}

TEST(AlgorithmProps, BinaryTreeShape) {
  for (int n = 1; n <= 70; ++n) {
    int roots = 0;
    const int bound = patterns::log2_exact(n);
    for (int i = 0; i < n; ++i) {
      patterns::TreeNode t = patterns::btree_node(n, i);
      if (t.parent < 0) ++roots;
      else {
        patterns::TreeNode p = patterns::btree_node(n, t.parent);
        EXPECT_TRUE(p.child[0] == i || p.child[1] == i) << "n=" << n << " node " << i << " parent " << t.parent;
      }
      for (int c : t.child)
        if (c >= 0) {
          EXPECT_EQ(patterns::btree_node(n, c).parent, i) << "n=" << n;
        }
      EXPECT_LE(t.depth, bound) << "n=" << n << " node " << i;
      if (n > 1 && i % 2 == 1) {
        EXPECT_TRUE(t.child[0] < 0 && t.child[1] < 0) << "odd positions are leaves";
      }
    }
    EXPECT_EQ(roots, 1) << "n=" << n;
  }
}

// The two trees of the double binary tree share at most one interior rank,
// so no rank forwards both halves (the point of the second tree).
TEST(AlgorithmProps, DoubleTreeInteriorsAreDisjoint) {
  for (int n = 3; n <= 40; ++n) {
    int both = 0;
    for (int r = 0; r < n; ++r) {
      CollArgs a = allreduce_args(n, r, 1000);
      a.chunk_elems = 1000;
      auto s = make_schedule(a, "tree");
      ASSERT_TRUE(s.is_ok());
      // Interior in a tree = reduces from a child in that half of the data.
      bool lo = false, hi = false;
      for (const Phase& p : s->phases)
        for (const Step& st : p.steps)
          if (st.kind == StepKind::kRecvReduce) (st.dst.offset < 500 ? lo : hi) = true;
      both += lo && hi;
    }
    EXPECT_LE(both, 1) << "n=" << n;
  }
}

TEST(AlgorithmProps, TreeIsPipelined) {
  // 100 chunks per half through a depth-3 tree: about 100 + 2*3 phases, not 100 * 6.
  const size_t count = 200;
  for (int r = 0; r < 8; ++r) {
    CollArgs a;
    a.coll = Collective::kAllReduce;
    a.count = count;
    a.nranks = 8;
    a.rank = r;
    a.chunk_elems = 1;
    auto s = make_schedule(a, "tree");
    ASSERT_TRUE(s.is_ok());
    EXPECT_LE(s->phases.size(), 100u + 2 * 3 + 2) << "rank " << r;
    EXPECT_GE(s->phases.size(), 100u) << "rank " << r;
  }
}

// Recursive doubling reduces the partner's message as it arrives, into a
// buffer the phase's send does not read: a single-copy send may be read by
// the partner until the phase ends, so no transfer of a phase may write what
// it sends (in place, the send and receive buffers are one). At 2 ranks out of place
// the whole allreduce is one exchange: no scratch, no local step.
TEST(AlgorithmProps, RecursiveDoublingNeverWritesWhatItsPhaseSends) {
  for (int n = 2; n <= 17; ++n) {
    for (bool in_place : {false, true}) {
      for (int r = 0; r < n; ++r) {
        CollArgs a = allreduce_args(n, r, 64);
        a.in_place = in_place;
        auto s = make_schedule(a, "hypercube");
        ASSERT_TRUE(s.is_ok()) << s.status().to_string();
        auto mem = [&](BufRef b) { return in_place && b.buf == kBufSend ? kBufRecv : b.buf; };
        for (const Phase& ph : s->phases) {
          for (const Step& snd : ph.steps) {
            if (snd.kind != StepKind::kSend) continue;
            for (const Step& w : ph.steps) {
              // Local steps run before the phase's transfers start (schedule.h).
              if (w.kind != StepKind::kRecv && w.kind != StepKind::kRecvReduce && !w.overlap) continue;
              const bool overlap = mem(w.dst) == mem(snd.src) && w.dst.offset < snd.src.offset + snd.count &&
                                   snd.src.offset < w.dst.offset + w.count;
              EXPECT_FALSE(overlap) << "n=" << n << " rank " << r << (in_place ? " in place" : "") << ": '"
                                    << describe(w) << "' writes what '" << describe(snd) << "' sends";
            }
          }
        }
        if (n == 2 && !in_place) {
          ASSERT_EQ(s->phases.size(), 1u);
          ASSERT_EQ(s->phases[0].steps.size(), 2u);
          EXPECT_EQ(s->phases[0].steps[1].kind, StepKind::kRecvReduce);
          EXPECT_EQ(s->phases[0].steps[1].dst.buf, kBufRecv);
          EXPECT_EQ(s->phases[0].steps[1].incoming_first, r == 1);
        }
      }
    }
  }
}

TEST(AlgorithmProps, RecursiveStepCounts) {
  auto phases = [](const char* algo, Collective c, int n, int r) {
    CollArgs a;
    a.coll = c;
    a.count = 64;
    a.nranks = n;
    a.rank = r;
    auto s = make_schedule(a, algo);
    EXPECT_TRUE(s.is_ok());
    size_t comm = 0;
    for (const Phase& p : s->phases) {
      bool any = false;
      for (const Step& st : p.steps) any = any || is_comm_step(st.kind);
      comm += any;
    }
    return comm;
  };
  for (int k = 1; k <= 4; ++k) {
    const int n = 1 << k;
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(phases("hypercube", Collective::kAllReduce, n, r), static_cast<size_t>(k));
      EXPECT_EQ(phases("rabenseifner", Collective::kAllReduce, n, r), static_cast<size_t>(2 * k));
      EXPECT_EQ(phases("hypercube", Collective::kAllGather, n, r), static_cast<size_t>(k));
      EXPECT_EQ(phases("rabenseifner", Collective::kReduceScatter, n, r), static_cast<size_t>(k));
    }
  }
  // n = 6: p2 = 4, ranks 0 and 2 fold into 1 and 3; folded pairs pay two extra steps.
  EXPECT_EQ(phases("hypercube", Collective::kAllReduce, 6, 0), 2u);
  EXPECT_EQ(phases("hypercube", Collective::kAllReduce, 6, 1), 4u);
  EXPECT_EQ(phases("hypercube", Collective::kAllReduce, 6, 5), 2u);
  for (int n : {5, 6, 7, 12, 13})
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(phases("bruck", Collective::kAllGather, n, r), static_cast<size_t>(patterns::log2_exact(n)));
}

// The direct all-gather forwards nothing: one phase in which rank r sends its
// own input to every peer and receives block j straight from rank j, once
// per peer, and copies its own block with an overlapped local step (skipped
// by the executor in place, where it is the identity).
TEST(AlgorithmProps, DirectAllGatherTakesEveryBlockFromItsOwner) {
  for (int n = 2; n <= 9; ++n) {
    for (bool in_place : {false, true}) {
      for (int r = 0; r < n; ++r) {
        CollArgs a;
        a.coll = Collective::kAllGather;
        a.count = 5;
        a.nranks = n;
        a.rank = r;
        a.in_place = in_place;
        auto s = make_schedule(a, "direct");
        ASSERT_TRUE(s.is_ok()) << s.status().to_string();
        ASSERT_EQ(s->phases.size(), 1u) << "n=" << n;
        std::vector<int> sent(n, 0), got(n, 0);
        int copies = 0;
        for (const Step& st : s->phases[0].steps) {
          if (st.kind == StepKind::kSend) {
            EXPECT_EQ(st.src.buf, kBufSend);
            EXPECT_EQ(st.src.offset, 0u);
            EXPECT_EQ(st.count, 5u);
            ++sent[st.peer];
          } else if (st.kind == StepKind::kRecv) {
            EXPECT_EQ(st.dst.buf, kBufRecv);
            EXPECT_EQ(st.dst.offset, static_cast<size_t>(st.peer) * 5) << "block of rank " << st.peer;
            ++got[st.peer];
          } else {
            ASSERT_EQ(st.kind, StepKind::kCopy);
            EXPECT_TRUE(st.overlap);
            EXPECT_EQ(st.dst.offset, static_cast<size_t>(r) * 5);
            ++copies;
          }
        }
        EXPECT_EQ(copies, 1);
        for (int j = 0; j < n; ++j) {
          EXPECT_EQ(sent[j], j == r ? 0 : 1) << "n=" << n << " rank " << r << " to " << j;
          EXPECT_EQ(got[j], j == r ? 0 : 1) << "n=" << n << " rank " << r << " from " << j;
        }
      }
    }
  }
}

TEST(AlgorithmProps, SupportsRejectsWhatItCannotServe) {
  CollArgs a;
  a.coll = Collective::kAllReduce;
  a.nranks = 4;
  a.count = (8u << 20) / 4;  // 8 MiB of float32: beyond one-shot's scratch budget
  EXPECT_EQ(make_schedule(a, "direct").status().code(), StatusCode::kNotSupported);
  EXPECT_TRUE(make_schedule(a, "two_shot").is_ok());
  a.count = 16;
  a.host_of_rank = {0, 0, 1};  // wrong length
  EXPECT_EQ(make_schedule(a, "hierarchical").status().code(), StatusCode::kNotSupported);
  a.host_of_rank = {0, 0, 1, 1};
  EXPECT_TRUE(make_schedule(a, "hierarchical").is_ok());
}

}  // namespace
}  // namespace loom
