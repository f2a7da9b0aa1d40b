// MPI in the perf suite (only when built with MPI, LOOM_HAVE_MPI): the
// bootstrap under mpirun and the --baseline mpi measurements. Without MPI
// these functions report that the build has none.
#pragma once

#include <memory>
#include <string>

#include "loom/comm.h"
#include "perf_colls.h"
#include "perf_options.h"

namespace loom::perf {

bool mpi_built();
// True when an MPI launcher started this process (Open MPI, MPICH/Hydra, PMIx).
bool launched_by_mpi();
// MPI_Init (once); ok when MPI is already initialised.
Status mpi_init(int* argc, char*** argv);
void mpi_finalize();
std::string mpi_library_version();

// Creates the Loom communicator over MPI_COMM_WORLD: rank 0 makes the unique
// id, MPI_Bcast hands it to everyone, every rank calls Comm::init_rank.
Result<std::unique_ptr<Comm>> comm_from_mpi_world(const Config& cfg);

// Times MPI's counterpart of `b` on the same buffers, out of place: returns
// microseconds per operation on this rank. NotSupported for types or ops MPI
// lacks (half, bfloat16, fp8, avg).
Result<double> mpi_time(Bench b, const Buffers& buf, const Shape& s, const Options& o, int iters, int warmup);

// MPI_Barrier on MPI_COMM_WORLD (keeps the two libraries' runs apart).
void mpi_barrier();

}  // namespace loom::perf
