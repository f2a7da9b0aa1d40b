// The shim's single error boundary: Status -> ncclResult_t, last-error text,
// and the catch-all that keeps exceptions from crossing the C ABI.
#include <string_view>
#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "shim/shim.h"

namespace loom::shim {

namespace {
// Per thread, so a thread driving one rank reads its own failure; also per
// communicator, so ncclGetLastError(comm) from a watchdog thread sees that
// comm's failure; and the process's latest, which is all NCCL keeps (its
// ncclLastError, written by every WARN): a thread that failed nothing
// itself reads that, as with NCCL.
thread_local std::string t_last_error;
std::mutex g_last_mu;
std::string g_last_error;  // guarded by g_last_mu
}  // namespace

ncclResult_t to_nccl(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return ncclSuccess;
    case StatusCode::kInvalidArgument: return ncclInvalidArgument;
    // NCCL has no "not supported": it reports unsupported requests as usage errors.
    case StatusCode::kInvalidUsage:
    case StatusCode::kNotSupported: return ncclInvalidUsage;
    case StatusCode::kSystemError: return ncclSystemError;
    // A peer that died, aborted or stopped answering: NCCL's remote error.
    case StatusCode::kRemoteError:
    case StatusCode::kTimeout: return ncclRemoteError;
    // Work failed by a local abort/revoke: the caller used a dead communicator.
    case StatusCode::kAborted: return ncclInvalidUsage;
    case StatusCode::kInternal: return ncclInternalError;
    case StatusCode::kInProgress: return ncclInProgress;
    // As NCCL: a failing CUDA runtime call is ncclUnhandledCudaError.
    // Regression: they were ncclInternalError ("a Loom bug") or ncclSystemError.
    case StatusCode::kCudaError: return ncclUnhandledCudaError;
  }
  return ncclInternalError;
}

void record_error(ncclComm* comm, const Status& s) {
  std::string text = s.to_string();
  if (comm != nullptr && comm->magic == ncclComm::kMagic) {
    std::lock_guard<std::mutex> lock(comm->mu);
    comm->last_error = text;
  }
  {
    std::lock_guard<std::mutex> lock(g_last_mu);
    g_last_error = text;
  }
  t_last_error = std::move(text);
}

const char* last_error(ncclComm* comm) {
  if (comm != nullptr && comm->magic == ncclComm::kMagic) {
    // A copy the caller's thread owns: the comm's string may be replaced by
    // another thread (an op failing, ncclCommGetAsyncError) while the caller
    // still reads it. Regression: the pointer into comm->last_error was
    // returned after the lock was released.
    thread_local std::string t_comm_error;
    std::lock_guard<std::mutex> lock(comm->mu);
    if (!comm->last_error.empty()) {
      t_comm_error = comm->last_error;
      return t_comm_error.c_str();
    }
  }
  if (!t_last_error.empty()) return t_last_error.c_str();
  // Regression: a thread that had failed nothing read "" where NCCL gives
  // the process's last error, e.g. a main thread reporting a failure of the
  // threads that drive the ranks (NcclShimErrors.LastErrorIsPerThread).
  thread_local std::string t_process_error;
  std::lock_guard<std::mutex> lock(g_last_mu);
  t_process_error = g_last_error;
  return t_process_error.c_str();
}

CallScope::CallScope(ncclComm* comm) noexcept {
  if (comm != nullptr && comm->magic == ncclComm::kMagic) {
    comm_ = comm;
    comm_->calls.fetch_add(1, std::memory_order_acq_rel);
  }
}

CallScope::~CallScope() {
  if (comm_) comm_->calls.fetch_sub(1, std::memory_order_acq_rel);
}

bool wait_for_calls(ncclComm* comm, double limit_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  while (comm->calls.load(std::memory_order_acquire) > 0) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

namespace {
// The calls that enqueue work (NCCL's ncclEnqueueCheck).
bool is_enqueue_call(std::string_view api) {
  static constexpr std::string_view kEnqueue[] = {"ncclAllReduce", "ncclReduce",  "ncclReduceScatter",
                                                  "ncclAllGather", "ncclBroadcast", "ncclAlltoAll",
                                                  "ncclGather",    "ncclScatter", "ncclSend", "ncclRecv"};
  return std::find(std::begin(kEnqueue), std::end(kEnqueue), api) != std::end(kEnqueue);
}

// The calls whose failure inside a group fails the group (NCCL runs
// ncclGroupErrCheck in them: enqueue, init, split/shrink, finalize,
// destroy/abort, window registration). Queries, registration, PreMulSum
// operators, memory and ids do not. Regression: every failing call failed
// the group, so e.g. a bad ncclCommCount inside a group dropped its
// collectives (NcclApi.OnlyEnqueueAndLifecycleCallsFailAGroup).
bool fails_group(std::string_view api) {
  static constexpr std::string_view kLifecycle[] = {
      "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitRankScalable", "ncclCommInitAll",
      "ncclCommSplit",    "ncclCommShrink",         "ncclCommFinalize",         "ncclCommDestroy",
      "ncclCommAbort",    "ncclCommWindowRegister"};
  return is_enqueue_call(api) ||
         std::find(std::begin(kLifecycle), std::end(kLifecycle), api) != std::end(kLifecycle);
}

// As NCCL (enqueue.cc, ncclEnqueueCheck): an argument error in a collective
// or send/recv on a non-blocking communicator also becomes its asynchronous
// error, which ncclCommGetAsyncError reports and later calls return.
// Regression: it was only returned (NcclApi.ArgumentErrorOnANonBlockingComm
// IsItsAsyncError).
void note_async_argument_error(ncclComm* comm, std::string_view api, const Status& s) {
  if (comm == nullptr || comm->magic != ncclComm::kMagic || s.code() != StatusCode::kInvalidArgument ||
      !is_enqueue_call(api))
    return;
  // Not the refusal of a comm still being created (or split): its creation
  // sets the state when it ends.
  if (!creation_finished(comm).is_ok()) return;
  std::lock_guard<std::mutex> lock(comm->mu);
  if (!comm->blocking && comm->async_error.is_ok()) comm->async_error = s;
}
}  // namespace

ncclResult_t guard(const char* api, ncclComm* comm, const std::function<Status()>& body) noexcept {
  CallScope in_call(comm);  // until the error is recorded on it
  Status s;
  try {
    s = body();
  } catch (const std::bad_alloc&) {
    s = Status(StatusCode::kSystemError, "out of host memory");
  } catch (const std::exception& e) {
    s = internal_error(std::string("unexpected exception: ") + e.what());
  } catch (...) {
    s = internal_error("unexpected non-standard exception");
  }
  if (s.is_ok()) return ncclSuccess;
  if (s.code() == StatusCode::kInProgress) return ncclInProgress;
  try {
    Status named = s.with_context(api);
    record_error(comm, named);
    note_async_argument_error(comm, api, named);
    if (log_enabled(LogLevel::kWarn)) log(LogLevel::kWarn, named.to_string());
    if (in_group() && fails_group(api)) group_fail(named);
  } catch (...) {
    // Recording is best effort; the code below still tells the caller.
  }
  return to_nccl(s.code());
}

}  // namespace loom::shim
