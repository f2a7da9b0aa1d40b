// perf-tests --fresh: the input is rewritten before every timed operation,
// with bytes that decode to normal numbers in every floating type, and the
// option is refused where a rewrite would race with operations in flight.
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

}  // namespace
}  // namespace loom::perf
