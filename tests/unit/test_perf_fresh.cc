// perf-tests --fresh: the input is rewritten before every timed operation,
// with bytes that decode to normal numbers in every floating type, and the
// option is refused where a rewrite would race with operations in flight.
// Also the rows' shapes: blocks cut as current nccl-tests cuts them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "kernels/float_conv.h"
#include "perf_colls.h"
#include "perf_options.h"

namespace loom::perf {
namespace {

// all_gather / reduce_scatter / alltoall / hypercube: the per-rank block is
// (count/nranks) & -(16/eltSize) elements in nccl-tests (2.28 era), so the
// size column is the same in both tables. Regression: Loom used count/nranks
// (1 MiB float all_gather on 3 ranks: 1048572 B where nccl-tests has 1048560).
TEST(PerfShapes, BlocksAreCutToSixteenBytesAsNcclTests) {
  struct Case {
    Bench b;
    size_t bytes, es;
    int n;
    size_t count, size;
  } cases[] = {
      {Bench::kAllGather, 1 << 20, 4, 3, 87380, 1048560},
      {Bench::kReduceScatter, 1 << 20, 4, 3, 87380, 1048560},
      {Bench::kAllToAll, 1 << 20, 8, 3, 43690, 1048560},
      {Bench::kHypercube, 1 << 20, 1, 3, 349520, 1048560},
      {Bench::kAllGather, 1 << 20, 2, 6, 87376, 1048512},
      {Bench::kAllGather, 8, 4, 2, 0, 0},      // one float per rank: below 16 B
      {Bench::kReduceScatter, 32, 4, 2, 4, 32},
      {Bench::kAllReduce, 1 << 20, 4, 3, 262144, 1 << 20},  // whole-buffer collectives keep theirs
      {Bench::kBroadcast, 12, 4, 3, 3, 12},
  };
  for (const Case& c : cases) {
    Shape s = shape_for(c.b, c.bytes, c.es, c.n);
    EXPECT_EQ(s.count, c.count) << c.bytes << " B, " << c.es << " B elements, " << c.n << " ranks";
    EXPECT_EQ(s.size_bytes, c.size) << c.bytes << " B, " << c.es << " B elements, " << c.n << " ranks";
  }
}

TEST(PerfFresh, EveryCallGetsANewInputOfNormalNumbers) {
  const size_t n = 1000;
  std::vector<float> send(n + 1, -1.0f), recv(n, 0.0f);
  Shape s = shape_for(Bench::kAllReduce, n * sizeof(float), sizeof(float), 2);
  ASSERT_EQ(s.send_count, n);
  Buffers b{reinterpret_cast<std::byte*>(send.data()), reinterpret_cast<std::byte*>(recv.data())};
  float prev = 0;
  for (int i = 0; i < 16; ++i) {
    freshen_input(b, s, sizeof(float), i);
    const float v = send[0];
    EXPECT_TRUE(std::isnormal(v)) << "call " << i;
    for (size_t k = 0; k < n; ++k) {
      ASSERT_EQ(std::memcmp(&send[k], &v, sizeof v), 0) << "call " << i << " element " << k;
    }
    if (i % 8 != 0) {
      EXPECT_NE(v, prev) << "call " << i << ": the input did not change";
    }
    prev = v;
    // Half, bfloat16 and double read from the same bytes are normal too.
    uint16_t h;
    std::memcpy(&h, send.data(), sizeof h);
    EXPECT_TRUE(std::isnormal(kernels::fp16_to_float(h))) << "call " << i;
    EXPECT_TRUE(std::isnormal(kernels::bf16_to_float(h))) << "call " << i;
    double d;
    std::memcpy(&d, send.data(), sizeof d);
    EXPECT_TRUE(std::isnormal(d)) << "call " << i;
  }
  EXPECT_EQ(send[n], -1.0f) << "wrote past the input";
  for (float r : recv) {
    EXPECT_EQ(r, 0.0f) << "touched the output";
  }
}

TEST(PerfFresh, NeedsBlockingOperations) {
  auto parse = [](std::vector<const char*> args) {
    Options o;
    args.insert(args.begin(), "all_reduce_perf");
    return parse_options(static_cast<int>(args.size()), const_cast<char**>(args.data()), Bench::kAllReduce, &o) == -1
               ? std::optional<Options>(o)
               : std::nullopt;
  };
  EXPECT_FALSE(parse({"--fresh"}).has_value());
  EXPECT_FALSE(parse({"--fresh", "-z", "0"}).has_value());
  auto ok = parse({"--fresh", "-z", "1"});
  ASSERT_TRUE(ok.has_value());
  EXPECT_TRUE(ok->fresh);
  EXPECT_TRUE(ok->blocking);
}

// --ab alternates which side runs first. Regression: A always ran first,
// and the position alone moved same-against-same runs (4 ranks, broadcast
// 16 KiB binomial against binomial: B/A 0.46-0.48).
TEST(PerfAb, EachSideRunsFirstInHalfTheBlocks) {
  for (int blocks : {2, 10, 64}) {
    int a_first = 0;
    for (int k = 0; k < blocks; ++k) a_first += ab_a_first(k);
    EXPECT_EQ(a_first, blocks / 2) << blocks << " blocks";
  }
  EXPECT_TRUE(ab_a_first(0));
  EXPECT_NE(ab_a_first(0), ab_a_first(1));
}

}  // namespace
}  // namespace loom::perf
