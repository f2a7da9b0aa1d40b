// Collectives, point-to-point and PreMulSum operators.
//
// Every entry point checks its arguments the way NCCL does (same result
// codes), then hands a PendingOp to submit(): run now and wait (blocking
// comm), run now and poll later (non-blocking comm), or record for GroupEnd.
// Buffers are host memory. Without a usable CUDA runtime the stream argument
// has no meaning and is ignored. With one (src/cuda/cuda_loader.h), device
// buffers are staged through pinned host memory (staging.h; refused when the
// runtime lacks the functions for that) and the host op is ordered on the
// stream: it is enqueued at once (so every rank's issue order is its call
// order), held back by a StartGate until a host function launched on the
// stream runs, and the stream then waits for the op (a flag word with
// cuStreamWaitValue32, else that host function waits), so the stream's later
// work sees the result. The caller does not wait for the stream.
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "core/comm_impl.h"
#include "core/config.h"
#include "cuda/cuda_loader.h"
#include "kernels/host_reduce.h"
#include "shim/alias.h"
#include "shim/shim.h"
#include "shim/staging.h"

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
  // A group's calls on one stream share one StreamOp (one gate, one host
  // function): a blocking host function per call would wait for the group's
  // op while the stream still holds the gates of the calls after it.
  bool gate_added = false;
  bool launched = false;
  // With cuStreamWaitValue32: the comm's flag word and this op's ticket on it.
  FlagTicket flag;
};

// How long a thread waiting for a stream-ordered op polls before it sleeps
// (LOOM_ENGINE_SPIN_US, read once).
int gate_spin_us() {
  static const int us = loom::params::engine_spin_us();
  return us;
}

// Runs on the stream's host-function thread when the stream reaches the call.
void stream_reached(void* arg) {
  std::unique_ptr<std::shared_ptr<StreamOp>> holder(static_cast<std::shared_ptr<StreamOp>*>(arg));
  StreamOp& so = **holder;
  for (auto& f : so.before) f();
  so.gate->open();
  Status st = so.gate->wait_finished(gate_spin_us());
  if (so.owns_completion) st = so.done.wait();  // Gather/Scatter's root block, temporaries
  // A failure has already marked the loom communicator failed; the user sees
  // it from ncclCommGetAsyncError and from the next call.
  if (!st.is_ok() && log_enabled(LogLevel::kWarn)) log(LogLevel::kWarn, "stream-ordered op failed: " + st.to_string());
}

// Sets the word the stream waits on once the op (and a lone call's
// completion steps) finished. Off the stream: host functions may not wait for
// work that needs another stream's host function (CUDA may serialize them).
void flag_when_finished(std::shared_ptr<StreamOp> so) {
  Status st = so->gate->wait_finished(gate_spin_us());
  if (so->owns_completion) {
    Status cs = so->done.wait();
    if (st.is_ok()) st = cs;
  }
  if (!st.is_ok() && log_enabled(LogLevel::kWarn)) log(LogLevel::kWarn, "stream-ordered op failed: " + st.to_string());
  // The word stays allocated while this thread stores to it (the lease); the
  // call's release host function holds it until the stream has read it.
  FlagTicket flag = so->flag;
  so.reset();
  flag.done();
}

// The host function of the flag path: start the op and return.
void stream_reached_async(void* arg) {
  std::unique_ptr<std::shared_ptr<StreamOp>> holder(static_cast<std::shared_ptr<StreamOp>*>(arg));
  std::shared_ptr<StreamOp> so = *holder;
  for (auto& f : so->before) f();
  so->gate->open();
  run_off_stream([so = std::move(so)]() mutable { flag_when_finished(std::move(so)); });
}

// Fallback when the driver refuses the wait: a host function that waits.
void wait_flag(void* arg) {
  std::unique_ptr<std::shared_ptr<StreamOp>> holder(static_cast<std::shared_ptr<StreamOp>*>(arg));
  const FlagTicket& flag = (*holder)->flag;
  while (!flag_reached(flag.word, flag.wait_value())) std::this_thread::sleep_for(std::chrono::microseconds(20));
}

// Puts the op on the stream: the stream starts it and waits for it, so the
// stream's later work sees the result. With cuStreamWaitValue32 and pinned
// memory the stream waits on the comm's flag word (no host function blocks);
// else a host function waits for the op (fine where each stream has its own
// host-function thread). The caller keeps so->flag.lease until the stream
// has passed the wait (finish_plan's release).
Status launch_on_stream(ncclComm* c, const cuda::CudaRuntimeApi& rt, cudaStream_t stream, std::shared_ptr<StreamOp> so) {
  auto cs = reinterpret_cast<cuda::CudaStream>(stream);
  if (rt.stream_wait_value32 != nullptr && rt.can_stage()) {
    Result<FlagTicket> flag = c->staging.get(rt)->next_flag_ticket();
    if (flag.is_ok()) {
      so->flag = flag.value();
      const unsigned long long addr = so->flag.device_address;
      auto* arg = new std::shared_ptr<StreamOp>(so);
      cuda::CudaError e = rt.launch_host_func(cs, &stream_reached_async, arg);
      if (e != cuda::kCudaSuccess) {
        delete arg;
        so->flag.done();  // no stream waits for it; the later tickets must not wait for it either
        so->flag = FlagTicket{};
        return cuda_error("cudaLaunchHostFunc failed: " + cuda::CudaLoader::get().error_text(e));
      }
      if (int r = rt.stream_wait_value32(cs, addr, so->flag.wait_value(), cuda::kCuStreamWaitValueGeq); r != 0) {
        static std::once_flag warned;
        std::call_once(warned, [r] {
          if (log_enabled(LogLevel::kWarn))
            log(LogLevel::kWarn, "cuStreamWaitValue32 failed (CUresult " + std::to_string(r) +
                                     "); streams wait for ops in host functions instead");
        });
        auto* warg = new std::shared_ptr<StreamOp>(so);
        if (rt.launch_host_func(cs, &wait_flag, warg) != cuda::kCudaSuccess) delete warg;
      }
      return Status::ok();
    }
  }
  auto* arg = new std::shared_ptr<StreamOp>(so);
  cuda::CudaError e = rt.launch_host_func(reinterpret_cast<cuda::CudaStream>(stream), &stream_reached, arg);
  if (e == cuda::kCudaSuccess) return Status::ok();
  delete arg;
  return cuda_error("cudaLaunchHostFunc failed: " + cuda::CudaLoader::get().error_text(e));
}

struct ResolvedOp {
  RedOp op = RedOp::kSum;
  std::optional<PreMulOp> premul;
};

}  // namespace

uint32_t loom::shim::new_op_tag() {
  static std::atomic<uint32_t> next{0};
  return 1 + next.fetch_add(1, std::memory_order_relaxed) % 32766;
}

namespace {

// A PreMulSum operator's value: ncclNumOps + (communicator tag << 16) +
// slot. Regression: it was ncclNumOps + slot on every communicator, so an
// operator used on another communicator silently took that one's operator
// (another scalar: wrong results), and ncclRedOpDestroy destroyed it.
constexpr int kOpSlotBits = 16;
constexpr size_t kMaxOpSlots = size_t{1} << kOpSlotBits;
ncclRedOp_t op_value(const ncclComm* c, size_t slot) {
  return static_cast<ncclRedOp_t>(ncclNumOps + static_cast<int>((c->op_tag << kOpSlotBits) | slot));
}
// The slot of a PreMulSum operator of `c`, or an error naming what is wrong.
Result<size_t> op_slot(const ncclComm* c, int v) {
  if (v < ncclNumOps) return invalid_argument("invalid reduction operator " + std::to_string(v));
  const uint32_t rel = static_cast<uint32_t>(v - ncclNumOps);
  const size_t slot = rel & (kMaxOpSlots - 1);
  if ((rel >> kOpSlotBits) != c->op_tag)
    return invalid_argument("reduction operator " + std::to_string(v) +
                            " is not one of this communicator's (ncclRedOpCreatePreMulSum on another "
                            "communicator, or not an operator)");
  if (slot >= c->premul_ops.size() || !c->premul_ops[slot])
    return invalid_argument("reduction operator " + std::to_string(v) + " was destroyed (ncclRedOpDestroy)");
  return slot;
}

Result<ResolvedOp> resolve_op(ncclComm* c, ncclRedOp_t op, DataType dt) {
  int v = static_cast<int>(op);
  if (v >= 0 && v < ncclNumOps) return ResolvedOp{static_cast<RedOp>(v), std::nullopt};
  std::lock_guard<std::mutex> lock(c->mu);
  LOOM_ASSIGN_OR_RETURN(size_t slot, op_slot(c, v));
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
// Returns true for CUDA device memory the call can stage through host memory.
Result<bool> check_buffer(const void* p, size_t bytes, const char* name) {
  if (p == nullptr) return invalid_argument(std::string(name) + " is NULL");
  if (bytes == 0) return false;
  if (const cuda::CudaRuntimeApi* rt = cuda_runtime()) {
    // Host, managed and unregistered (plain malloc) memory run on the host
    // engine; an error means the runtime does not know the pointer: host.
    cuda::CudaPointerAttributes a;
    if (rt->pointer_get_attributes(&a, p) == cuda::kCudaSuccess && a.type == cuda::CudaMemoryType::kDevice) {
      if (rt->can_stage()) return true;
      return invalid_argument(std::string(name) + " " + fmt_ptr(p) + " is CUDA device memory (device " +
                              std::to_string(a.device) +
                              "); this Loom runs collectives on host buffers only: device buffers need the "
                               "CUDA memory backend, which is not built yet (this CUDA runtime lacks "
                              "cudaMemcpyAsync/cudaMallocHost/cudaFreeHost for staging)");
    }
  }
  char probe[2];
  iovec local{probe, sizeof probe};
  iovec remote[2] = {{const_cast<void*>(p), 1},
                     {static_cast<char*>(const_cast<void*>(p)) + bytes - 1, 1}};
  if (process_vm_readv(getpid(), &local, 1, remote, 2, 0) < 0 && errno == EFAULT)
    return invalid_argument(std::string(name) + " " + fmt_ptr(p) + " (" + std::to_string(bytes) +
                            " bytes) is not readable host memory; a device pointer? This "
                            "libnccl has no CUDA support");
  return false;  // other errors (EPERM, ENOSYS under seccomp): no probe
}

// The key under which calls on `stream` share staging buffers (StagingPool::
// take): 0 for the handles that name different streams by thread or device
// (0 and cudaStreamLegacy: each device's legacy stream; cudaStreamPerThread:
// each thread's), whose calls do not share.
uintptr_t stream_key(cudaStream_t stream) {
  const auto v = reinterpret_cast<uintptr_t>(stream);
  return v <= 2 ? 0 : v;
}

// One user buffer of a call; unused ones (a non-root's recvbuff) are not checked.
struct Use {
  const void* p = nullptr;
  size_t bytes = 0;
  const char* name = "";
  bool used = false;
};

// Checks a call's buffers and stages the device ones: `send` (read) and
// `recv` (written) are replaced by their host copies. `plan` stays null when
// nothing is staged. A device PreMulSum scalar is staged too.
Status stage_buffers(ncclComm* c, cudaStream_t stream, const void*& send, void*& recv, const Use& su, const Use& ru,
                     std::shared_ptr<StagePlan>& plan, std::optional<PreMulOp>* pm = nullptr) {
  bool any = false;
  if (su.used) {
    LOOM_ASSIGN_OR_RETURN(bool dev, check_buffer(su.p, su.bytes, su.name));
    any |= dev;
  }
  if (ru.used) {
    LOOM_ASSIGN_OR_RETURN(bool dev, check_buffer(ru.p, ru.bytes, ru.name));
    any |= dev;
  }
  const cuda::CudaRuntimeApi* rt = cuda_runtime();
  const bool device_scalar = pm != nullptr && pm->has_value() && !(*pm)->immediate && rt != nullptr &&
                             rt->can_stage();
  if (!any && !device_scalar) return Status::ok();
  auto p = std::make_shared<StagePlan>(*rt, c->staging.get(*rt), stream_key(stream));
  // The larger buffer first: an in-place smaller one then shares its copy.
  const bool send_first = !ru.used || (su.used && su.bytes >= ru.bytes);
  for (int i = 0; i < 2; ++i) {
    if ((i == 0) == send_first) {
      if (!su.used) continue;
      LOOM_ASSIGN_OR_RETURN(void* h, p->map(su.p, su.bytes, true, false));
      send = h;
    } else {
      if (!ru.used) continue;
      LOOM_ASSIGN_OR_RETURN(void* h, p->map(ru.p, ru.bytes, false, true));
      recv = h;
    }
  }
  if (device_scalar) {
    LOOM_ASSIGN_OR_RETURN(void* h, p->map((*pm)->pointer, dtype_size((*pm)->dtype), true, false));
    (*pm)->pointer = h;
  }
  if (!p->empty()) plan = std::move(p);
  return Status::ok();
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
      kernels::scale(t, send, n, dt, op.immediate ? static_cast<const void*>(op.value) : op.pointer);
    });
    return t;
  }
  kernels::scale(t, send, n, dt, pm->immediate ? static_cast<const void*>(pm->value) : pm->pointer);
  return t;
}

Status add_work(Result<Work> w, Completion& done) {
  if (!w.is_ok()) return w.status();
  done.add(w.value());
  return Status::ok();
}

// `so` is the call's stream state, null when the stream is ignored.
using Issue = std::function<Status(Comm&, Completion&, StreamOp*)>;

// The StreamOp a group's call on (comm, stream) joins: one per pair and group.
std::shared_ptr<StreamOp> group_stream_op(ncclComm* c, cudaStream_t stream) {
  struct Entry {
    ncclComm* comm;
    cudaStream_t stream;
    std::weak_ptr<StreamOp> so;
  };
  thread_local std::vector<Entry> open_ops;
  // Launched (issued by an earlier GroupEnd) or dropped (a discarded group): done.
  std::erase_if(open_ops, [](const Entry& e) {
    auto so = e.so.lock();
    return so == nullptr || so->launched;
  });
  for (const Entry& e : open_ops)
    if (e.comm == c && e.stream == stream) return e.so.lock();
  auto so = std::make_shared<StreamOp>();
  open_ops.push_back({c, stream, so});
  return so;
}

// Copies out what the op wrote (when it ran), lets later calls on the stream
// reuse the staging, and gives it (and `flag`, the flag word's buffer, which
// the stream reads until it passes the wait) back once the stream is past the
// copies: one host function for both.
// A failed copy out is the call's error (regression: only logged, and the
// call returned ncclSuccess with the device buffer never written).
Status finish_plan(const std::shared_ptr<StagePlan>& plan, cudaStream_t stream, bool ran,
                   std::shared_ptr<StagingLease> flag) {
  auto cs = reinterpret_cast<cuda::CudaStream>(stream);
  Status out;
  if (plan != nullptr) {
    if (ran) out = plan->enqueue_copy_out(cs);
    plan->hand_to_stream();
  }
  if (plan != nullptr || flag != nullptr) {
    const cuda::CudaRuntimeApi* rt = cuda_runtime();
    (void)keep_until_passed(*rt, cs, std::make_shared<std::pair<std::shared_ptr<StagePlan>, std::shared_ptr<StagingLease>>>(
                                         plan, std::move(flag)));
  }
  return out;
}

Status run(ncclComm* c, cudaStream_t stream, Collective coll, size_t bytes, Issue issue,
           std::shared_ptr<StagePlan> plan = nullptr) {
  PendingOp op;
  op.coll = coll;
  op.bytes = bytes;
  const cuda::CudaRuntimeApi* rt = cuda_runtime();
  if (rt == nullptr) {
    op.issue = [issue = std::move(issue)](Comm& lc, Completion& done) { return issue(lc, done, nullptr); };
    return submit(c, std::move(op));
  }
  auto cs = reinterpret_cast<cuda::CudaStream>(stream);
  // A call captured into a CUDA graph would be recorded once (the loom op
  // enqueued at capture time, host functions whose arguments the first
  // replay frees) and replayed without Loom: memory corruption on the
  // second replay. Refused with the reason instead (NCCL supports capture;
  // Loom does not yet). Regression: NcclStream.CapturedCallsAreRefused.
  if (rt->stream_is_capturing != nullptr) {
    int capturing = 0;
    if (rt->stream_is_capturing(cs, &capturing) == cuda::kCudaSuccess && capturing != 0)
      return invalid_usage("the stream is being captured into a CUDA graph, which Loom does not support: run the "
                           "collective outside the capture (e.g. disable CUDA graphs for it)");
  }
  if (in_group()) {
    // Issued at GroupEnd (group.cc), inside the group's one loom op. Each
    // call's copies in go on the stream as it is issued; after the batch
    // (after_batch) each (comm, stream) gets its one host function, then the
    // calls' copies out. GroupEnd completes the group as for host calls.
    auto so = group_stream_op(c, stream);
    auto issued = std::make_shared<bool>(false);
    op.issue = [issue = std::move(issue), so, plan, cs, issued](Comm& lc, Completion& done) -> Status {
      if (plan != nullptr) LOOM_RETURN_IF_ERROR(plan->enqueue_copy_in(cs));
      if (!so->gate_added) {
        lc.impl()->add_start_gate(so->gate);
        so->gate_added = true;
      }
      Status st = issue(lc, done, so.get());
      *issued = st.is_ok();
      return st;
    };
    op.after_batch = [so, plan, c, stream, rt, issued](const Status& batch) -> Status {
      Status launched;
      if (so->gate_added && !so->launched) {
        so->launched = true;
        if (Status ls = launch_on_stream(c, *rt, stream, so); !ls.is_ok()) {
          launched = ls;
          for (auto& f : so->before) f();
          so->gate->open();  // never leave the group's op waiting
          // (Not waited for here: the op may need gates of later calls of
          // the batch, launched by their after_batch. The copies out are
          // then not ordered after it; the call reports the failure.)
        }
      }
      so->launched = true;
      Status out = finish_plan(plan, stream, batch.is_ok() && *issued, so->flag.lease);
      return launched.is_ok() ? out : launched;
    };
    return submit(c, std::move(op));
  }
  auto so = std::make_shared<StreamOp>();
  op.issue = [issue = std::move(issue), so](Comm& lc, Completion& done) {
    lc.impl()->add_start_gate(so->gate);
    return issue(lc, done, so.get());
  };
  if (plan != nullptr) {
    if (Status ci = plan->enqueue_copy_in(cs); !ci.is_ok()) {
      (void)finish_plan(plan, stream, false, nullptr);
      return ci;
    }
  }
  std::vector<PendingOp> one;
  one.push_back(std::move(op));
  Completion done;
  Status st = issue_batch(c, one, done);
  if (!st.is_ok()) {
    c->comm->impl()->drop_start_gates(st);
    so->gate->open();  // a partly enqueued call (Gather/Scatter) must not wait for a stream
    (void)done.wait();
    (void)finish_plan(plan, stream, false, nullptr);
    return st;
  }
  so->done = std::move(done);
  so->owns_completion = true;
  if (Status ls = launch_on_stream(c, *rt, stream, so); !ls.is_ok()) {
    // The op is enqueued on every rank: let it run now, unordered, and say so.
    for (auto& f : so->before) f();
    so->gate->open();
    (void)so->gate->wait_finished();
    (void)so->done.wait();
    (void)finish_plan(plan, stream, true, so->flag.lease);
    return ls;
  }
  return finish_plan(plan, stream, true, so->flag.lease);
}

// Gather and Scatter have no loom collective: point-to-point in one loom
// group; the root's own block moves by memcpy once the group has finished.
Status rooted_p2p(Comm& lc, Completion& done, StreamOp* so, int rank, int nranks, int root, size_t count,
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
    // The root's own block needs nothing from the peers. On a stream it moves
    // when the stream reaches the call (after the stream's writes to `send`,
    // staging copies included, and before the copies out).
    if (from != to) {
      if (so != nullptr) so->before.push_back([from, to, bytes] { std::memmove(to, from, bytes); });
      else done.after.push_back([from, to, bytes] { std::memmove(to, from, bytes); });
    }
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
    const size_t n = count * dtype_size(dt);
    std::shared_ptr<StagePlan> plan;
    LOOM_RETURN_IF_ERROR(stage_buffers(c, stream, sendbuff, recvbuff, {sendbuff, n, "sendbuff", true},
                                       {recvbuff, n, "recvbuff", true}, plan, &ro.premul));
    return run(c, stream, Collective::kAllReduce, count * dtype_size(dt),
               [=](Comm& lc, Completion& done, StreamOp* so) {
                 const void* in = reduction_input(sendbuff, count, dt, ro.premul, done, so);
                 return add_work(lc.allreduce(in, recvbuff, count, dt, ro.op), done);
               }, plan);
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
    const size_t n = count * dtype_size(dt);
    std::shared_ptr<StagePlan> plan;
    LOOM_RETURN_IF_ERROR(stage_buffers(c, stream, sendbuff, recvbuff, {sendbuff, n, "sendbuff", true},
                                       {recvbuff, n, "recvbuff (at root)", c->rank == root}, plan, &ro.premul));
    return run(c, stream, Collective::kReduce, count * dtype_size(dt), [=](Comm& lc, Completion& done, StreamOp* so) {
      const void* in = reduction_input(sendbuff, count, dt, ro.premul, done, so);
      return add_work(lc.reduce(in, recvbuff, count, dt, ro.op, root), done);
    }, plan);
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
    std::shared_ptr<StagePlan> plan;
    LOOM_RETURN_IF_ERROR(stage_buffers(c, stream, sendbuff, recvbuff, {sendbuff, recvcount * p * dtype_size(dt), "sendbuff", true},
                                       {recvbuff, recvcount * dtype_size(dt), "recvbuff", true}, plan, &ro.premul));
    return run(c, stream, Collective::kReduceScatter, recvcount * p * dtype_size(dt),
               [=](Comm& lc, Completion& done, StreamOp* so) {
                 const void* in = reduction_input(sendbuff, recvcount * p, dt, ro.premul, done, so);
                 return add_work(lc.reduce_scatter(in, recvbuff, recvcount, dt, ro.op), done);
               }, plan);
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
    std::shared_ptr<StagePlan> plan;
    LOOM_RETURN_IF_ERROR(stage_buffers(c, stream, sendbuff, recvbuff, {sendbuff, sendcount * dtype_size(dt), "sendbuff", true},
                                       {recvbuff, sendcount * p * dtype_size(dt), "recvbuff", true}, plan));
    return run(c, stream, Collective::kAllGather, sendcount * p * dtype_size(dt),
               [=](Comm& lc, Completion& done, StreamOp* so) {
                 return add_work(lc.all_gather(sendbuff, recvbuff, sendcount, dt), done);
               }, plan);
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
    const size_t n = count * dtype_size(dt);
    std::shared_ptr<StagePlan> plan;
    LOOM_RETURN_IF_ERROR(stage_buffers(c, stream, sendbuff, recvbuff, {sendbuff, n, "sendbuff (at root)", c->rank == root},
                                       {recvbuff, n, "recvbuff", true}, plan));
    return run(c, stream, Collective::kBroadcast, count * dtype_size(dt), [=](Comm& lc, Completion& done, StreamOp* so) {
      return add_work(lc.broadcast(sendbuff, recvbuff, count, dt, root), done);
    }, plan);
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
    const size_t n = count * p * dtype_size(dt);
    std::shared_ptr<StagePlan> plan;
    LOOM_RETURN_IF_ERROR(stage_buffers(c, stream, sendbuff, recvbuff, {sendbuff, n, "sendbuff", true},
                                       {recvbuff, n, "recvbuff", true}, plan));
    return run(c, stream, Collective::kAllToAll, count * p * dtype_size(dt),
               [=](Comm& lc, Completion& done, StreamOp* so) {
                 return add_work(lc.all_to_all(sendbuff, recvbuff, count, dt), done);
               }, plan);
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
    std::shared_ptr<StagePlan> plan;
    LOOM_RETURN_IF_ERROR(stage_buffers(c, stream, sendbuff, recvbuff, {sendbuff, count * dtype_size(dt), "sendbuff", true},
                                       {recvbuff, count * c->nranks * dtype_size(dt), "recvbuff (at root)",
                                        c->rank == root},
                                       plan));
    const int rank = c->rank, nranks = c->nranks;
    return run(c, stream, Collective::kSendRecv, count * dtype_size(dt), [=](Comm& lc, Completion& done, StreamOp* so) {
      return rooted_p2p(lc, done, so, rank, nranks, root, count, dt,
                        static_cast<const std::byte*>(sendbuff), static_cast<std::byte*>(recvbuff),
                        true);
    }, plan);
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
    std::shared_ptr<StagePlan> plan;
    LOOM_RETURN_IF_ERROR(stage_buffers(c, stream, sendbuff, recvbuff,
                                       {sendbuff, count * c->nranks * dtype_size(dt), "sendbuff (at root)",
                                        c->rank == root},
                                       {recvbuff, count * dtype_size(dt), "recvbuff", true}, plan));
    const int rank = c->rank, nranks = c->nranks;
    return run(c, stream, Collective::kSendRecv, count * dtype_size(dt), [=](Comm& lc, Completion& done, StreamOp* so) {
      return rooted_p2p(lc, done, so, rank, nranks, root, count, dt,
                        static_cast<const std::byte*>(sendbuff), static_cast<std::byte*>(recvbuff),
                        false);
    }, plan);
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
    void* unused = nullptr;
    std::shared_ptr<StagePlan> plan;
    LOOM_RETURN_IF_ERROR(stage_buffers(c, stream, sendbuff, unused, {sendbuff, count * dtype_size(dt), "sendbuff", true}, {},
                                       plan));
    return run(c, stream, Collective::kSendRecv, count * dtype_size(dt), [=](Comm& lc, Completion& done, StreamOp* so) {
      return add_work(lc.send(sendbuff, count, dt, peer), done);
    }, plan);
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
    const void* unused = nullptr;
    std::shared_ptr<StagePlan> plan;
    LOOM_RETURN_IF_ERROR(stage_buffers(c, stream, unused, recvbuff, {}, {recvbuff, count * dtype_size(dt), "recvbuff", true},
                                       plan));
    return run(c, stream, Collective::kSendRecv, count * dtype_size(dt), [=](Comm& lc, Completion& done, StreamOp* so) {
      return add_work(lc.recv(recvbuff, count, dt, peer), done);
    }, plan);
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
    if (slot >= kMaxOpSlots) return invalid_usage("too many PreMulSum operators on this communicator");
    if (slot == c->premul_ops.size()) c->premul_ops.emplace_back();
    c->premul_ops[slot] = pm;
    *op = op_value(c, slot);
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
    LOOM_ASSIGN_OR_RETURN(size_t slot, op_slot(c, v));
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
