// loom::comm_from_mpi: MPI only carries the unique id (see include/loom/mpi.h).
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "loom/mpi.h"

namespace loom {
namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

}  // namespace

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"}) {
    const char* s = std::getenv(v);
    if (s && *s) return true;
  }
  return false;
}

Result<std::unique_ptr<Comm>> comm_from_mpi(MPI_Comm mpi_comm, const Config& config) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return invalid_usage("comm_from_mpi: MPI is not initialised (call MPI_Init first)");
  if (mpi_comm == MPI_COMM_NULL) return invalid_argument("comm_from_mpi: MPI_COMM_NULL");
  int rank = 0, size = 0, rc = MPI_Comm_rank(mpi_comm, &rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(mpi_comm, &size);
  if (rc != MPI_SUCCESS) return invalid_argument("comm_from_mpi: bad MPI communicator: " + mpi_error_text(rc));

  // Byte 0 of the broadcast says whether rank 0 could create an id, so a
  // failure there becomes an error on every rank instead of a hang.
  unsigned char buf[1 + sizeof(UniqueId)] = {};
  std::string root_error;
  if (rank == 0) {
    auto id = get_unique_id();
    if (id.is_ok()) {
      buf[0] = 1;
      std::memcpy(buf + 1, &*id, sizeof(UniqueId));
    } else {
      root_error = id.status().to_string();
    }
  }
  rc = MPI_Bcast(buf, sizeof(buf), MPI_BYTE, 0, mpi_comm);
  if (rc != MPI_SUCCESS) return internal_error("comm_from_mpi: MPI_Bcast of the unique id failed: " + mpi_error_text(rc));
  if (buf[0] != 1)
    return internal_error(rank == 0 ? "comm_from_mpi: cannot create a unique id: " + root_error
                                    : std::string("comm_from_mpi: MPI rank 0 could not create a unique id"));
  UniqueId id;
  std::memcpy(&id, buf + 1, sizeof(UniqueId));
  auto comm = Comm::init_rank(id, size, rank, config);
  if (!comm.is_ok()) return comm.status().with_context(fmt::format("comm_from_mpi (MPI rank {}/{})", rank, size));
  return comm;
}

}  // namespace loom
