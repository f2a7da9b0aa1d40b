// Collectives, point-to-point and PreMulSum operators.
//
// Every entry point checks its arguments the way NCCL does (same result
// codes), then hands a PendingOp to submit(): run now and wait (blocking
// comm), run now and poll later (non-blocking comm), or record for GroupEnd.
// Buffers are host memory. Without a usable CUDA runtime the stream argument
// has no meaning and is ignored. With one (src/cuda/cuda_loader.h), device
// buffers are refused (no CUDA memory backend yet) and the host op is ordered
// on the stream: it is enqueued at once (so every rank's issue order is its
// call order), held back by a StartGate until a host function launched on the
// stream runs, and that host function then waits for the op, so the stream's
// later work sees the result. The caller does not wait for the stream.
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/comm_impl.h"
#include "cuda/cuda_loader.h"
#include "shim/alias.h"
#include "shim/shim.h"

using namespace loom;
using namespace loom::shim;

namespace loom::shim {

Result<DataType> check_dtype(ncclDataType_t dt) {
  int v = static_cast<int>(dt);
  if (v < 0 || v >= ncclNumTypes) return invalid_argument("invalid datatype " + std::to_string(v));
  return static_cast<DataType>(v);
}

}  // namespace loom::shim

namespace {

std::string fmt_ptr(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// ---- CUDA streams -----------------------------------------------------------

// The runtime when it is usable (loaded, sees a device); else null.
const cuda::CudaRuntimeApi* cuda_runtime() { return cuda::CudaLoader::get().runtime(); }

// One call ordered on a CUDA stream.
struct StreamOp {
  std::shared_ptr<detail::StartGate> gate = std::make_shared<detail::StartGate>();
  // Reads of user memory that must see the stream's prior work (PreMulSum
  // scaling): run by the host function before the gate opens.
  std::vector<std::function<void()>> before;
  Completion done;           // a lone call: completed on the stream
  bool owns_completion = false;
};

// Runs on the stream's host-function thread when the stream reaches the call.
void stream_reached(void* arg) {
  std::unique_ptr<std::shared_ptr<StreamOp>> holder(static_cast<std::shared_ptr<StreamOp>*>(arg));
  StreamOp& so = **holder;
  for (auto& f : so.before) f();
  so.gate->open();
  Status st = so.gate->wait_finished();
  if (so.owns_completion) st = so.done.wait();  // Gather/Scatter's root block, temporaries
  // A failure has already marked the loom communicator failed; the user sees
  // it from ncclCommGetAsyncError and from the next call.
  if (!st.is_ok() && log_enabled(LogLevel::kWarn)) log(LogLevel::kWarn, "stream-ordered op failed: " + st.to_string());
}

Status launch_on_stream(const cuda::CudaRuntimeApi& rt, cudaStream_t stream, std::shared_ptr<StreamOp> so) {
  auto* arg = new std::shared_ptr<StreamOp>(so);
  cuda::CudaError e = rt.launch_host_func(reinterpret_cast<cuda::CudaStream>(stream), &stream_reached, arg);
  if (e == cuda::kCudaSuccess) return Status::ok();
  delete arg;
  return internal_error("cudaLaunchHostFunc failed: " + cuda::CudaLoader::get().error_text(e));
}

struct ResolvedOp {
  RedOp op = RedOp::kSum;
  std::optional<PreMulOp> premul;
};

Result<ResolvedOp> resolve_op(ncclComm* c, ncclRedOp_t op, DataType dt) {
  int v = static_cast<int>(op);
  if (v >= 0 && v < ncclNumOps) return ResolvedOp{static_cast<RedOp>(v), std::nullopt};
  size_t slot = static_cast<size_t>(v) - ncclNumOps;
  std::lock_guard<std::mutex> lock(c->mu);
  if (v < 0 || slot >= c->premul_ops.size() || !c->premul_ops[slot])
    return invalid_argument("invalid reduction operator " + std::to_string(v));
  const PreMulOp& pm = *c->premul_ops[slot];
  if (pm.dtype != dt)
    return invalid_argument("PreMulSum operator " + std::to_string(v) + " was created for " +
                            dtype_name(pm.dtype) + ", used with " + dtype_name(dt));
  return ResolvedOp{RedOp::kSum, pm};
}

// count * multiplier elements of dt must be addressable. Host buffers cannot
// be measured, so sizes beyond any user address space (2^56 bytes, 5-level
// paging) are refused here rather than left to fault inside the engine.
Status check_count(size_t count, DataType dt, size_t multiplier) {
  constexpr size_t kMaxBytes = size_t{1} << 56;
  const size_t elem = dtype_size(dt);
  if (multiplier != 0 && count > kMaxBytes / elem / multiplier)
    return invalid_argument("count " + std::to_string(count) + " * " + std::to_string(multiplier) +
                            " * " + std::to_string(elem) +
                            " bytes overflows the address space (2^56 bytes)");
  return Status::ok();
}

// Buffers must be host memory this process can read. Without CUDA a device
// pointer would fault inside the engine; probing its first and last byte with
// process_vm_readv (one syscall, no signal) turns that into an error.
Status check_buffer(const void* p, size_t bytes, const char* name) {
  if (p == nullptr) return invalid_argument(std::string(name) + " is NULL");
  if (bytes == 0) return Status::ok();
  if (const cuda::CudaRuntimeApi* rt = cuda_runtime()) {
    // Host, managed and unregistered (plain malloc) memory run on the host
    // engine; an error means the runtime does not know the pointer: host.
    cuda::CudaPointerAttributes a;
    if (rt->pointer_get_attributes(&a, p) == cuda::kCudaSuccess && a.type == cuda::CudaMemoryType::kDevice)
      return invalid_argument(std::string(name) + " " + fmt_ptr(p) + " is CUDA device memory (device " +
                              std::to_string(a.device) +
                              "); this Loom runs collectives on host buffers only: device buffers need the "
                              "CUDA memory backend, which is not built yet");
  }
  char probe[2];
  iovec local{probe, sizeof probe};
  iovec remote[2] = {{const_cast<void*>(p), 1},
                     {static_cast<char*>(const_cast<void*>(p)) + bytes - 1, 1}};
  if (process_vm_readv(getpid(), &local, 1, remote, 2, 0) < 0 && errno == EFAULT)
    return invalid_argument(std::string(name) + " " + fmt_ptr(p) + " (" + std::to_string(bytes) +
                            " bytes) is not readable host memory; a device pointer? This "
                            "libnccl has no CUDA support");
  return Status::ok();  // other errors (EPERM, ENOSYS under seccomp): no probe
}

Status check_rank(const ncclComm* c, int r, const char* what) {
  if (r < 0 || r >= c->nranks)
    return invalid_argument(std::string(what) + " " + std::to_string(r) + " out of range [0, " +
                            std::to_string(c->nranks) + ")");
  return Status::ok();
}

// The input a reduction actually reads: the caller's, or a scaled copy.
// On a stream the scaling waits for the stream (it reads the user's input).
const void* reduction_input(const void* send, size_t n, DataType dt,
                            const std::optional<PreMulOp>& pm, Completion& done, StreamOp* so) {
  if (!pm) return send;
  std::byte* t = done.temp(n * dtype_size(dt));
  if (so != nullptr) {
    // Runs later, on the stream's thread: it keeps its own copy of the
    // operator (an immediate scalar lives inside it), not a pointer into the
    // call's state, which is gone by then (regression: TSan heap-use-after-free).
    so->before.push_back([=, op = *pm] {
      scale(t, send, n, dt, op.immediate ? static_cast<const void*>(op.value) : op.pointer);
    });
    return t;
  }
  scale(t, send, n, dt, pm->immediate ? static_cast<const void*>(pm->value) : pm->pointer);
  return t;
}

Status add_work(Result<Work> w, Completion& done) {
  if (!w.is_ok()) return w.status();
  done.add(w.value());
  return Status::ok();
}

// `so` is the call's stream state, null when the stream is ignored.
using Issue = std::function<Status(Comm&, Completion&, StreamOp*)>;

Status run(ncclComm* c, cudaStream_t stream, Collective coll, size_t bytes, Issue issue) {
  PendingOp op;
  op.coll = coll;
  op.bytes = bytes;
  const cuda::CudaRuntimeApi* rt = cuda_runtime();
  if (rt == nullptr) {
    op.issue = [issue = std::move(issue)](Comm& lc, Completion& done) { return issue(lc, done, nullptr); };
    return submit(c, std::move(op));
  }
  auto so = std::make_shared<StreamOp>();
  if (in_group()) {
    // Issued at GroupEnd (group.cc), inside the group's one loom op: the host
    // function goes on the stream then, and the group's op waits for it.
    // GroupEnd completes the group as for host calls.
    op.issue = [issue = std::move(issue), so, stream, rt](Comm& lc, Completion& done) -> Status {
      lc.impl()->add_start_gate(so->gate);
      Status st = issue(lc, done, so.get());
      if (st.is_ok()) st = launch_on_stream(*rt, stream, so);
      if (!st.is_ok()) so->gate->open();  // never leave the group's op waiting
      return st;
    };
    return submit(c, std::move(op));
  }
  op.issue = [issue = std::move(issue), so](Comm& lc, Completion& done) {
    lc.impl()->add_start_gate(so->gate);
    return issue(lc, done, so.get());
  };
  std::vector<PendingOp> one;
  one.push_back(std::move(op));
  Completion done;
  Status st = issue_batch(c, one, done);
  if (!st.is_ok()) {
    c->comm->impl()->drop_start_gates(st);
    so->gate->open();  // a partly enqueued call (Gather/Scatter) must not wait for a stream
    (void)done.wait();
    return st;
  }
  so->done = std::move(done);
  so->owns_completion = true;
  if (Status ls = launch_on_stream(*rt, stream, so); !ls.is_ok()) {
    // The op is enqueued on every rank: let it run now, unordered, and say so.
    for (auto& f : so->before) f();
    so->gate->open();
    (void)so->gate->wait_finished();
    (void)so->done.wait();
    return ls;
  }
  return Status::ok();
}

// Gather and Scatter have no loom collective: point-to-point in one loom
// group; the root's own block moves by memcpy once the group has finished.
Status rooted_p2p(Comm& lc, Completion& done, int rank, int nranks, int root, size_t count,
                  DataType dt, const std::byte* send, std::byte* recv, bool gather) {
  const size_t bytes = count * dtype_size(dt);
  if (nranks > 1) {
    lc.group_start();
    Status first;
    for (int r = 0; r < nranks && first.is_ok(); ++r) {
      if (rank == root && r != root) {
        first = gather ? lc.recv(recv + r * bytes, count, dt, r).status()
                       : lc.send(send + r * bytes, count, dt, r).status();
      }
    }
    if (rank != root)
      first = gather ? lc.send(send, count, dt, root).status() : lc.recv(recv, count, dt, root).status();
    Result<Work> w = lc.group_end();
    LOOM_RETURN_IF_ERROR(first);
    LOOM_RETURN_IF_ERROR(add_work(std::move(w), done));
  }
  if (rank == root) {
    const std::byte* from = gather ? send : send + root * bytes;
    std::byte* to = gather ? recv + root * bytes : recv;
    if (from != to) done.after.push_back([from, to, bytes] { std::memmove(to, from, bytes); });
  }
  return Status::ok();
}

}  // namespace

extern "C" ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                       cudaStream_t stream) {
  return guard("ncclAllReduce", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, ready_comm(comm));
    LOOM_ASSIGN_OR_RETURN(DataType dt, check_dtype(datatype));
    LOOM_ASSIGN_OR_RETURN(ResolvedOp ro, resolve_op(c, op, dt));
    LOOM_RETURN_IF_ERROR(check_count(count, dt, 1));
    if (count == 0) return Status::ok();
    LOOM_RETURN_IF_ERROR(check_buffer(sendbuff, count * dtype_size(dt), "sendbuff"));
    LOOM_RETURN_IF_ERROR(check_buffer(recvbuff, count * dtype_size(dt), "recvbuff"));
    return run(c, stream, Collective::kAllReduce, count * dtype_size(dt),
               [=](Comm& lc, Completion& done, StreamOp* so) {
                 const void* in = reduction_input(sendbuff, count, dt, ro.premul, done, so);
                 return add_work(lc.allreduce(in, recvbuff, count, dt, ro.op), done);
               });
  });
}

extern "C" ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t op, int root,
                                    ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclReduce", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, ready_comm(comm));
    LOOM_ASSIGN_OR_RETURN(DataType dt, check_dtype(datatype));
    LOOM_ASSIGN_OR_RETURN(ResolvedOp ro, resolve_op(c, op, dt));
    LOOM_RETURN_IF_ERROR(check_rank(c, root, "root"));
    LOOM_RETURN_IF_ERROR(check_count(count, dt, 1));
    if (count == 0) return Status::ok();
    LOOM_RETURN_IF_ERROR(check_buffer(sendbuff, count * dtype_size(dt), "sendbuff"));
    if (c->rank == root) LOOM_RETURN_IF_ERROR(check_buffer(recvbuff, count * dtype_size(dt), "recvbuff (at root)"));
    return run(c, stream, Collective::kReduce, count * dtype_size(dt), [=](Comm& lc, Completion& done, StreamOp* so) {
      const void* in = reduction_input(sendbuff, count, dt, ro.premul, done, so);
      return add_work(lc.reduce(in, recvbuff, count, dt, ro.op, root), done);
    });
  });
}

extern "C" ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                           ncclDataType_t datatype, ncclRedOp_t op,
                                           ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclReduceScatter", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, ready_comm(comm));
    LOOM_ASSIGN_OR_RETURN(DataType dt, check_dtype(datatype));
    LOOM_ASSIGN_OR_RETURN(ResolvedOp ro, resolve_op(c, op, dt));
    const size_t p = static_cast<size_t>(c->nranks);
    LOOM_RETURN_IF_ERROR(check_count(recvcount, dt, p));
    if (recvcount == 0) return Status::ok();
    LOOM_RETURN_IF_ERROR(check_buffer(sendbuff, recvcount * p * dtype_size(dt), "sendbuff"));
    LOOM_RETURN_IF_ERROR(check_buffer(recvbuff, recvcount * dtype_size(dt), "recvbuff"));
    return run(c, stream, Collective::kReduceScatter, recvcount * p * dtype_size(dt),
               [=](Comm& lc, Completion& done, StreamOp* so) {
                 const void* in = reduction_input(sendbuff, recvcount * p, dt, ro.premul, done, so);
                 return add_work(lc.reduce_scatter(in, recvbuff, recvcount, dt, ro.op), done);
               });
  });
}

extern "C" ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                       ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclAllGather", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, ready_comm(comm));
    LOOM_ASSIGN_OR_RETURN(DataType dt, check_dtype(datatype));
    const size_t p = static_cast<size_t>(c->nranks);
    LOOM_RETURN_IF_ERROR(check_count(sendcount, dt, p));
    if (sendcount == 0) return Status::ok();
    LOOM_RETURN_IF_ERROR(check_buffer(sendbuff, sendcount * dtype_size(dt), "sendbuff"));
    LOOM_RETURN_IF_ERROR(check_buffer(recvbuff, sendcount * p * dtype_size(dt), "recvbuff"));
    return run(c, stream, Collective::kAllGather, sendcount * p * dtype_size(dt),
               [=](Comm& lc, Completion& done, StreamOp* so) {
                 return add_work(lc.all_gather(sendbuff, recvbuff, sendcount, dt), done);
               });
  });
}

extern "C" ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, int root, ncclComm_t comm,
                                       cudaStream_t stream) {
  return guard("ncclBroadcast", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, ready_comm(comm));
    LOOM_ASSIGN_OR_RETURN(DataType dt, check_dtype(datatype));
    LOOM_RETURN_IF_ERROR(check_rank(c, root, "root"));
    LOOM_RETURN_IF_ERROR(check_count(count, dt, 1));
    if (count == 0) return Status::ok();
    if (c->rank == root) LOOM_RETURN_IF_ERROR(check_buffer(sendbuff, count * dtype_size(dt), "sendbuff (at root)"));
    LOOM_RETURN_IF_ERROR(check_buffer(recvbuff, count * dtype_size(dt), "recvbuff"));
    return run(c, stream, Collective::kBroadcast, count * dtype_size(dt), [=](Comm& lc, Completion& done, StreamOp* so) {
      return add_work(lc.broadcast(sendbuff, recvbuff, count, dt, root), done);
    });
  });
}

extern "C" ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                   ncclComm_t comm, cudaStream_t stream) {
  return pncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

extern "C" ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclAlltoAll", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, ready_comm(comm));
    LOOM_ASSIGN_OR_RETURN(DataType dt, check_dtype(datatype));
    const size_t p = static_cast<size_t>(c->nranks);
    LOOM_RETURN_IF_ERROR(check_count(count, dt, p));
    if (count == 0) return Status::ok();
    LOOM_RETURN_IF_ERROR(check_buffer(sendbuff, count * p * dtype_size(dt), "sendbuff"));
    LOOM_RETURN_IF_ERROR(check_buffer(recvbuff, count * p * dtype_size(dt), "recvbuff"));
    return run(c, stream, Collective::kAllToAll, count * p * dtype_size(dt),
               [=](Comm& lc, Completion& done, StreamOp* so) {
                 return add_work(lc.all_to_all(sendbuff, recvbuff, count, dt), done);
               });
  });
}

extern "C" ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, int root, ncclComm_t comm,
                                    cudaStream_t stream) {
  return guard("ncclGather", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, ready_comm(comm));
    LOOM_ASSIGN_OR_RETURN(DataType dt, check_dtype(datatype));
    LOOM_RETURN_IF_ERROR(check_rank(c, root, "root"));
    LOOM_RETURN_IF_ERROR(check_count(count, dt, static_cast<size_t>(c->nranks)));
    if (count == 0) return Status::ok();
    LOOM_RETURN_IF_ERROR(check_buffer(sendbuff, count * dtype_size(dt), "sendbuff"));
    if (c->rank == root)
      LOOM_RETURN_IF_ERROR(check_buffer(recvbuff, count * c->nranks * dtype_size(dt), "recvbuff (at root)"));
    const int rank = c->rank, nranks = c->nranks;
    return run(c, stream, Collective::kSendRecv, count * dtype_size(dt), [=](Comm& lc, Completion& done, StreamOp* so) {
      return rooted_p2p(lc, done, rank, nranks, root, count, dt,
                        static_cast<const std::byte*>(sendbuff), static_cast<std::byte*>(recvbuff),
                        true);
    });
  });
}

extern "C" ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  return guard("ncclScatter", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, ready_comm(comm));
    LOOM_ASSIGN_OR_RETURN(DataType dt, check_dtype(datatype));
    LOOM_RETURN_IF_ERROR(check_rank(c, root, "root"));
    LOOM_RETURN_IF_ERROR(check_count(count, dt, static_cast<size_t>(c->nranks)));
    if (count == 0) return Status::ok();
    if (c->rank == root)
      LOOM_RETURN_IF_ERROR(check_buffer(sendbuff, count * c->nranks * dtype_size(dt), "sendbuff (at root)"));
    LOOM_RETURN_IF_ERROR(check_buffer(recvbuff, count * dtype_size(dt), "recvbuff"));
    const int rank = c->rank, nranks = c->nranks;
    return run(c, stream, Collective::kSendRecv, count * dtype_size(dt), [=](Comm& lc, Completion& done, StreamOp* so) {
      return rooted_p2p(lc, done, rank, nranks, root, count, dt,
                        static_cast<const std::byte*>(sendbuff), static_cast<std::byte*>(recvbuff),
                        false);
    });
  });
}

extern "C" ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                  int peer, ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclSend", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, ready_comm(comm));
    LOOM_ASSIGN_OR_RETURN(DataType dt, check_dtype(datatype));
    LOOM_RETURN_IF_ERROR(check_rank(c, peer, "peer"));
    LOOM_RETURN_IF_ERROR(check_count(count, dt, 1));
    if (count == 0) return Status::ok();
    LOOM_RETURN_IF_ERROR(check_buffer(sendbuff, count * dtype_size(dt), "sendbuff"));
    return run(c, stream, Collective::kSendRecv, count * dtype_size(dt), [=](Comm& lc, Completion& done, StreamOp* so) {
      return add_work(lc.send(sendbuff, count, dt, peer), done);
    });
  });
}

extern "C" ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                  ncclComm_t comm, cudaStream_t stream) {
  return guard("ncclRecv", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, ready_comm(comm));
    LOOM_ASSIGN_OR_RETURN(DataType dt, check_dtype(datatype));
    LOOM_RETURN_IF_ERROR(check_rank(c, peer, "peer"));
    LOOM_RETURN_IF_ERROR(check_count(count, dt, 1));
    if (count == 0) return Status::ok();
    LOOM_RETURN_IF_ERROR(check_buffer(recvbuff, count * dtype_size(dt), "recvbuff"));
    return run(c, stream, Collective::kSendRecv, count * dtype_size(dt), [=](Comm& lc, Completion& done, StreamOp* so) {
      return add_work(lc.recv(recvbuff, count, dt, peer), done);
    });
  });
}

extern "C" ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                                  ncclDataType_t datatype,
                                                  ncclScalarResidence_t residence,
                                                  ncclComm_t comm) {
  return guard("ncclRedOpCreatePreMulSum", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, ready_comm(comm));
    LOOM_ASSIGN_OR_RETURN(DataType dt, check_dtype(datatype));
    if (op == nullptr) return invalid_argument("op is NULL");
    if (scalar == nullptr) return invalid_argument("scalar is NULL");
    if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
      return invalid_argument("invalid scalar residence " + std::to_string(residence));
    PreMulOp pm;
    pm.dtype = dt;
    pm.immediate = residence == ncclScalarHostImmediate;
    if (pm.immediate) {
      std::memcpy(pm.value, scalar, dtype_size(dt));
    } else {
      // "Device" residence: read when the collective is issued. Without CUDA
      // the pointer is host memory.
      pm.pointer = scalar;
    }
    std::lock_guard<std::mutex> lock(c->mu);
    size_t slot = 0;
    while (slot < c->premul_ops.size() && c->premul_ops[slot]) ++slot;
    if (slot + ncclNumOps > static_cast<size_t>(ncclMaxRedOp))
      return invalid_usage("too many PreMulSum operators");
    if (slot == c->premul_ops.size()) c->premul_ops.emplace_back();
    c->premul_ops[slot] = pm;
    *op = static_cast<ncclRedOp_t>(ncclNumOps + static_cast<int>(slot));
    return Status::ok();
  });
}

extern "C" ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  return guard("ncclRedOpDestroy", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, live_comm(comm));
    int v = static_cast<int>(op);
    if (v >= 0 && v < ncclNumOps)
      return invalid_argument("cannot destroy built-in operator " + std::to_string(v));
    std::lock_guard<std::mutex> lock(c->mu);
    size_t slot = static_cast<size_t>(v) - ncclNumOps;
    if (v < 0 || slot >= c->premul_ops.size() || !c->premul_ops[slot])
      return invalid_argument("operator " + std::to_string(v) +
                              " was not created on this communicator");
    c->premul_ops[slot].reset();
    return Status::ok();
  });
}

LOOM_NCCL_ALIAS(ncclAllReduce)
LOOM_NCCL_ALIAS(ncclReduce)
LOOM_NCCL_ALIAS(ncclReduceScatter)
LOOM_NCCL_ALIAS(ncclAllGather)
LOOM_NCCL_ALIAS(ncclBroadcast)
LOOM_NCCL_ALIAS(ncclBcast)
LOOM_NCCL_ALIAS(ncclAlltoAll)
LOOM_NCCL_ALIAS(ncclGather)
LOOM_NCCL_ALIAS(ncclScatter)
LOOM_NCCL_ALIAS(ncclSend)
LOOM_NCCL_ALIAS(ncclRecv)
LOOM_NCCL_ALIAS(ncclRedOpCreatePreMulSum)
LOOM_NCCL_ALIAS(ncclRedOpDestroy)
