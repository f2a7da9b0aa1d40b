// Every registered algorithm, for every collective, checked by the in-memory
// interpreter for nranks 1..17, odd and even counts, every op and every dtype,
// in and out of place, against closed-form expectations.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <array>
#include <random>

#include "algorithms/algorithms.h"
#include "algorithms/patterns.h"
#include "algorithms/interpreter.h"
#include "common/test_util.h"
#include "kernels/host_reduce.h"

namespace loom {
namespace {

using testing::count_wrong_copied;
using testing::count_wrong_reduced;
using testing::fill;

bool reduces(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduceScatter || c == Collective::kReduce;
}

// Runs `algo` for all ranks in memory and checks the result; returns "" or the failure.
// One rank's arguments for a collective of n ranks (root: rooted ones).
CollArgs rooted(Collective coll, int n, int rank, int root, size_t count) {
  CollArgs a;
  a.coll = coll;
  a.nranks = n;
  a.rank = rank;
  a.root = root;
  a.count = count;
  return a;
}

// hosts > 1: the ranks in that many contiguous blocks (CollArgs::host_of_rank).
std::string check(const Algorithm& algo, int n, size_t count, DataType dt, RedOp op, bool in_place, int root,
                  size_t chunk = 0, int hosts = 1) {
  const size_t es = dtype_size(dt);
  const Collective c = algo.coll;
  size_t send_count = count, recv_count = count;
  if (c == Collective::kReduceScatter) send_count = count * n;
  if (c == Collective::kAllGather) recv_count = count * n;
  if (c == Collective::kAllToAll) send_count = recv_count = count * n;
  const RedOp fill_op = reduces(c) ? op : RedOp::kSum;
  // The average of fp16 / bf16 / fp8 as CommImpl::run_sub runs it: inputs
  // pre-multiplied by T(1/n) into buffers of their own, summed out of place.
  const bool premul = reduces(c) && op == RedOp::kAvg && kernels::avg_premultiplies(dt);
  std::vector<std::vector<std::byte>> scaled(n);
  std::vector<std::vector<std::byte>> sendv(n), recvv(n);
  std::vector<RankSchedule> scheds;
  std::vector<std::vector<std::byte*>> bufs(n);
  // Exact element counts per buffer: the interpreter checks every reference
  // against them (the allocations are larger, for the in-place layouts).
  std::vector<std::vector<size_t>> elems(n);
  for (int r = 0; r < n; ++r) {
    sendv[r].assign(std::max<size_t>(1, send_count * es), std::byte{0});
    recvv[r].assign(std::max<size_t>(1, std::max(send_count, recv_count) * es), std::byte{0x7f});
    std::byte* s = sendv[r].data();
    std::byte* rv = recvv[r].data();
    if (in_place) {
      if (c == Collective::kReduceScatter) {
        fill(rv, send_count, dt, fill_op, r, n);
        s = rv;
        rv = rv + r * count * es;
      } else if (c == Collective::kAllGather) {
        fill(rv + r * count * es, count, dt, fill_op, r, n);
        s = rv + r * count * es;
      } else {
        fill(rv, send_count, dt, fill_op, r, n);
        s = rv;
      }
    } else {
      fill(s, send_count, dt, fill_op, r, n);
    }
    if (premul) {
      scaled[r].assign(s, s + send_count * es);
      s = scaled[r].data();
    }
    CollArgs a = rooted(c, n, r, root, count);
    a.dt = dt;
    a.op = premul ? RedOp::kSum : op;
    a.in_place = in_place && !premul;
    a.chunk_elems = chunk;
    if (hosts > 1)
      for (int q = 0; q < n; ++q) a.host_of_rank.push_back(q * hosts / n);
    if (c == Collective::kSendRecv) {
      a.p2p = {{true, (r + 1) % n, count}, {false, (r - 1 + n) % n, count}};
      bufs[r] = {nullptr, nullptr, nullptr, s, rv};
      elems[r] = {0, 0, 0, count, count};
    } else {
      bufs[r] = {s, rv};
      elems[r] = {send_count, recv_count};
    }
    auto sched = make_schedule(a, algo.name);
    if (!sched.is_ok()) return "make_schedule: " + sched.status().to_string();
    scheds.push_back(std::move(sched).value());
  }
  if (premul) testing::premultiply_avg(scaled, send_count, dt, op);
  Status st = interpret(scheds, bufs, dt, premul ? RedOp::kSum : op, elems);
  if (!st.is_ok()) return st.to_string();
  for (int r = 0; r < n; ++r) {
    std::string first;
    size_t wrong = 0;
    std::byte* out = c == Collective::kSendRecv ? bufs[r][kBufUser + 1] : bufs[r][kBufRecv];
    switch (c) {
      case Collective::kAllReduce: wrong = count_wrong_reduced(out, count, dt, op, n, 0, &first); break;
      case Collective::kReduceScatter: wrong = count_wrong_reduced(out, count, dt, op, n, r * count, &first); break;
      case Collective::kReduce:
        if (r == root) wrong = count_wrong_reduced(out, count, dt, op, n, 0, &first);
        break;
      case Collective::kBroadcast: wrong = count_wrong_copied(out, count, dt, fill_op, root, 0, &first); break;
      case Collective::kAllGather:
        for (int b = 0; b < n && !wrong; ++b)
          wrong = count_wrong_copied(out + b * count * es, count, dt, fill_op, b, 0, &first);
        break;
      case Collective::kAllToAll:
        for (int b = 0; b < n && !wrong; ++b)
          wrong = count_wrong_copied(out + b * count * es, count, dt, fill_op, b, r * count, &first);
        break;
      case Collective::kSendRecv:
        wrong = count_wrong_copied(out, count, dt, fill_op, (r - 1 + n) % n, 0, &first);
        break;
    }
    if (wrong) return fmt::format("rank {}: {} wrong; {}", r, wrong, first);
  }
  return "";
}

TEST(Schedules, EveryAlgorithmEveryShape) {
  size_t cases = 0;
  for (const Algorithm& algo : all_algorithms()) {
    for (int n = 1; n <= 17; ++n) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{16}, size_t{33}, size_t{100}}) {
        for (int d = 0; d < kNumDataTypes; ++d) {
          const int nops = reduces(algo.coll) ? kNumRedOps : 1;
          for (int o = 0; o < nops; ++o) {
            for (bool in_place : {false, true}) {
              if (algo.coll == Collective::kSendRecv && in_place) continue;
              int root = static_cast<int>((count + d + o) % n);
              // Small chunks so chain pipelines have many chunks in flight.
              std::string err = check(algo, n, count, static_cast<DataType>(d), static_cast<RedOp>(o), in_place, root, 3);
              ASSERT_EQ(err, "") << algo.name << " " << collective_name(algo.coll) << " n=" << n << " count=" << count
                                 << " " << dtype_name(static_cast<DataType>(d)) << " "
                                 << redop_name(static_cast<RedOp>(o)) << (in_place ? " in-place" : "") << " root=" << root;
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 10000u);
}

// Property test: random (algorithm, nranks, count, root, chunk) -> correct.
TEST(Schedules, RandomProperty) {
  std::mt19937_64 rng(12345);
  const auto& algos = all_algorithms();
  for (int iter = 0; iter < 300; ++iter) {
    const Algorithm& algo = algos[rng() % algos.size()];
    int n = 1 + static_cast<int>(rng() % 24);
    size_t count = rng() % 3000;
    DataType dt = static_cast<DataType>(rng() % kNumDataTypes);
    RedOp op = reduces(algo.coll) ? static_cast<RedOp>(rng() % kNumRedOps) : RedOp::kSum;
    bool in_place = algo.coll != Collective::kSendRecv && rng() % 2;
    int root = static_cast<int>(rng() % n);
    size_t chunk = 1 + rng() % 500;
    std::string err = check(algo, n, count, dt, op, in_place, root, chunk);
    ASSERT_EQ(err, "") << algo.name << " " << collective_name(algo.coll) << " n=" << n << " count=" << count << " "
                       << dtype_name(dt) << " " << redop_name(op) << " root=" << root << " chunk=" << chunk;
  }
}

// The interpreter itself must catch broken schedules, or the tests above prove nothing.
TEST(Interpreter, DetectsDeadlock) {
  // Both ranks receive first from each other in separate phases before sending.
  RankSchedule s0, s1;
  Step rcv;
  rcv.kind = StepKind::kRecv;
  rcv.count = 4;
  rcv.dst = {kBufRecv, 0};
  Step snd;
  snd.kind = StepKind::kSend;
  snd.count = 4;
  snd.src = {kBufSend, 0};
  rcv.peer = 1;
  snd.peer = 1;
  s0.phases = {Phase{{rcv}}, Phase{{snd}}};
  rcv.peer = 0;
  snd.peer = 0;
  s1.phases = {Phase{{rcv}}, Phase{{snd}}};
  std::vector<float> a(4), b(4), c(4), d(4);
  std::vector<std::vector<std::byte*>> bufs = {{reinterpret_cast<std::byte*>(a.data()), reinterpret_cast<std::byte*>(b.data())},
                                               {reinterpret_cast<std::byte*>(c.data()), reinterpret_cast<std::byte*>(d.data())}};
  Status st = interpret({s0, s1}, bufs, DataType::kFloat32, RedOp::kSum);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("deadlock"), std::string::npos) << st.to_string();
}

// Interprets one hand-written phase per rank for two ranks whose send and
// receive buffers are 8 floats each (float sum).
Status interpret_pair(const std::vector<Step>& rank0, const std::vector<Step>& rank1) {
  std::vector<float> a(8), b(8), c(8), d(8);
  auto p = [](std::vector<float>& v) { return reinterpret_cast<std::byte*>(v.data()); };
  return interpret({RankSchedule{{Phase{rank0}}, 0, "t"}, RankSchedule{{Phase{rank1}}, 0, "t"}},
                   {{p(a), p(b)}, {p(c), p(d)}}, DataType::kFloat32, RedOp::kSum);
}

TEST(Interpreter, DetectsSizeMismatchAndHazard) {
  Step snd{StepKind::kSend, 1, {kBufSend, 0}, {}, {}, 4};
  Step rcv{StepKind::kRecv, 0, {}, {}, {kBufRecv, 0}, 3};
  Status st = interpret_pair({snd}, {rcv});
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("matched a message of 4"), std::string::npos) << st.to_string();

  // A send reading what a receive of the same phase writes.
  Step snd2{StepKind::kSend, 1, {kBufRecv, 0}, {}, {}, 4};
  Step rcv2{StepKind::kRecv, 1, {}, {}, {kBufRecv, 2}, 4};
  Step snd3{StepKind::kSend, 0, {kBufSend, 0}, {}, {}, 4};
  Step rcv3{StepKind::kRecv, 0, {}, {}, {kBufRecv, 0}, 4};
  st = interpret_pair({snd2, rcv2}, {snd3, rcv3});
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("overlaps"), std::string::npos) << st.to_string();
}

// A send's peer_reduces flag tells the transport how its receiver takes the
// message (shm picks the path from it on one end and from the step kind on
// the other): a send into a recv_reduce without it, or a flagged send into a
// plain recv, is rejected; matching ones pass.
TEST(Interpreter, ChecksThatSendAndReceiveAgreeOnReduction) {
  Step snd{StepKind::kSend, 1, {kBufSend, 0}, {}, {}, 4};
  Step rcv{StepKind::kRecv, 0, {}, {}, {kBufRecv, 0}, 4};
  Step rrd{StepKind::kRecvReduce, 0, {kBufSend, 0}, {}, {kBufRecv, 0}, 4};
  auto run = [](const Step& s, const Step& r) { return interpret_pair({s}, {r}); };
  Status st = run(snd, rrd);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("not marked peer_reduces"), std::string::npos) << st.to_string();
  Step flagged = snd;
  flagged.peer_reduces = true;
  st = run(flagged, rcv);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("wrongly marked peer_reduces"), std::string::npos) << st.to_string();
  EXPECT_TRUE(run(flagged, rrd).is_ok());
  EXPECT_TRUE(run(snd, rcv).is_ok());
}

// Step::announced moves a message's header threshold on both ends (shm),
// each end from its own step: a send and its receive must carry the same.
TEST(Interpreter, ChecksThatSendAndReceiveAgreeOnAnnouncement) {
  Step snd{StepKind::kSend, 1, {kBufSend, 0}, {}, {}, 4};
  Step rcv{StepKind::kRecv, 0, {}, {}, {kBufRecv, 0}, 4};
  Step asnd = snd, arcv = rcv;
  asnd.announced = arcv.announced = true;
  Status st = interpret_pair({asnd}, {rcv});
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("marked announced, the receive not"), std::string::npos) << st.to_string();
  st = interpret_pair({snd}, {arcv});
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("not marked announced, the receive is"), std::string::npos) << st.to_string();
  EXPECT_TRUE(interpret_pair({asnd}, {arcv}).is_ok());
}

// An overlapped copy (Step::overlap) runs while the phase's transfers are in
// flight: writing what a send reads, or reading what a receive writes, is a
// race the interpreter must reject; a copy clear of them is accepted.
TEST(Interpreter, ChecksOverlappedCopies) {
  std::vector<float> a = {0, 1, 2, 3, 4, 5, 6, 7}, b(8), c(8, 2.0f), d(8);
  auto p = [](std::vector<float>& v) { return reinterpret_cast<std::byte*>(v.data()); };
  std::vector<std::vector<std::byte*>> bufs = {{p(a), p(b)}, {p(c), p(d)}};
  auto run = [&](Step copy0) {
    Step snd0{StepKind::kSend, 1, {kBufRecv, 0}, {}, {}, 4};
    Step rcv0{StepKind::kRecv, 1, {}, {}, {kBufRecv, 4}, 4};
    Step snd1{StepKind::kSend, 0, {kBufSend, 0}, {}, {}, 4};
    Step rcv1{StepKind::kRecv, 0, {}, {}, {kBufRecv, 0}, 4};
    copy0.overlap = true;
    return interpret({RankSchedule{{Phase{{copy0, snd0, rcv0}}}, 0, "t"}, RankSchedule{{Phase{{snd1, rcv1}}}, 0, "t"}},
                     bufs, DataType::kFloat32, RedOp::kSum);
  };
  // Writes recv[0..4), which the send of the same phase reads.
  Status st = run(Step{StepKind::kCopy, -1, {kBufSend, 0}, {}, {kBufRecv, 0}, 4});
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("overlapped"), std::string::npos) << st.to_string();
  // Reads recv[4..8), which the receive of the same phase writes.
  st = run(Step{StepKind::kCopy, -1, {kBufRecv, 4}, {}, {kBufSend, 4}, 4});
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("overlapped"), std::string::npos) << st.to_string();
  // Clear of both: fine, and it copies.
  st = run(Step{StepKind::kCopy, -1, {kBufSend, 0}, {}, {kBufSend, 4}, 4});
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(a[4], 0.0f);
  EXPECT_EQ(a[7], 3.0f);
}

// Recursive halving reduce_scatter: a rank whose core has one member reduces
// its last exchange straight into the output, as the ring does; only a folded
// core (two members, non-power-of-two counts) copies its block out of scratch.
// Regression: every rank copied its block from scratch at the end, a copy of
// n/2 per rank at 2 ranks (2-rank halving 2 MiB 343-358 us, ring 260-269;
// 255-279 without the copy). Correctness of both forms: the matrix above.
TEST(Schedules, HalvingReduceScatterEndsInTheOutput) {
  auto local_copies = [](const RankSchedule& s) {
    int k = 0;
    for (const Phase& p : s.phases)
      for (const Step& st : p.steps) k += st.kind == StepKind::kCopy;
    return k;
  };
  for (int n : {2, 3, 4, 6, 8}) {
    for (int r = 0; r < n; ++r) {
      CollArgs a;
      a.coll = Collective::kReduceScatter;
      a.nranks = n;
      a.rank = r;
      a.count = 1000;
      auto s = make_schedule(a, "rabenseifner");
      ASSERT_TRUE(s.is_ok()) << s.status().to_string();
      const int p2 = 1 << (31 - __builtin_clz(static_cast<unsigned>(n)));
      const int extra = n - p2;
      const bool folded_core = r < 2 * extra && r % 2 == 1;  // receives its even neighbour's data
      EXPECT_EQ(local_copies(*s), folded_core ? 1 : 0) << "n=" << n << " rank " << r;
    }
  }
}

// The binomial broadcast pipelines: with chunks, an inner rank forwards the
// first chunk before the last one has arrived (whole-message steps left the
// forwarding ranks idle until their receive completed: 8 ranks on 2 cores,
// 16 MiB, 9516 us against 7611 in 256 KiB chunks, algorithms.md run 18).
// With one chunk it is the classic binomial tree: the root sends lg p times.
TEST(Schedules, BinomialBroadcastForwardsChunkByChunk) {
  auto make = [](int r, size_t chunk) {
    CollArgs a = rooted(Collective::kBroadcast, 8, r, 0, 1000);
    a.chunk_elems = chunk;
    auto s = make_schedule(a, "binomial");
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    return std::move(s).value();
  };
  // (phase of the first send, phase of the last receive, sends, receives)
  auto shape = [](const RankSchedule& s) {
    int first_send = -1, last_recv = -1, sends = 0, recvs = 0;
    for (size_t i = 0; i < s.phases.size(); ++i)
      for (const Step& st : s.phases[i].steps) {
        if (st.kind == StepKind::kSend) {
          if (first_send < 0) first_send = static_cast<int>(i);
          ++sends;
        }
        if (st.kind == StepKind::kRecv) {
          last_recv = static_cast<int>(i);
          ++recvs;
        }
      }
    return std::array<int, 4>{first_send, last_recv, sends, recvs};
  };
  auto root = shape(make(0, 1000));
  EXPECT_EQ(root[2], 3) << "whole message: one send per child (1, 2, 4)";
  auto one = shape(make(1, 1000));
  EXPECT_EQ(one[2], 2) << "rank 1 forwards to 3 and 5";
  EXPECT_GT(one[0], one[1]) << "whole message: forwards after its receive";
  root = shape(make(0, 250));
  EXPECT_EQ(root[2], 12) << "4 chunks to each of 3 children";
  one = shape(make(1, 250));
  EXPECT_EQ(one[3], 4);
  EXPECT_EQ(one[2], 8);
  EXPECT_LT(one[0], one[1]) << "chunked: the first forward precedes the last receive";
  auto leaf = shape(make(7, 250));
  EXPECT_EQ(leaf[2], 0);
  EXPECT_EQ(leaf[3], 4);
}

// The interpreter's result of `algo` for every rank count and count given,
// in chunks (slices, columns) of 1 - 600 elements, in and out of place.
void expect_correct_in_chunks(Collective coll, const char* algo, std::initializer_list<int> ranks,
                              std::initializer_list<size_t> counts, RedOp op) {
  for (int n : ranks)
    for (size_t count : counts)
      for (size_t chunk : {size_t{1}, size_t{7}, size_t{100}, size_t{600}})
        for (bool in_place : {false, true})
          EXPECT_EQ(check(*find_algorithm(coll, algo), n, count, DataType::kFloat32, op, in_place, 0, chunk), "")
              << algo << " " << collective_name(coll) << " n " << n << " count " << count << " chunk " << chunk
              << (in_place ? " in place" : "");
}

// Rank r's allreduce schedule of `algo` on n ranks, in chunks of `chunk` elements.
RankSchedule allreduce_schedule(const char* algo, int n, int r, size_t count, size_t chunk, RedOp op) {
  CollArgs a = rooted(Collective::kAllReduce, n, r, 0, count);
  a.chunk_elems = chunk;
  a.op = op;
  auto s = make_schedule(a, algo);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? std::move(s).value() : RankSchedule{};
}

// The ring allreduce in slices: at 2 ranks phase j sends slice j of its
// block raw and reduces slice j of the peer's, and forwards slice j-1 of the
// reduced block from where the reduce just wrote it (while it is in cache),
// so the reduced half is never re-read whole. One slice: the classic two
// phases (2(n-1) at n ranks). Correctness for every shape and rank count:
// EveryAlgorithmEveryShape (chunk 3) and the loop at the end.
TEST(Schedules, RingForwardsEachReducedSliceInTheNextPhase) {
  auto make = [](int r, size_t count, size_t chunk, RedOp op) {
    return allreduce_schedule("ring", 2, r, count, chunk, op);
  };
  // count 1001: rank 0 owns [0, 501), rank 1 [501, 1001); slices of 100.
  for (int r = 0; r < 2; ++r) {
    const RankSchedule s = make(r, 1001, 100, RedOp::kAvg);
    const size_t theirs_off = r == 0 ? 501 : 0, theirs_len = r == 0 ? 500 : 501;
    const size_t slices = 6;  // ceil(501 / 100)
    ASSERT_EQ(s.phases.size(), slices + 1);
    size_t divided = 0, forwarded = 0;
    for (size_t j = 0; j < s.phases.size(); ++j) {
      int sends = 0, recvs = 0, reduces = 0;
      for (const Step& st : s.phases[j].steps) {
        if (st.kind == StepKind::kDivide) divided += st.count;
        if (st.kind == StepKind::kRecvReduce) {
          ++reduces;
          EXPECT_EQ(st.dst.offset, theirs_off + j * 100) << "phase " << j << " reduces slice " << j;
        }
        if (st.kind == StepKind::kRecv) ++recvs;
        if (st.kind != StepKind::kSend) continue;
        ++sends;
        if (st.src.buf == kBufRecv) {
          // The forward of the slice the previous phase reduced.
          ASSERT_GT(j, 0u);
          EXPECT_EQ(st.src.offset, theirs_off + (j - 1) * 100) << "phase " << j;
          forwarded += st.count;
        }
      }
      EXPECT_EQ(reduces, j < slices && theirs_off + j * 100 < theirs_off + theirs_len ? 1 : 0) << "phase " << j;
      EXPECT_LE(sends, 2);
      EXPECT_LE(recvs, 1);
    }
    EXPECT_EQ(forwarded, theirs_len) << "the whole reduced block goes back, slice by slice";
    EXPECT_EQ(divided, theirs_len) << "avg divides each reduced element once";
  }
  // One slice (chunk >= block): reduce-scatter then all-gather, two phases.
  EXPECT_EQ(make(0, 1001, 501, RedOp::kSum).phases.size(), 2u);
  EXPECT_EQ(make(1, 1001, 4096, RedOp::kSum).phases.size(), 2u);
  // n ranks, whole blocks: 2(n-1) phases; k slices: k + 2(n-1) - 1.
  for (int n : {3, 5}) {
    CollArgs a = rooted(Collective::kAllReduce, n, 1, 0, 1000);
    a.chunk_elems = 1000;
    EXPECT_EQ(make_schedule(a, "ring")->phases.size(), 2u * (n - 1)) << n;
    a.chunk_elems = 50;  // blocks of 200 (n = 5) or 333-334 (n = 3)
    EXPECT_EQ(make_schedule(a, "ring")->phases.size(), (n == 5 ? 4u : 7u) + 2 * (n - 1) - 1) << n;
  }
  expect_correct_in_chunks(Collective::kAllReduce, "ring", {2, 3, 4, 7}, {1, 2, 999, 1001}, RedOp::kAvg);
}

// Rabenseifner in columns (rabenseifner_allreduce): column i (piece i of
// every block) takes its 2 log2(p2) steps in phases i .. i + 2 log2(p2) - 1,
// so every element a phase sends from the output was written or sent by this
// rank in the phase before (still in its cache), and each block's piece is
// reduced once, received once. One column: the plain algorithm, one message
// each way per step.
TEST(Schedules, RabenseifnerSendsWhatThePreviousPhaseTouched) {
  auto make = [](int n, int r, size_t count, size_t chunk, RedOp op = RedOp::kSum) {
    return allreduce_schedule("rabenseifner", n, r, count, chunk, op);
  };
  // 4 ranks, 1000 elements: blocks of 250, columns of 100 (3 columns).
  for (int r = 0; r < 4; ++r) {
    const size_t count = 1000;
    const RankSchedule s = make(4, r, count, 100, RedOp::kAvg);
    ASSERT_EQ(s.phases.size(), 3u + 4 - 1);
    std::vector<int> touched_prev(count, 0), reduced(count, 0), received(count, 0), divided(count, 0);
    for (size_t t = 0; t < s.phases.size(); ++t) {
      std::vector<int> touched(count, 0);
      for (const Step& st : s.phases[t].steps) {
        ASSERT_LE(st.count, 100u) << "phase " << t << ": one piece of one block per message";
        for (size_t e = 0; e < st.count; ++e) {
          if (st.kind == StepKind::kSend) {
            if (st.src.buf == kBufRecv) {
              ASSERT_TRUE(touched_prev[st.src.offset + e]) << "phase " << t << " sends " << st.src.offset + e;
            }
            touched[st.src.offset + e] = 1;
          }
          if (st.kind == StepKind::kRecvReduce) reduced[st.dst.offset + e]++, touched[st.dst.offset + e] = 1;
          if (st.kind == StepKind::kRecv) received[st.dst.offset + e]++, touched[st.dst.offset + e] = 1;
          if (st.kind == StepKind::kDivide) divided[st.dst.offset + e]++, touched[st.dst.offset + e] = 1;
        }
      }
      touched_prev = touched;
    }
    // Block r: reduced in both halving steps, divided once, never received;
    // its partner's block (r ^ 1) reduced once, then received; the other
    // half received.
    for (size_t e = 0; e < count; ++e) {
      const int b = static_cast<int>(e / 250);
      ASSERT_EQ(reduced[e], b == r ? 2 : b == (r ^ 1) ? 1 : 0) << "rank " << r << " element " << e;
      ASSERT_EQ(received[e], b == r ? 0 : 1) << "rank " << r << " element " << e;
      ASSERT_EQ(divided[e], b == r ? 1 : 0) << "rank " << r << " element " << e;
    }
  }
  // reduce_scatter's halving alike: 4 ranks, blocks of 250, columns of 100;
  // what a phase sends from the working copy (scratch) it reduced in the
  // phase before; this rank's block lands in the output, reduced twice.
  for (int r = 0; r < 4; ++r) {
    CollArgs a = rooted(Collective::kReduceScatter, 4, r, 0, 250);
    a.chunk_elems = 100;
    auto rs = make_schedule(a, "rabenseifner");
    ASSERT_TRUE(rs.is_ok());
    ASSERT_EQ(rs->phases.size(), 3u + 2 - 1);
    std::vector<int> reduced_prev(1000, 0), in_output(250, 0);
    for (size_t t = 0; t < rs->phases.size(); ++t) {
      std::vector<int> reduced(1000, 0);
      for (const Step& st : rs->phases[t].steps) {
        ASSERT_LE(st.count, 100u);
        for (size_t e = 0; e < st.count; ++e) {
          if (st.kind == StepKind::kSend && st.src.buf == kBufScratch) {
            ASSERT_TRUE(reduced_prev[st.src.offset + e]) << "phase " << t;
          }
          if (st.kind == StepKind::kRecvReduce && st.dst.buf == kBufScratch) reduced[st.dst.offset + e] = 1;
          if (st.kind == StepKind::kRecvReduce && st.dst.buf == kBufRecv) in_output[st.dst.offset + e]++;
        }
      }
      reduced_prev = reduced;
    }
    for (size_t e = 0; e < 250; ++e) ASSERT_EQ(in_output[e], 1) << "rank " << r << " element " << e;
  }
  // One column: one message each way per step, 2 log2(p2) phases.
  for (int n : {2, 4, 8}) {
    const RankSchedule s = make(n, 1, 1000, 1000);
    int l2 = 0;
    while ((2 << l2) <= n) ++l2;
    ASSERT_EQ(s.phases.size(), 2u * l2) << n;
    for (const Phase& p : s.phases) EXPECT_EQ(p.steps.size(), 2u) << n;
  }
  // k columns: k + 2 log2(p2) - 1 phases (8 ranks, blocks of 125: 3 columns of 50).
  EXPECT_EQ(make(8, 3, 1000, 50).phases.size(), 3u + 6 - 1);
  for (Collective coll : {Collective::kAllReduce, Collective::kReduceScatter})
    expect_correct_in_chunks(coll, "rabenseifner", {2, 3, 4, 6, 8}, {1, 7, 999, 1001}, RedOp::kAvg);
}

// Recursive-doubling all_gather in columns (hypercube_all_gather): at 4
// ranks in 3 columns every element a phase sends from the output was
// received in the phase before (the own block goes from the input first,
// then from the output after the overlapped copy), and each peer's block is
// received once. One column: one message each way per step.
TEST(Schedules, HypercubeAllGatherSendsWhatThePreviousPhaseReceived) {
  const size_t c = 250;  // per rank; columns of 100
  for (int r = 0; r < 4; ++r) {
    CollArgs a = rooted(Collective::kAllGather, 4, r, 0, c);
    a.chunk_elems = 100;
    auto s = make_schedule(a, "hypercube");
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    ASSERT_EQ(s->phases.size(), 3u + 2 - 1);
    std::vector<int> received_prev(4 * c, 0), received(4 * c, 0);
    for (size_t t = 0; t < s->phases.size(); ++t) {
      std::vector<int> now(4 * c, 0);
      for (const Step& st : s->phases[t].steps) {
        if (is_comm_step(st.kind)) {
          ASSERT_LE(st.count, 100u) << "phase " << t << ": one piece of one block per message";
        }
        for (size_t e = 0; e < st.count; ++e) {
          if (st.kind == StepKind::kSend && st.src.buf == kBufRecv) {
            const size_t at = st.src.offset + e;
            ASSERT_TRUE(received_prev[at] || at / c == static_cast<size_t>(r)) << "phase " << t << " sends " << at;
          }
          if (st.kind == StepKind::kRecv) now[st.dst.offset + e] = 1, received[st.dst.offset + e]++;
        }
      }
      received_prev = now;
    }
    for (size_t e = 0; e < 4 * c; ++e)
      ASSERT_EQ(received[e], e / c == static_cast<size_t>(r) ? 0 : 1) << "rank " << r << " element " << e;
  }
  CollArgs one = rooted(Collective::kAllGather, 8, 5, 0, c);
  one.chunk_elems = c;
  auto s = make_schedule(one, "hypercube");
  ASSERT_TRUE(s.is_ok());
  ASSERT_EQ(s->phases.size(), 3u);
  for (const Phase& p : s->phases) {
    int comm = 0;
    for (const Step& st : p.steps) comm += is_comm_step(st.kind) ? 1 : 0;
    EXPECT_EQ(comm, 2);
  }
  expect_correct_in_chunks(Collective::kAllGather, "hypercube", {2, 3, 4, 6, 8}, {1, 7, 999}, RedOp::kSum);
}

// The binomial reduce goes far-first on one host: with more ranks than cores
// (rank r on core r mod cores) the near-first tree's receivers all share the
// root's parity, so one of 2 cores did 10 of an 8-rank reduce's 14 message
// ends (the chain splits them 7 / 7) and the tuner rightly preferred the
// chain, measured 1.2-2.1x slower than a balanced tree at 8 B - 16 KiB.
// Across hosts (ranks in blocks) it stays near-first: one message per host
// boundary instead of a block's worth.
TEST(Schedules, BinomialReduceSplitsWorkAcrossCoresOnOneHost) {
  auto ends = [](int n, int root, int hosts) {
    std::array<int, 2> by_parity{0, 0};  // message ends on even / odd ranks
    int crossing = 0;                     // sends to another host
    for (int r = 0; r < n; ++r) {
      CollArgs a = rooted(Collective::kReduce, n, r, root, 64);
      if (hosts > 1)
        for (int q = 0; q < n; ++q) a.host_of_rank.push_back(q * hosts / n);
      auto s = make_schedule(a, "binomial");
      EXPECT_TRUE(s.is_ok()) << s.status().to_string();
      if (!s.is_ok()) continue;
      for (const Phase& ph : s->phases)
        for (const Step& st : ph.steps) {
          if (st.kind != StepKind::kSend && st.kind != StepKind::kRecv && st.kind != StepKind::kRecvReduce) continue;
          ++by_parity[static_cast<size_t>(r % 2)];
          if (st.kind == StepKind::kSend && hosts > 1 && st.peer * hosts / n != r * hosts / n) ++crossing;
        }
    }
    return std::make_pair(by_parity, crossing);
  };
  for (int root : {0, 3}) {
    auto [one_host, c1] = ends(8, root, 1);
    EXPECT_EQ(one_host[0], 7) << "root " << root;
    EXPECT_EQ(one_host[1], 7) << "root " << root;
    auto [four, c4] = ends(4, root, 1);
    EXPECT_EQ(four[0], 3) << "root " << root;
    EXPECT_EQ(four[1], 3) << "root " << root;
  }
  // Root 0, two hosts of 4 ranks: near-first, only 4 -> 0 crosses.
  auto [two_hosts, crossing] = ends(8, 0, 2);
  EXPECT_EQ(crossing, 1);
  EXPECT_EQ(two_hosts[0], 10) << "near-first: every receive on the root's parity";
  // Oversubscribed, partial sums (sends from scratch) stay in the FIFO; a
  // leaf's send from its input is left to the transport either way.
  for (bool over : {false, true})
    for (int r : {1, 3}) {  // 4 ranks far-first: 1 sends a partial sum, 3 its input
      CollArgs a = rooted(Collective::kReduce, 4, r, 0, 64);
      a.oversubscribed = over;
      auto s = make_schedule(a, "binomial");
      ASSERT_TRUE(s.is_ok());
      int sends = 0;
      for (const Phase& ph : s->phases)
        for (const Step& st : ph.steps)
          if (st.kind == StepKind::kSend) {
            ++sends;
            EXPECT_EQ(st.src.buf == kBufScratch, r == 1);
            EXPECT_EQ(st.unmapped, over && r == 1) << "rank " << r << (over ? " oversubscribed" : "");
          }
      EXPECT_EQ(sends, 1);
    }
  // Both orientations reduce correctly (the matrix above runs one host only).
  for (int n = 1; n <= 17; ++n)
    for (int root : {0, n / 2, n - 1})
      for (bool in_place : {false, true}) {
        std::string err = check(*find_algorithm(Collective::kReduce, "binomial"), n, 33, DataType::kFloat32,
                                RedOp::kSum, in_place, root, 0, 2);
        ASSERT_EQ(err, "") << "two hosts, n=" << n << " root=" << root << (in_place ? " in place" : "");
      }
}

// The in-band fingerprint rides on the first message of an op between two
// ranks (diag/fingerprint.h). Which messages those are is marked once per
// schedule (Step::first_contact, mark_first_contacts) instead of tracked per
// op by the executor; both ends must mark the same message: rank r's first
// send to p is the message p's first receive from r reads. For every
// algorithm and shape: exactly one marked send per (rank, peer) it sends
// anything to and one marked receive per peer it receives from, each the
// first such transfer in the executor's order, and each marked send paired
// with a marked receive on the peer (sends and receives between two ranks
// happen in the same order on both ends, so the first meets the first).
TEST(Schedules, FingerprintMarksTheFirstTransferBetweenTwoRanks) {
  size_t checked = 0;
  for (const Algorithm& algo : all_algorithms()) {
    for (int n = 2; n <= 9; ++n) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{100}}) {
        std::vector<RankSchedule> scheds;
        bool supported = true;
        for (int r = 0; r < n && supported; ++r) {
          CollArgs a = rooted(algo.coll, n, r, n - 1, count);
          a.chunk_elems = 3;
          if (algo.coll == Collective::kSendRecv) a.p2p = {{true, (r + 1) % n, count}, {false, (r + n - 1) % n, count}};
          if (!algo.supports(a).is_ok()) {
            supported = false;
            break;
          }
          auto s = make_schedule(a, algo.name);
          ASSERT_TRUE(s.is_ok()) << algo.name << " n=" << n << ": " << s.status().to_string();
          ASSERT_TRUE(s->contacts_marked) << algo.name;
          scheds.push_back(std::move(*s));
        }
        if (!supported) continue;
        // first[r][p]: rank r's first send to p (kind 0) / receive from p (kind 1),
        // as (phase, step) in execution order; marked[..]: the marked one.
        using Pos = std::pair<int, int>;
        const Pos none{-1, -1};
        std::vector<std::vector<std::array<Pos, 2>>> first(n, std::vector<std::array<Pos, 2>>(n, {none, none}));
        auto marked = first;
        for (int r = 0; r < n; ++r)
          for (size_t ph = 0; ph < scheds[r].phases.size(); ++ph)
            for (size_t i = 0; i < scheds[r].phases[ph].steps.size(); ++i) {
              const Step& st = scheds[r].phases[ph].steps[i];
              const Pos at{static_cast<int>(ph), static_cast<int>(i)};
              if (!is_comm_step(st.kind)) {
                EXPECT_FALSE(st.first_contact) << algo.name << ": a local step is marked";
                continue;
              }
              const int k = st.kind == StepKind::kSend ? 0 : 1;
              if (st.count == 0) {
                EXPECT_FALSE(st.first_contact) << algo.name << ": an empty transfer sends no header";
                continue;
              }
              if (first[r][st.peer][k] == none) first[r][st.peer][k] = at;
              if (st.first_contact) {
                EXPECT_EQ(marked[r][st.peer][k], none) << algo.name << " n=" << n << " rank " << r << ": two marks";
                marked[r][st.peer][k] = at;
              }
            }
        for (int r = 0; r < n; ++r)
          for (int p = 0; p < n; ++p) {
            for (int k = 0; k < 2; ++k)
              EXPECT_EQ(marked[r][p][k], first[r][p][k])
                  << algo.name << " n=" << n << " count=" << count << " rank " << r << " peer " << p << " kind " << k;
            EXPECT_EQ(marked[r][p][0] != none, marked[p][r][1] != none)
                << algo.name << " n=" << n << " count=" << count << ": rank " << r << "'s first send to " << p
                << " has no first receive there";
            ++checked;
          }
      }
    }
  }
  EXPECT_GT(checked, 5000u);

  // By hand: empty transfers and local steps carry nothing; the marks move
  // to the next transfer in order; marking again gives the same marks.
  RankSchedule s;
  auto step = [](StepKind k, int peer, size_t count) {
    Step st;
    st.kind = k;
    st.peer = k == StepKind::kCopy ? -1 : peer;
    st.count = count;
    return st;
  };
  s.phases.push_back(Phase{{step(StepKind::kCopy, 0, 4), step(StepKind::kSend, 1, 0), step(StepKind::kRecv, 1, 4)}});
  s.phases.push_back(Phase{{step(StepKind::kSend, 1, 4), step(StepKind::kRecvReduce, 1, 4), step(StepKind::kSend, 2, 4)}});
  s.phases.push_back(Phase{{step(StepKind::kSend, 1, 4), step(StepKind::kRecv, 2, 4)}});
  for (int pass = 0; pass < 2; ++pass) {
    mark_first_contacts(s);
    EXPECT_TRUE(s.contacts_marked);
    const std::vector<std::vector<bool>> want = {{false, false, true}, {true, false, true}, {false, true}};
    for (size_t ph = 0; ph < want.size(); ++ph)
      for (size_t i = 0; i < want[ph].size(); ++i)
        EXPECT_EQ(s.phases[ph].steps[i].first_contact, want[ph][i]) << "pass " << pass << " phase " << ph << " step " << i;
  }
}

// Send/recv: every message carries a fingerprint, since the two ends may
// group the messages between them differently (mark_first_contacts'
// every_message; regression tests Groups.*GroupsTwoMessages* in inproc).
TEST(Schedules, FingerprintOnEverySendRecvMessage) {
  CollArgs a;
  a.coll = Collective::kSendRecv;
  a.nranks = 3;
  a.rank = 0;
  a.dt = DataType::kInt32;
  a.p2p = {{true, 1, 5}, {true, 1, 7}, {false, 2, 3}, {false, 2, 0}, {false, 2, 4}, {true, 0, 2}, {false, 0, 2}};
  auto s = make_schedule(a);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  ASSERT_TRUE(s->contacts_marked);
  int sends = 0, recvs = 0;
  for (const Phase& ph : s->phases)
    for (const Step& st : ph.steps) {
      if (!is_comm_step(st.kind)) {
        EXPECT_FALSE(st.first_contact);
        continue;
      }
      EXPECT_EQ(st.first_contact, st.count > 0) << describe(st);
      (st.kind == StepKind::kSend ? sends : recvs) += st.first_contact;
    }
  EXPECT_EQ(sends, 2);  // both messages to rank 1 (the one to itself is a copy)
  EXPECT_EQ(recvs, 2);  // the two non-empty ones from rank 2
}

// RankSchedule::single_exchange (Executor::run_exchange's short path) marks
// exactly the schedules whose only communication is one send and one
// receive with one peer in the first phase: the 2-rank allreduce (in place:
// a copy out of scratch follows), not a schedule of two exchanges, a
// one-way transfer or a send/recv group.
TEST(Schedules, SingleExchangeMarksOnlyOneSendAndOneReceive) {
  auto marked = [](Collective coll, const char* algo, int n, bool in_place, size_t count = 2) {
    CollArgs a = rooted(coll, n, 1, 0, count);
    a.dt = DataType::kInt32;
    a.in_place = in_place;
    auto s = make_schedule(a, algo);
    EXPECT_TRUE(s.is_ok()) << algo << ": " << s.status().to_string();
    if (!s.is_ok()) return false;
    if (s->single_exchange) {  // what run_exchange relies on
      EXPECT_EQ(s->phases[0].steps.size(), 2u);
      EXPECT_EQ(s->phases[0].steps[0].kind, StepKind::kSend);
      EXPECT_TRUE(is_comm_step(s->phases[0].steps[1].kind));
      for (size_t i = 1; i < s->phases.size(); ++i)
        for (const Step& st : s->phases[i].steps) EXPECT_FALSE(is_comm_step(st.kind)) << describe(st);
    }
    return s->single_exchange;
  };
  EXPECT_TRUE(marked(Collective::kAllReduce, "hypercube", 2, false));
  EXPECT_TRUE(marked(Collective::kAllReduce, "hypercube", 2, true));  // + a copy phase
  EXPECT_TRUE(marked(Collective::kAllReduce, "direct", 2, false));
  EXPECT_FALSE(marked(Collective::kAllReduce, "hypercube", 4, false));  // two exchanges
  EXPECT_FALSE(marked(Collective::kAllReduce, "hypercube", 3, false));  // the folded rank 1: three
  EXPECT_FALSE(marked(Collective::kAllReduce, "ring", 2, false));       // reduce-scatter, then all-gather
  EXPECT_FALSE(marked(Collective::kBroadcast, "binomial", 2, false));   // rank 1 only receives
  EXPECT_FALSE(marked(Collective::kAllReduce, "hypercube", 2, false, 0));  // nothing to send
  CollArgs p;
  p.coll = Collective::kSendRecv;
  p.nranks = 2;
  p.rank = 0;
  p.p2p = {{true, 1, 4}, {false, 1, 4}};
  auto s = make_schedule(p);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_FALSE(s->single_exchange);  // a fingerprint per message: not the collective header
}

// RankSchedule::short_path (Executor::run_short) marks the schedules whose
// every transfer is its peer's only one in its direction (so each carries
// the op's fingerprint), with at most kShortPathMaxTransfers per phase and
// no single exchange (run_exchange's). Binomial and
// direct broadcast and reduce on every rank, the direct allreduce; not a
// ring (several messages to one neighbour), a chain cut into chunks, a
// single exchange, an empty op or a send/recv group.
TEST(Schedules, ShortPathMarksOneMessagePerPeerAndDirection) {
  auto marked = [](Collective coll, const char* algo, int n, int rank, size_t count = 2, size_t chunk = 0) {
    CollArgs a = rooted(coll, n, rank, 0, count);
    a.dt = DataType::kInt32;
    a.chunk_elems = chunk;
    auto s = make_schedule(a, algo);
    EXPECT_TRUE(s.is_ok()) << algo << ": " << s.status().to_string();
    if (!s.is_ok()) return false;
    if (s->short_path) {  // what run_short relies on
      std::vector<int> to(n, 0), from(n, 0);
      size_t largest = 0;
      for (const Phase& ph : s->phases) {
        size_t in_phase = 0;
        for (const Step& st : ph.steps) {
          if (!is_comm_step(st.kind) || st.count == 0) continue;
          EXPECT_TRUE(st.first_contact) << describe(st);
          ++(st.kind == StepKind::kSend ? to : from)[static_cast<size_t>(st.peer)];
          largest = std::max(largest, st.count);
          ++in_phase;
        }
        EXPECT_LE(in_phase, RankSchedule::kShortPathMaxTransfers);
      }
      for (int p = 0; p < n; ++p) {
        EXPECT_LE(to[static_cast<size_t>(p)], 1) << algo << " rank " << rank << " to " << p;
        EXPECT_LE(from[static_cast<size_t>(p)], 1) << algo << " rank " << rank << " from " << p;
      }
      EXPECT_EQ(s->max_transfer_count, largest) << algo;
      EXPECT_FALSE(s->single_exchange);
    }
    return s->short_path;
  };
  for (int r = 0; r < 8; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(marked(Collective::kBroadcast, "binomial", 8, r));
    EXPECT_TRUE(marked(Collective::kBroadcast, "direct", 8, r));
    EXPECT_TRUE(marked(Collective::kReduce, "binomial", 8, r));
    EXPECT_TRUE(marked(Collective::kAllReduce, "direct", 4, r % 4));
    EXPECT_FALSE(marked(Collective::kAllReduce, "ring", 8, r));                 // two messages each way
    EXPECT_FALSE(marked(Collective::kBroadcast, "binomial", 8, r, 0));         // nothing moves
  }
  EXPECT_FALSE(marked(Collective::kBroadcast, "chain", 4, 1, 8, 2));     // four chunks to the next rank
  EXPECT_TRUE(marked(Collective::kBroadcast, "chain", 4, 1, 8, 8));      // one
  EXPECT_FALSE(marked(Collective::kAllReduce, "hypercube", 2, 0));       // a single exchange: run_exchange
  // A phase of more transfers than the short path tracks: the direct
  // broadcast's root at 66 ranks sends 65 messages in one phase.
  EXPECT_FALSE(marked(Collective::kBroadcast, "direct", 66, 0));
  EXPECT_TRUE(marked(Collective::kBroadcast, "direct", 66, 5));
  CollArgs p;
  p.coll = Collective::kSendRecv;
  p.nranks = 2;
  p.rank = 0;
  p.p2p = {{true, 1, 4}};
  auto s = make_schedule(p);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_FALSE(s->short_path);  // a fingerprint per message
}

TEST(Schedules, RejectsBadArguments) {
  CollArgs a;
  a.nranks = 4;
  a.rank = 4;
  EXPECT_EQ(make_schedule(a).status().code(), StatusCode::kInvalidArgument);
  a.rank = 0;
  a.coll = Collective::kBroadcast;
  a.root = 7;
  EXPECT_EQ(make_schedule(a).status().code(), StatusCode::kInvalidArgument);
  a.root = 0;
  EXPECT_EQ(make_schedule(a, "no-such-algo").status().code(), StatusCode::kNotSupported);
}

// The interpreter rejects what the executor would race on or overrun, and
// hands out scratch that is not zeros. Regressions (each accepted before): a
// receive writing a receive-reduce's local operand in the same phase; an
// overlapped copy writing it; a receive past the end of the receive buffer
// (only scratch was bounds-checked); a reduction of never-written scratch
// that came out right because the scratch was zero-filled.
TEST(Interpreter, CatchesRacesOverrunsAndUnwrittenScratch) {
  using namespace patterns;
  const DataType dt = DataType::kFloat32;
  std::vector<float> send0(8, 1.0f), send1(8, 2.0f), recv0(8, 0.0f), recv1(8, 0.0f);
  auto bufs = [&] {
    return std::vector<std::vector<std::byte*>>{{reinterpret_cast<std::byte*>(send0.data()), reinterpret_cast<std::byte*>(recv0.data())},
                                                {reinterpret_cast<std::byte*>(send1.data()), reinterpret_cast<std::byte*>(recv1.data())}};
  };
  auto two = [](std::vector<Step> r0, std::vector<Step> r1, size_t scratch = 0) {
    std::vector<RankSchedule> s(2);
    s[0].phases.push_back({std::move(r0)});
    s[1].phases.push_back({std::move(r1)});
    s[0].scratch_count = s[1].scratch_count = scratch;
    return s;
  };
  // A: rank 0 receives into recv[0..4) while reducing recv[0..4) with a message.
  auto a = two({recv_step(1, {kBufRecv, 0}, 4), recv_reduce_step(1, {kBufRecv, 0}, {kBufRecv, 4}, 4)},
               {send_step(0, {kBufSend, 0}, 4), send_to_reduce_step(0, {kBufSend, 4}, 4)});
  Status sa = interpret(a, bufs(), dt, RedOp::kSum);
  EXPECT_FALSE(sa.is_ok());
  EXPECT_NE(sa.message().find("overlaps"), std::string::npos) << sa.to_string();
  // B: an overlapped copy writes the receive-reduce's local operand.
  auto b = two({overlapped_copy_step({kBufSend, 0}, {kBufRecv, 0}, 4), recv_reduce_step(1, {kBufRecv, 0}, {kBufRecv, 4}, 4)},
               {send_to_reduce_step(0, {kBufSend, 0}, 4)});
  Status sb = interpret(b, bufs(), dt, RedOp::kSum);
  EXPECT_FALSE(sb.is_ok());
  EXPECT_NE(sb.message().find("conflicts"), std::string::npos) << sb.to_string();
  // D: a receive of 4 elements at offset 6 of an 8-element receive buffer.
  auto d = two({recv_step(1, {kBufRecv, 6}, 4)}, {send_step(0, {kBufSend, 0}, 4)});
  Status sd = interpret(d, bufs(), dt, RedOp::kSum, {{8, 8}, {8, 8}});
  EXPECT_FALSE(sd.is_ok());
  EXPECT_NE(sd.message().find("overruns buffer 1"), std::string::npos) << sd.to_string();
  EXPECT_TRUE(interpret(two({recv_step(1, {kBufRecv, 4}, 4)}, {send_step(0, {kBufSend, 0}, 4)}), bufs(), dt, RedOp::kSum,
                        {{8, 8}, {8, 8}}).is_ok());
  // E: rank 0 reduces its input with scratch it never wrote.
  recv0.assign(8, 0.0f);
  auto e = two({reduce_step({kBufSend, 0}, {kBufScratch, 0}, {kBufRecv, 0}, 4)}, {}, 4);
  ASSERT_TRUE(interpret(e, bufs(), dt, RedOp::kSum).is_ok());
  EXPECT_NE(recv0[0], 1.0f) << "scratch read as zeros";
}

}  // namespace
}  // namespace loom
