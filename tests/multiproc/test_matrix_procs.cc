// The correctness matrix with ranks as separate processes (fork), over the
// shared-memory transport, created from a unique id like NCCL.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/test_util.h"

namespace loom {
namespace {

class ProcMatrix : public ::testing::TestWithParam<int> {};

TEST_P(ProcMatrix, AllCases) {
  const int n = GetParam();
  auto id = testing::unique_id();
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  // The 1M+3 cases run at 2 and 5 ranks here (all sizes run as threads in
  // inproc/test_matrix_threads); this keeps CI on 2 cores inside its budget.
  const bool big = n == 2 || n == 5;
  auto results = testing::run_processes(n, [&](int r, int fd) {
    auto comm = Comm::init_rank(*id, n, r);
    if (!comm.is_ok()) {
      std::string m = comm.status().to_string();
      (void)!write(fd, m.data(), m.size());
      return 1;
    }
    for (const auto& c : testing::correctness_matrix(n, big)) {
      Status st = testing::run_case(**comm, c);
      if (!st.is_ok()) {
        std::string m = st.to_string();
        (void)!write(fd, m.data(), m.size());
        (*comm)->abort("test failure");
        return 1;
      }
    }
    return (*comm)->destroy().is_ok() ? 0 : 1;
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(WIFEXITED(results[r].status) && WEXITSTATUS(results[r].status) == 0)
        << "rank " << r << ": " << results[r].output;
  }
  EXPECT_TRUE(testing::loom_shm_segments().empty());
}

INSTANTIATE_TEST_SUITE_P(Ranks, ProcMatrix, ::testing::Values(1, 2, 3, 4, 5, 8),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace loom
