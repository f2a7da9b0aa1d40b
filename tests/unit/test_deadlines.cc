// Deadlines from seconds, and LOOM_TIMEOUT's reading: huge, infinite or
// NaN waits must not overflow the clock's 64-bit nanoseconds (a deadline in
// the past: every wait failed at once), and 0, a negative value or inf mean
// no deadline. Regression: LOOM_TIMEOUT=0, -1, inf or 1e10 made every init
// fail within 0.1 s with "deadline passed" (found by a helper's review).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "bootstrap/socket.h"
#include "core/config.h"

namespace loom {
namespace {

TEST(Deadlines, HugeInfiniteAndNanWaitsLieInTheFuture) {
  const auto day = std::chrono::hours(24);
  for (double s : {1e10, 1e300, std::numeric_limits<double>::infinity(), std::nan("")}) {
    EXPECT_GT(deadline_after(s), Clock::now() + day) << s;
    EXPECT_GT(coarse_deadline_after(s), Clock::now() + day) << s;
  }
  EXPECT_LT(deadline_after(1.0), Clock::now() + std::chrono::seconds(2));
  EXPECT_LE(deadline_after(-1.0), Clock::now());  // a wait already over stays over
}

TEST(Deadlines, LoomTimeoutZeroNegativeOrInfMeansNone) {
  for (const char* v : {"0", "-1", "inf", "1e10"}) {
    setenv("LOOM_TIMEOUT", v, 1);
    EXPECT_GE(params::timeout_s(), 1e6) << "LOOM_TIMEOUT=" << v;
    EXPECT_GT(deadline_after(params::timeout_s()), Clock::now() + std::chrono::hours(24)) << v;
  }
  setenv("LOOM_TIMEOUT", "5", 1);
  EXPECT_EQ(params::timeout_s(), 5.0);
  unsetenv("LOOM_TIMEOUT");
  EXPECT_EQ(params::timeout_s(), 300.0);
}

}  // namespace
}  // namespace loom
