// Byte sizes as flags and LOOM_* variables read them (parse_bytes): digits,
// a fraction only with a K/M/G suffix, an optional B. Regression: "-8" was
// read as 2^64 - 8 (strtoull), products overflowed silently, and "1.5K"
// (which nccl-tests accepts for -b/-e) was refused.
#include <gtest/gtest.h>

#include <cstdint>

#include "core/config.h"

namespace loom {
namespace {

TEST(ParseBytes, SuffixesFractionsAndGarbage) {
  uint64_t v = 0;
  ASSERT_TRUE(parse_bytes("4096", &v));
  EXPECT_EQ(v, 4096u);
  ASSERT_TRUE(parse_bytes("64K", &v));
  EXPECT_EQ(v, 64u << 10);
  ASSERT_TRUE(parse_bytes("2MB", &v));
  EXPECT_EQ(v, 2u << 20);
  ASSERT_TRUE(parse_bytes("1.5K", &v));
  EXPECT_EQ(v, 1536u);
  ASSERT_TRUE(parse_bytes("0.25G", &v));
  EXPECT_EQ(v, 1u << 28);
  for (const char* bad : {"-8", "+8", " 8", "", "8X", "1.5", "K", "99999999999999999999", "17179869184G", "1e3"})
    EXPECT_FALSE(parse_bytes(bad, &v)) << "'" << bad << "' read as " << v;
}

}  // namespace
}  // namespace loom
