// Creating a loom::Comm from an MPI communicator (library loom_mpi, built
// only when MPI was found at configure time: LOOM_HAVE_MPI).
//
// MPI is used only to bootstrap: rank 0 of `mpi_comm` creates a unique id
// (which starts the rendezvous root in that process) and broadcasts it with
// MPI_Bcast; every rank then calls Comm::init_rank with its MPI rank and the
// communicator's size. Data never travels over MPI afterwards. The call is
// collective over `mpi_comm` and MPI must be initialised.
//
// Launch example (Open MPI; as root it needs the two extra flags):
//   mpirun --allow-run-as-root --oversubscribe -np 4 build/bin/allreduce_perf -b 1M -e 64M
// Across hosts, set LOOM_SOCKET_IFNAME (e.g. "eth0" or "^docker,lo") so that
// rank 0's rendezvous address is reachable from the other hosts.
#pragma once

// The C API only: MPI's C++ bindings would need their own library.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <memory>

#include "loom/comm.h"

namespace loom {

// Collective over mpi_comm. Errors (including a failure on another rank during
// the id broadcast) are returned, never thrown; MPI errors are reported with
// their MPI error string.
Result<std::unique_ptr<Comm>> comm_from_mpi(MPI_Comm mpi_comm, const Config& config = {});

// True when this process looks like it was started by mpirun/mpiexec
// (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK in the environment).
bool launched_by_mpi();

}  // namespace loom
