// Communicator state: readiness of background creation, submission of
// operations, and completion of in-flight work for non-blocking comms.
#include <chrono>
#include <thread>

#include "core/comm_impl.h"
#include "shim/shim.h"

namespace loom::shim {

std::byte* Completion::temp(size_t bytes) {
  temps.push_back(std::make_unique<std::byte[]>(bytes == 0 ? 1 : bytes));
  return temps.back().get();
}

bool Completion::done() const {
  for (const Work& w : works)
    if (!w.test()) return false;
  return true;
}

Status Completion::finish() {
  Status first;
  for (const Work& w : works) {
    Status s = w.status();
    if (!s.is_ok() && first.is_ok()) first = s;
  }
  if (first.is_ok())
    for (auto& step : after) step();
  after.clear();
  temps.clear();
  works.clear();
  return first;
}

Status Completion::wait() {
  for (const Work& w : works) (void)w.wait();
  return finish();
}

Status check_handle(ncclComm* comm) {
  if (comm == nullptr) return invalid_argument("comm is NULL");
  if (comm->magic != ncclComm::kMagic)
    return invalid_argument("comm is not a valid communicator (destroyed, or not from ncclCommInit*)");
  return Status::ok();
}

namespace {
constexpr const char* kStillInitializing =
    "communicator is still initializing (non-blocking): poll ncclCommGetAsyncError until it returns "
    "ncclSuccess before using it";
}  // namespace

Result<ncclComm*> live_comm(ncclComm* comm) {
  LOOM_RETURN_IF_ERROR(check_handle(comm));
  if (comm->ready.valid()) {
    // As NCCL's ncclCommEnsureReady (Finalize, Split, Shrink): refused at
    // once while the creation runs, not waited for (it may wait for peers
    // this thread has yet to initialise). NCCL's buffer registration does
    // not check and would race the creation; refused here too. Regression:
    // Finalize, Split, Shrink, Revoke and registrations waited, up to
    // LOOM_TIMEOUT (NcclCompat.EveryCallRefusesACommStillInitializing).
    if (comm->ready.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
      return invalid_argument(kStillInitializing);
    Status s = comm->ready.get();
    if (!s.is_ok()) return s.with_context("communicator creation failed");
  }
  if (comm->comm == nullptr) return invalid_usage("communicator was never created");
  return comm;
}

bool child_job_running(ncclComm* comm) {
  std::shared_future<Status> job;
  {
    std::lock_guard<std::mutex> lock(comm->mu);
    job = comm->child_job;
  }
  return job.valid() && job.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
}

void wait_child_job(ncclComm* comm) {
  std::shared_future<Status> job;
  {
    std::lock_guard<std::mutex> lock(comm->mu);
    job = comm->child_job;
  }
  if (job.valid()) job.wait();
}

Status creation_finished(ncclComm* comm) {
  LOOM_RETURN_IF_ERROR(check_handle(comm));
  if (comm->ready.valid() && comm->ready.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
    return invalid_argument(kStillInitializing);
  // Inside a group the split only starts at GroupEnd in NCCL, so the parent
  // stays usable there.
  if (!in_group() && child_job_running(comm))
    return invalid_argument(
        "a non-blocking split or shrink of this communicator is still running: poll ncclCommGetAsyncError on "
        "it until it returns ncclSuccess before using it");
  return Status::ok();
}

Result<ncclComm*> ready_comm(ncclComm* comm) {
  LOOM_RETURN_IF_ERROR(creation_finished(comm));
  LOOM_ASSIGN_OR_RETURN(ncclComm * c, live_comm(comm));
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->revoked) return invalid_usage("communicator was revoked (ncclCommRevoke)");
  if (c->finalized) return invalid_usage("communicator was finalized (ncclCommFinalize)");
  if (!c->async_error.is_ok()) return c->async_error;
  return c;
}

std::shared_future<Status> start_creation(ncclComm* comm,
                                          std::function<Result<std::unique_ptr<Comm>>()> make) {
  std::shared_future<Status> done =
      std::async(std::launch::async, [comm, make = std::move(make)]() -> Status {
        try {
          Result<std::unique_ptr<Comm>> r = make();
          if (!r.is_ok()) return r.status();
          if (comm == nullptr) return Status::ok();  // a NOCOLOR split: nothing to keep
          if (r.value() == nullptr) return internal_error("split returned no communicator");
          comm->comm = std::move(r).value();
          comm->rank = comm->comm->rank();
          comm->nranks = comm->comm->size();
          return Status::ok();
        } catch (const std::exception& e) {
          return internal_error(std::string("communicator creation threw: ") + e.what());
        } catch (...) {
          return internal_error("communicator creation threw");
        }
      }).share();
  if (comm != nullptr) comm->ready = done;
  return done;
}

namespace {
Status issue_ops(ncclComm* comm, std::vector<PendingOp>& ops, Completion& done);
}  // namespace

Status issue_batch(ncclComm* comm, std::vector<PendingOp>& ops, Completion& done) {
  Status st = issue_ops(comm, ops, done);
  // Stream gates no loom op took: a call that enqueued nothing (a one-rank
  // Gather/Scatter) or a batch loom refused. Finished here, or the stream's
  // host function waits for them for good (regressions: NcclStream.OneRank
  // GatherAndScatterPassTheStream, NcclStream.ARefusedGroupCallPassesTheStream).
  comm->comm->impl()->drop_start_gates(st);
  // Regression: an after_batch failure (cudaLaunchHostFunc, a copy out) was
  // only logged and GroupEnd returned ncclSuccess (NcclStream.AGroupCall
  // WhoseStreamFailsReportsIt).
  Status after;
  for (PendingOp& op : ops)
    if (op.after_batch) {
      Status a = op.after_batch(st);
      if (after.is_ok()) after = a;
    }
  return st.is_ok() ? after : st;
}

namespace {
Status issue_ops(ncclComm* comm, std::vector<PendingOp>& ops, Completion& done) {
  Comm& lc = *comm->comm;
  if (ops.size() == 1) {
    // A lone operation needs no loom group; its own Work is the completion.
    done.collect_works = true;
    return ops.front().issue(lc, done);
  }
  lc.group_start();
  done.collect_works = false;
  Status first;
  for (PendingOp& op : ops) {
    first = op.issue(lc, done);
    if (!first.is_ok()) break;
  }
  // Close the loom group even after a failure so the comm is not left open.
  Result<Work> w = lc.group_end();
  done.collect_works = true;
  if (!first.is_ok()) return first;
  if (!w.is_ok()) return w.status();
  done.add(w.value());
  return Status::ok();
}
}  // namespace

Status settle(ncclComm* comm, Completion done) {
  if (comm->blocking) {
    Status s = done.wait();
    if (!s.is_ok()) {
      std::lock_guard<std::mutex> lock(comm->mu);
      if (comm->async_error.is_ok()) comm->async_error = s;
    }
    return s;
  }
  std::lock_guard<std::mutex> lock(comm->mu);
  comm->inflight.push_back(std::move(done));
  return Status(StatusCode::kInProgress, "operation in progress; poll ncclCommGetAsyncError");
}

Status submit(ncclComm* comm, PendingOp op) {
  if (in_group()) {
    group_record(comm, std::move(op));
    return Status::ok();
  }
  std::vector<PendingOp> one;
  one.push_back(std::move(op));
  Completion done;
  // A blocking communicator waits for the op right here (settle): this thread
  // runs it, the engine need not wake.
  comm->comm->set_caller_waits(comm->blocking);
  Status st = issue_batch(comm, one, done);
  comm->comm->set_caller_waits(false);
  LOOM_RETURN_IF_ERROR(st);
  return settle(comm, std::move(done));
}

Status poll(ncclComm* comm) {
  std::lock_guard<std::mutex> lock(comm->mu);
  auto& list = comm->inflight;
  if (comm->revoked) {
    // NCCL's revoke state: in progress until the communicator is quiescent,
    // then success. The errors of the revoked operations are the revoke's
    // own doing and are not reported.
    for (auto it = list.begin(); it != list.end();) {
      if (it->done()) {
        // Not an async error, but ncclGetLastError says what ended the operation.
        Status s = it->finish();
        if (!s.is_ok()) comm->last_error = s.to_string();
        it = list.erase(it);
      } else {
        ++it;
      }
    }
    if (!list.empty() || (comm->comm != nullptr && !comm->comm->quiescent()))
      return Status(StatusCode::kInProgress, "revoke in progress: operations are still ending");
    return Status::ok();
  }
  for (auto it = list.begin(); it != list.end();) {
    if (!it->done()) {
      ++it;
      continue;
    }
    Status s = it->finish();
    if (!s.is_ok() && comm->async_error.is_ok()) comm->async_error = s;
    it = list.erase(it);
  }
  if (!comm->async_error.is_ok()) return comm->async_error;
  if (comm->comm != nullptr) {
    Status s = comm->comm->async_error();
    if (!s.is_ok()) {
      comm->async_error = s;
      return s;
    }
  }
  if (!list.empty()) return Status(StatusCode::kInProgress, "operations in flight");
  return Status::ok();
}

Status drain(ncclComm* comm) {
  std::vector<Completion> list;
  {
    std::lock_guard<std::mutex> lock(comm->mu);
    list.swap(comm->inflight);
  }
  Status first;
  for (Completion& c : list) {
    Status s = c.wait();
    if (!s.is_ok() && first.is_ok()) first = s;
  }
  std::lock_guard<std::mutex> lock(comm->mu);
  if (!first.is_ok() && comm->async_error.is_ok()) comm->async_error = first;
  return first;
}

}  // namespace loom::shim
