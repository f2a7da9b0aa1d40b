// The correctness matrix over the real shared-memory transport, ranks as
// threads of this process (Comm::init_all): every collective x dtype x op x
// nranks {1,2,3,4,5,8} x counts {0,1,7,1023,1M+3} x in/out-of-place.
#include <gtest/gtest.h>

#include <thread>

#include "common/test_util.h"

namespace loom {
namespace {

class ThreadMatrix : public ::testing::TestWithParam<int> {};

TEST_P(ThreadMatrix, AllCases) {
  const int n = GetParam();
  auto comms = Comm::init_all(n);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  const auto cases = testing::correctness_matrix(n, /*include_big=*/true);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      for (const auto& c : cases) {
        Status st = testing::run_case(*(*comms)[r], c);
        if (!st.is_ok()) {
          errors[r] = st.to_string();
          (*comms)[r]->abort("test failure on this rank");
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (auto& c : *comms) EXPECT_TRUE(c->destroy().is_ok());
  RecordProperty("cases", static_cast<int>(cases.size()));
}

INSTANTIATE_TEST_SUITE_P(Ranks, ThreadMatrix, ::testing::Values(1, 2, 3, 4, 5, 8),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace loom
