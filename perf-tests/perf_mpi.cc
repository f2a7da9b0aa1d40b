#include "perf_mpi.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

#if LOOM_PERF_MPI
// The C API only: Open MPI's and MPICH's C++ bindings need their own library.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#if LOOM_PERF_LOOM_MPI
#include "loom/mpi.h"
#endif
#endif

namespace loom::perf {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

#if LOOM_PERF_MPI

bool mpi_built() { return true; }

namespace {

bool g_we_initialised = false;

std::string mpi_error(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

bool mpi_type(DataType dt, MPI_Datatype* out) {
  switch (dt) {
    case DataType::kInt8: *out = MPI_INT8_T; return true;
    case DataType::kUint8: *out = MPI_UINT8_T; return true;
    case DataType::kInt32: *out = MPI_INT32_T; return true;
    case DataType::kUint32: *out = MPI_UINT32_T; return true;
    case DataType::kInt64: *out = MPI_INT64_T; return true;
    case DataType::kUint64: *out = MPI_UINT64_T; return true;
    case DataType::kFloat32: *out = MPI_FLOAT; return true;
    case DataType::kFloat64: *out = MPI_DOUBLE; return true;
    default: return false;
  }
}

bool mpi_op(RedOp op, MPI_Op* out) {
  switch (op) {
    case RedOp::kSum: *out = MPI_SUM; return true;
    case RedOp::kProd: *out = MPI_PROD; return true;
    case RedOp::kMax: *out = MPI_MAX; return true;
    case RedOp::kMin: *out = MPI_MIN; return true;
    case RedOp::kAvg: return false;
  }
  return false;
}

// One MPI operation equivalent to `b`; returns the MPI error code.
int mpi_run(Bench b, const Buffers& buf, const Shape& s, const Options& o, MPI_Datatype t, MPI_Op op) {
  int n = 0, r = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  const int c = static_cast<int>(s.count);
  const size_t block = s.count * dtype_size(o.dt);
  switch (b) {
    case Bench::kAllReduce: return MPI_Allreduce(buf.send, buf.recv, c, t, op, MPI_COMM_WORLD);
    case Bench::kReduceScatter: return MPI_Reduce_scatter_block(buf.send, buf.recv, c, t, op, MPI_COMM_WORLD);
    case Bench::kAllGather: return MPI_Allgather(buf.send, c, t, buf.recv, c, t, MPI_COMM_WORLD);
    case Bench::kBroadcast:
      // MPI broadcasts in place: the root's data is the (already filled) recv buffer.
      if (r == o.root && buf.recv != buf.send) std::memcpy(buf.recv, buf.send, block);
      return MPI_Bcast(buf.recv, c, t, o.root, MPI_COMM_WORLD);
    case Bench::kReduce: return MPI_Reduce(buf.send, buf.recv, c, t, op, o.root, MPI_COMM_WORLD);
    case Bench::kAllToAll: return MPI_Alltoall(buf.send, c, t, buf.recv, c, t, MPI_COMM_WORLD);
    case Bench::kSendRecv:
      if (o.oneway) {
        if (r % 2 == 0 && r + 1 < n) return MPI_Send(buf.send, c, t, r + 1, 0, MPI_COMM_WORLD);
        if (r % 2 == 1) return MPI_Recv(buf.recv, c, t, r - 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        return MPI_SUCCESS;
      }
      return MPI_Sendrecv(buf.send, c, t, (r + 1) % n, 0, buf.recv, c, t, (r - 1 + n) % n, 0, MPI_COMM_WORLD,
                          MPI_STATUS_IGNORE);
    case Bench::kHypercube: {
      std::memcpy(buf.recv + block * static_cast<size_t>(r), buf.send, block);
      for (int mask = 1; mask < n; mask <<= 1) {
        const size_t have = static_cast<size_t>(r & ~(mask - 1)), want = have ^ static_cast<size_t>(mask);
        int rc = MPI_Sendrecv(buf.recv + have * block, c * mask, t, r ^ mask, 1, buf.recv + want * block, c * mask, t,
                              r ^ mask, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return rc;
      }
      return MPI_SUCCESS;
    }
  }
  return MPI_ERR_OTHER;
}

}  // namespace

Status mpi_init(int* argc, char*** argv) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return Status::ok();
  int rc = MPI_Init(argc, argv);
  if (rc != MPI_SUCCESS) return internal_error("MPI_Init failed: " + mpi_error(rc));
  g_we_initialised = true;
  return Status::ok();
}

void mpi_finalize() {
  if (!g_we_initialised) return;
  int done = 0;
  MPI_Finalized(&done);
  if (!done) MPI_Finalize();
}

std::string mpi_library_version() {
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(v, &len);
  std::string s(v, static_cast<size_t>(len));
  if (auto nl = s.find_first_of("\r\n,"); nl != std::string::npos) s.resize(nl);
  return s;
}

Result<std::unique_ptr<Comm>> comm_from_mpi_world(const Config& cfg) {
  // A launcher of another MPI (mpirun.mpich for an Open MPI binary) makes
  // every process a singleton: say so instead of running N 1-rank benchmarks.
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* e = std::getenv(v);
    if (e && std::atoi(e) != world)
      return invalid_usage(std::string("the launcher says ") + v + "=" + e + " but MPI_COMM_WORLD has " +
                           std::to_string(world) + " rank(s): this binary was built with " + mpi_library_version() +
                           "; launch it with that MPI's mpirun");
  }
#if LOOM_PERF_LOOM_MPI
  return loom::comm_from_mpi(MPI_COMM_WORLD, cfg);
#else
  int n = 0, r = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  UniqueId id;
  int ok = 1;
  if (r == 0) {
    auto uid = get_unique_id();
    if (uid.is_ok()) id = *uid;
    else ok = 0;
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!ok) return internal_error("MPI rank 0 could not create a unique id");
  MPI_Bcast(id.bytes, static_cast<int>(kUniqueIdBytes), MPI_BYTE, 0, MPI_COMM_WORLD);
  return Comm::init_rank(id, n, r, cfg);
#endif
}

Result<double> mpi_time(Bench b, const Buffers& buf, const Shape& s, const Options& o, int iters, int warmup) {
  MPI_Datatype t;
  MPI_Op op = MPI_SUM;
  if (!mpi_type(o.dt, &t)) return not_supported(std::string("MPI has no ") + dtype_name(o.dt));
  if (bench_reduces(b) && !mpi_op(o.op, &op)) return not_supported(std::string("MPI has no ") + redop_name(o.op));
  for (int i = 0; i < warmup; ++i) {
    int rc = mpi_run(b, buf, s, o, t, op);
    if (rc != MPI_SUCCESS) return internal_error(mpi_error(rc));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  double fresh_us = 0;  // --fresh: the calls alone, each after its input was rewritten
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    std::chrono::steady_clock::time_point start;
    if (o.fresh) {
      freshen_input(buf, s, dtype_size(o.dt), i);
      start = std::chrono::steady_clock::now();
    }
    int rc = mpi_run(b, buf, s, o, t, op);
    if (rc != MPI_SUCCESS) return internal_error(mpi_error(rc));
    if (o.fresh) fresh_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  }
  auto t1 = std::chrono::steady_clock::now();
  return (o.fresh ? fresh_us : std::chrono::duration<double, std::micro>(t1 - t0).count()) / iters;
}

void mpi_barrier() { MPI_Barrier(MPI_COMM_WORLD); }

#else  // !LOOM_PERF_MPI

bool mpi_built() { return false; }
Status mpi_init(int*, char***) { return not_supported("this build has no MPI (configure with LOOM_WITH_MPI=ON)"); }
void mpi_finalize() {}
std::string mpi_library_version() { return ""; }
Result<std::unique_ptr<Comm>> comm_from_mpi_world(const Config&) {
  return not_supported("this build has no MPI (configure with LOOM_WITH_MPI=ON)");
}
Result<double> mpi_time(Bench, const Buffers&, const Shape&, const Options&, int, int) {
  return not_supported("this build has no MPI");
}
void mpi_barrier() {}

#endif

}  // namespace loom::perf
