// Internals of libnccl.so.2: the NCCL C ABI implemented over loom::Comm.
//
// Layout of the shim
//   error.cc     the one error boundary (Status -> ncclResult_t, last error)
//   env.cc       NCCL_* environment variables -> LOOM_*, shim logging
//   comm_state.cc  struct ncclComm: readiness, in-flight work, completion
//   group.cc     thread-local group state, GroupStart/End/SimulateEnd
//   api_init.cc  communicator lifecycle (init, split, shrink, teardown)
//   api_misc.cc  version, errors, queries, memory, registration, windows
//   api_coll.cc  collectives, send/recv, PreMulSum operators
//   staging.cc   CUDA device buffers staged through pinned host memory
//   (PreMulSum scales inputs with kernels::scale, src/kernels/scale.cc)
//   alias.h      nccl* weak aliases of the pnccl* implementations
//
// Threading: a communicator is driven by one thread at a time (NCCL's rule),
// but ncclCommGetAsyncError / ncclGetLastError may come from any thread (a
// watchdog), so everything they touch is under ncclComm::mu.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "loom/comm.h"
#include "loom/status.h"
#include "loom/types.h"
#include "nccl.h"
#include "shim/staging.h"

namespace loom::shim {

// Everything that must outlive an issued operation and what to do after it:
// the Work handles, temporary buffers (PreMulSum inputs) and host-side steps
// that run once the data has arrived (a root's own block in Gather/Scatter).
struct Completion {
  bool collect_works = true;  // false inside a loom group: only group_end's Work counts
  std::vector<Work> works;
  std::vector<std::unique_ptr<std::byte[]>> temps;
  std::vector<std::function<void()>> after;

  void add(const Work& w) {
    if (collect_works && w.valid()) works.push_back(w);
  }
  std::byte* temp(size_t bytes);
  bool done() const;
  // Waits for every Work, then runs `after` if all succeeded. First error wins.
  Status wait();
  // For a finished completion: its status, running `after` on success.
  Status finish();
};

// One NCCL call recorded for submission: what the tuner-less estimate needs,
// and a function that issues the loom operations for it.
struct PendingOp {
  Collective coll = Collective::kAllReduce;
  size_t bytes = 0;  // payload per rank
  std::function<Status(Comm&, Completion&)> issue;
  // Optional: called by issue_batch once the whole batch was issued (or
  // failed, with its status), in batch order; for stream work that must
  // follow every call of the batch (api_coll.cc, CUDA streams).
  // Its failure (a CUDA call) is the batch's error when the batch itself
  // succeeded.
  std::function<Status(const Status&)> after_batch;
};

// A PreMulSum operator made by ncclRedOpCreatePreMulSum.
struct PreMulOp {
  DataType dtype = DataType::kFloat32;
  bool immediate = true;           // ncclScalarHostImmediate: value copied at creation
  std::byte value[8] = {};         // the scalar when immediate
  const void* pointer = nullptr;   // read at issue time otherwise
};

}  // namespace loom::shim

namespace loom::shim {
// A tag for a new communicator's PreMulSum operators, 1..32766, cycling.
uint32_t new_op_tag();
}  // namespace loom::shim

// Behind a registration handle (ncclCommRegister) or an ncclWindow_t.
struct ncclWindow_vidmem {
  void* buff = nullptr;
  size_t size = 0;
  int flags = 0;
  bool window = false;
};

// The object behind ncclComm_t. Global namespace because nccl.h declares
// `typedef struct ncclComm* ncclComm_t`.
struct ncclComm {
  static constexpr uint64_t kMagic = 0x6c6f6f6d636f6d6dULL;  // "loomcomm"
  static constexpr uint64_t kDead = 0xdeadc0dedeadc0deULL;

  uint64_t magic = kMagic;
  std::unique_ptr<loom::Comm> comm;  // set once init succeeded
  int rank = -1;
  int nranks = 0;
  int cuda_dev = 0;
  bool blocking = true;
  std::string name;

  // Creation may run in the background (non-blocking config, or inside a
  // group); `ready` becomes valid then and holds the creation status.
  std::shared_future<loom::Status> ready;
  // Set by ncclCommAbort: an init still waiting for its peers fails at once
  // (loom::Config::cancel). Null for split/shrink/InitAll.
  std::shared_ptr<std::atomic<bool>> init_cancel;
  // A split or shrink of this communicator running in the background (a
  // non-blocking child, or one created in a group); guarded by mu. While it
  // runs, the parent is in progress (ncclCommGetAsyncError) and refuses
  // other use, and Destroy/Abort wait for it: it uses the parent.
  std::shared_future<loom::Status> child_job;

  // Operations recorded while a group is open on this thread.
  std::vector<loom::shim::PendingOp> group_ops;

  // API calls inside this communicator right now (CallScope). ncclCommAbort
  // comes from another thread to end a hung call (PyTorch's watchdog): it
  // wakes the call, then waits for it to leave before freeing anything.
  std::atomic<int> calls{0};

  std::mutex mu;  // guards everything below
  std::vector<loom::shim::Completion> inflight;  // non-blocking comms
  loom::Status async_error;                      // first failure seen
  std::string last_error;
  bool revoked = false;
  bool finalized = false;
  std::map<void*, std::unique_ptr<ncclWindow_vidmem>> registrations;  // by handle
  std::vector<std::optional<loom::shim::PreMulOp>> premul_ops;
  // Carried in the values of this communicator's PreMulSum operators
  // (op_value in api_coll.cc): an operator of another communicator is
  // refused, as NCCL's ncclUserRedOpMangle does, instead of naming this
  // communicator's operator in the same slot.
  const uint32_t op_tag = loom::shim::new_op_tag();
  // Pinned host buffers for staging CUDA device buffers (staging.h); last
  // member, so freed after everything else.
  loom::shim::StagingRef staging;
};

namespace loom::shim {

// ---- error.cc ------------------------------------------------------------
ncclResult_t to_nccl(StatusCode code);
// Records `s` as the last error of `comm` (may be null) and of this thread.
void record_error(ncclComm* comm, const Status& s);
const char* last_error(ncclComm* comm);

// The error boundary every pnccl* entry point goes through: runs `body`,
// converts its Status, records failures for ncclGetLastError, and turns any
// exception into an ncclResult_t so none crosses the C ABI.
ncclResult_t guard(const char* api, ncclComm* comm, const std::function<Status()>& body) noexcept;

// Counts a call inside `comm` (guard, and ncclGroupEnd for each comm of the
// group) so that an abort from another thread does not free it under the
// call. Nothing for NULL or dead handles.
class CallScope {
 public:
  explicit CallScope(ncclComm* comm) noexcept;
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  ncclComm* comm_ = nullptr;
};
// Waits until no call is inside `comm` but the caller's own (up to
// `limit_s`); false if one still is (the caller must not free it then).
bool wait_for_calls(ncclComm* comm, double limit_s);

// ---- env.cc --------------------------------------------------------------
// Copies NCCL_* settings to LOOM_* (once per process, before the first comm).
void apply_nccl_env();
enum class LogLevel { kWarn = 1, kInfo = 2, kTrace = 3 };
bool log_enabled(LogLevel level);
// The shim's own messages (only when NCCL_DEBUG or LOOM_DEBUG asks for them),
// written by Loom's logger under `subsys`; warnings pass every subsystem
// filter, as NCCL's WARN.
void log(LogLevel level, const std::string& msg, unsigned subsys = ~0u /* loom::kLogAll */);
// NCCL_ALGO -> LOOM_ALGO ("" when nothing translates); untranslated parts
// are appended to `dropped`.
std::string translate_nccl_algo(const std::string& nccl_algo, std::vector<std::string>* dropped);
// NCCL_DEBUG_SUBSYS -> LOOM_DEBUG_SUBSYS (NCCL's names for Loom's subsystems).
std::string translate_debug_subsys(const std::string& nccl_subsys);
// NCCL_COMM_BLOCKING: 0 or 1 overrides every communicator's
// ncclConfig_t.blocking (as NCCL); unset or another value: nullopt.
std::optional<bool> blocking_from_env();

// ---- comm_state.cc -------------------------------------------------------
// As NCCL's ncclCommEnsureReady: ncclInvalidArgument at once while a
// non-blocking creation still runs (instead of waiting for it here, up to
// LOOM_TIMEOUT). Regression: queries and collectives on such a comm
// blocked (NcclApi.ACommStillInitializingIsRefusedAtOnce).
Status creation_finished(ncclComm* comm);
// A background split/shrink of `comm` is still running (child_job).
bool child_job_running(ncclComm* comm);
// Waits for it, if any (teardown of the parent).
void wait_child_job(ncclComm* comm);
// Validates a handle whose creation finished (creation_finished); fails
// with the creation error or the comm's async error, or kInvalidUsage
// after revoke or finalize.
Result<ncclComm*> ready_comm(ncclComm* comm);
// Like ready_comm but accepts a revoked communicator (for teardown).
Result<ncclComm*> live_comm(ncclComm* comm);
Status check_handle(ncclComm* comm);
// Runs `op` now (outside a group) or records it for GroupEnd. Outside a
// group, blocking comms wait for completion; non-blocking ones return
// kInProgress and complete through ncclCommGetAsyncError.
Status submit(ncclComm* comm, PendingOp op);
// Issues a batch of recorded ops on one comm inside one loom group.
Status issue_batch(ncclComm* comm, std::vector<PendingOp>& ops, Completion& done);
// Completes (blocking) or parks (non-blocking) a completion.
Status settle(ncclComm* comm, Completion done);
// Polls in-flight work: ok, kInProgress, or the first error. After revoke:
// kInProgress until the communicator is quiescent, then ok.
Status poll(ncclComm* comm);
// Waits for all in-flight work of a comm.
Status drain(ncclComm* comm);
// Starts creating a communicator in the background; `make` returns it and
// `comm` (null for a NOCOLOR split) receives it. Sets comm->ready.
std::shared_future<Status> start_creation(ncclComm* comm,
                                          std::function<Result<std::unique_ptr<Comm>>()> make);

// ---- group.cc ------------------------------------------------------------
bool in_group();
// Records `op` for the group and remembers the comm.
void group_record(ncclComm* comm, PendingOp op);
// A creation (init or split) started inside the group; GroupEnd waits for
// it when `blocking`, else leaves it to ncclCommGetAsyncError.
void group_add_creation(std::shared_future<Status> done, bool blocking);
// Marks the open group failed (NCCL discards a group whose call failed).
void group_fail(const Status& s);
// Drops `comm`'s calls from this thread's open group: it is being destroyed
// or aborted, and the group must not reach it at GroupEnd.
void group_forget(ncclComm* comm);

// ---- api_coll.cc ---------------------------------------------------------
Result<DataType> check_dtype(ncclDataType_t dt);

}  // namespace loom::shim
