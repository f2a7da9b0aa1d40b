// Status and Result value semantics. Status keeps its message behind a
// pointer (null when ok), so copies, moves and assignments are checked
// here rather than trusted to the compiler-generated members.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "loom/status.h"

namespace loom {
namespace {

TEST(Status, OkHasNoMessage) {
  Status st;
  EXPECT_TRUE(st.is_ok());
  EXPECT_EQ(st.message(), "");
  EXPECT_EQ(st.to_string(), "Ok");
  EXPECT_TRUE(Status::ok().is_ok());
  // A failure without a message is still a failure.
  Status bare(StatusCode::kTimeout, "");
  EXPECT_FALSE(bare.is_ok());
  EXPECT_EQ(bare.message(), "");
  EXPECT_EQ(bare.to_string(), "Timeout: ");
}

TEST(Status, CopiesOwnTheirMessage) {
  Status a = timeout_error("rank 3 is in broadcast #57");
  Status b = a;
  a = Status::ok();  // the copy must not share storage with the original
  EXPECT_TRUE(a.is_ok());
  EXPECT_EQ(b.code(), StatusCode::kTimeout);
  EXPECT_EQ(b.message(), "rank 3 is in broadcast #57");
  Status c;
  c = b;
  b = invalid_usage("other");
  EXPECT_EQ(c.message(), "rank 3 is in broadcast #57");
  EXPECT_EQ(b.message(), "other");
  const Status& same = c;
  c = same;  // self-assignment keeps the value
  EXPECT_EQ(c.message(), "rank 3 is in broadcast #57");
}

TEST(Status, MovesCarryCodeAndMessage) {
  Status a = remote_error("peer 2 died");
  Status b = std::move(a);
  EXPECT_EQ(b.code(), StatusCode::kRemoteError);
  EXPECT_EQ(b.message(), "peer 2 died");
  Status c = aborted_error("stop");
  c = std::move(b);
  EXPECT_EQ(c.code(), StatusCode::kRemoteError);
  EXPECT_EQ(c.message(), "peer 2 died");
  // Statuses in a growing vector are moved around by reallocation.
  std::vector<Status> v;
  for (int i = 0; i < 100; ++i) v.push_back(i % 2 ? internal_error("e" + std::to_string(i)) : Status::ok());
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(v[i].is_ok(), i % 2 == 0);
    EXPECT_EQ(v[i].message(), i % 2 ? "e" + std::to_string(i) : "");
  }
}

TEST(Status, WithContextAndResult) {
  Status st = invalid_argument("count overflows").with_context("allreduce");
  EXPECT_EQ(st.message(), "allreduce: count overflows");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Status::ok().with_context("x").is_ok());
  Result<int> r = st;
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "allreduce: count overflows");
  Result<int> v = 7;
  EXPECT_TRUE(v.is_ok());
  EXPECT_TRUE(v.status().is_ok());
  EXPECT_EQ(*v, 7);
}

}  // namespace
}  // namespace loom
