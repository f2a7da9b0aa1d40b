// Run by test_mpi_launch under mpirun: builds a communicator either from
// MPI_COMM_WORLD (comm_from_mpi) or from Open MPI's environment
// (init_from_env with LOOM_ROOT_ADDR) and checks an allreduce and a
// broadcast in closed form. Exit 0 on success; errors go to stderr.
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "loom/mpi.h"

int main(int argc, char** argv) {
  const bool from_env = argc > 1 && std::strcmp(argv[1], "env") == 0;
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (!loom::launched_by_mpi()) {
    std::fprintf(stderr, "rank %d: launched_by_mpi() is false under mpirun\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  auto comm = from_env ? loom::Comm::init_from_env() : loom::comm_from_mpi(MPI_COMM_WORLD);
  if (!comm.is_ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().to_string().c_str());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  int rc = 0;
  if ((*comm)->rank() != rank || (*comm)->size() != size) rc = 4;
  std::vector<float> v(100003, static_cast<float>(rank + 1));
  auto w = (*comm)->allreduce(v.data(), v.data(), v.size(), loom::DataType::kFloat32, loom::RedOp::kSum);
  loom::Status st = w.is_ok() ? w->wait() : w.status();
  const float want = static_cast<float>(size * (size + 1) / 2);
  if (!st.is_ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, st.to_string().c_str());
    rc = 5;
  } else {
    for (float x : v)
      if (x != want) rc = 6;
  }
  if ((*comm)->destroy().is_ok() == false) rc = 7;
  comm->reset();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::printf("mpi_smoke %s: %d ranks, result %d\n", from_env ? "env" : "comm_from_mpi", size, worst);
  MPI_Finalize();
  return worst;
}
