// mpirun launches (Open MPI): a communicator from MPI_COMM_WORLD through
// loom::comm_from_mpi, and from Open MPI's OMPI_COMM_WORLD_* environment plus
// LOOM_ROOT_ADDR through Comm::init_from_env. Skipped when the build has no
// MPI or mpirun is missing.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>

namespace {

std::string smoke_binary() {
  const char* dir = std::getenv("LOOM_BUILD_DIR");
  return std::string(dir ? dir : ".") + "/bin/mpi_smoke";
}

bool runnable(std::string* why) {
  if (system("command -v mpirun >/dev/null 2>&1") != 0) return *why = "mpirun not installed (openmpi-bin)", false;
  if (system(("test -x " + smoke_binary()).c_str()) != 0)
    return *why = "mpi_smoke not built (configure found no MPI)", false;
  return true;
}

int run(const std::string& args) {
  // --allow-run-as-root: CI runs as root; --oversubscribe: 3 ranks on 2 cores.
  std::string cmd = "timeout 120 mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp -np 3 " + args;
  int st = system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

TEST(MpiLaunch, CommFromMpi) {
  std::string why;
  if (!runnable(&why)) GTEST_SKIP() << why;
  EXPECT_EQ(run(smoke_binary()), 0);
}

TEST(MpiLaunch, EnvDetectionWithRootAddr) {
  std::string why;
  if (!runnable(&why)) GTEST_SKIP() << why;
  EXPECT_EQ(run("-x LOOM_ROOT_ADDR=127.0.0.1:29533 " + smoke_binary() + " env"), 0);
}

}  // namespace
