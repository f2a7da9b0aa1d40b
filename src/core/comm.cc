// loom::Comm and loom::Work: the public API, thin over CommImpl.
#include <fmt/format.h>

#include <sched.h>

#include <algorithm>
#include <climits>
#include <thread>

#include "core/hash.h"
#include "core/comm_impl.h"
#include "core/config.h"
#include "core/log.h"

namespace loom {

using detail::CommImpl;

// ---- Work ----------------------------------------------------------------

Status Work::wait(std::chrono::milliseconds timeout) const {
  if (!state_) return Status::ok();  // inner group calls return an empty Work
  auto& s = *state_;
  // Blocking wait: run the communicator's queued ops (ours among them) on this
  // thread when the engine is not already running them: no hand-off to the
  // engine thread and back, which costs two wake-ups per op.
  if (timeout == std::chrono::milliseconds::max() && !s.done.load(std::memory_order_acquire)) {
    if (auto gate = s.gate.lock()) {
      std::unique_lock<detail::GateLock> g(gate->mu, std::try_to_lock);
      if (g.owns_lock() && gate->comm) {
        while (!s.done.load(std::memory_order_acquire) && gate->comm->run_next_queued()) {
        }
        // Still under the gate: destroy() cannot free the comm meanwhile.
        gate->comm->after_waiter_progress();
      }
    }
  }
  // Short spin first (about 20 us, yielding): small collectives finish within
  // microseconds, and a futex sleep + wake-up costs more than that.
  std::chrono::steady_clock::time_point until{};
  for (int i = 0;; ++i) {
    if (s.done.load(std::memory_order_acquire)) return s.status;
    if (i == 0) until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
    if ((i & 63) == 63) {
      if (std::chrono::steady_clock::now() >= until) break;
      sched_yield();
    }
  }
  std::unique_lock<std::mutex> lk(s.mu);
  if (timeout == std::chrono::milliseconds::max()) {
    s.cv.wait(lk, [&] { return s.done.load(std::memory_order_acquire) != 0; });
  } else if (!s.cv.wait_for(lk, timeout, [&] { return s.done.load(std::memory_order_acquire) != 0; })) {
    return timeout_error("Work::wait timed out; the operation is still running");
  }
  return s.status;
}

bool Work::test() const { return !state_ || state_->done.load(std::memory_order_acquire); }

Status Work::status() const {
  if (!state_) return Status::ok();
  if (!state_->done.load(std::memory_order_acquire)) return Status(StatusCode::kInProgress, "operation in progress");
  return state_->status;
}

// ---- creation --------------------------------------------------------------

Result<UniqueId> get_unique_id() {
  LOOM_ASSIGN_OR_RETURN(SockAddr bind, default_listen_addr());
  return make_unique_id(bind, params::timeout_s());
}

Comm::Comm(std::unique_ptr<CommImpl> impl) : impl_(std::move(impl)) {}
Comm::~Comm() = default;

Result<std::unique_ptr<Comm>> Comm::init_rank(const UniqueId& id, int nranks, int rank, const Config& config) {
  if (nranks < 1) return invalid_argument(fmt::format("init: nranks {} < 1", nranks));
  if (rank < 0 || rank >= nranks) return invalid_argument(fmt::format("init: rank {} >= nranks {} (or negative)", rank, nranks));
  LOOM_ASSIGN_OR_RETURN(UidContents uid, decode_uid(id));
  auto impl = CommImpl::create(uid, nranks, rank, config);
  if (!impl.is_ok()) return impl.status().with_context(fmt::format("init rank {}/{}", rank, nranks));
  return std::unique_ptr<Comm>(new Comm(std::move(impl).value()));
}

namespace {

struct EnvBootstrap {
  int rank = -1, size = -1;
  std::string root;
  std::string source;
};

Result<EnvBootstrap> read_env() {
  EnvBootstrap e;
  // A value that is not an integer in int's range reads as -1 (then refused
  // as missing) rather than truncated. Regression: LOOM_WORLD_SIZE=4294967298
  // was world size 2.
  auto num = [](const char* name) -> int {
    const int64_t v = env_int(name, -1);
    return v < 0 || v > INT_MAX ? -1 : static_cast<int>(v);
  };
  std::string master;
  if (env_raw("MASTER_ADDR") && env_raw("MASTER_PORT"))
    master = env_string("MASTER_ADDR", "") + ":" + env_string("MASTER_PORT", "");
  if (env_raw("LOOM_RANK")) {
    e = {num("LOOM_RANK"), num("LOOM_WORLD_SIZE"), env_string("LOOM_ROOT_ADDR", master), "LOOM_RANK/LOOM_WORLD_SIZE"};
  } else if (env_raw("RANK") && env_raw("WORLD_SIZE")) {
    e = {num("RANK"), num("WORLD_SIZE"), env_string("LOOM_ROOT_ADDR", master), "torchrun RANK/WORLD_SIZE"};
  } else if (env_raw("OMPI_COMM_WORLD_RANK")) {
    e = {num("OMPI_COMM_WORLD_RANK"), num("OMPI_COMM_WORLD_SIZE"), env_string("LOOM_ROOT_ADDR", master),
         "Open MPI OMPI_COMM_WORLD_*"};
  } else if (env_raw("SLURM_PROCID")) {
    e = {num("SLURM_PROCID"), num("SLURM_NTASKS"), env_string("LOOM_ROOT_ADDR", master), "Slurm SLURM_PROCID/NTASKS"};
  } else {
    return invalid_argument(
        "init_from_env: no rank in the environment (set LOOM_RANK, LOOM_WORLD_SIZE and LOOM_ROOT_ADDR, or run "
        "under loomrun, torchrun, mpirun or srun)");
  }
  if (e.size < 1)
    return invalid_argument("init_from_env: world size missing, < 1 or not an int (" + e.source + ")");
  if (e.rank < 0) return invalid_argument("init_from_env: rank missing, negative or not an int (" + e.source + ")");
  if (e.rank >= e.size)
    return invalid_argument(fmt::format("init_from_env: rank {} >= world size {} ({})", e.rank, e.size, e.source));
  if (e.root.empty())
    return invalid_argument("init_from_env: no root address (set LOOM_ROOT_ADDR=host:port or MASTER_ADDR/MASTER_PORT)");
  return e;
}

uint64_t env_secret(const EnvBootstrap& e) {
  // Not a cryptographic secret: it rejects strangers and other jobs on the
  // same port. LOOM_SECRET lets a launcher pass a random one (loomrun does).
  // The launchers' per-run ids keep two runs of one command apart: a Slurm
  // step (two sruns of one allocation), an Open MPI 5 / PMIx job, a
  // torchrun restart. The world size is left out: ranks that disagree on
  // it must reach the root, which names the disagreement (regression: they
  // were strangers to each other and waited out their timeout).
  std::string s = env_string("LOOM_SECRET", "") + "|" + e.root + "|" + env_string("TORCHELASTIC_RUN_ID", "") + "|" +
                  env_string("TORCHELASTIC_RESTART_COUNT", "") + "|" + env_string("SLURM_JOB_ID", "") + "." +
                  env_string("SLURM_STEP_ID", "") + "|" + env_string("OMPI_MCA_orte_hnp_uri", "") + "|" +
                  env_string("PMIX_NAMESPACE", "");
  return fnv1a(s);
}

}  // namespace

Result<std::unique_ptr<Comm>> Comm::init_from_env(const Config& config) {
  LOOM_ASSIGN_OR_RETURN(EnvBootstrap e, read_env());
  LOOM_ASSIGN_OR_RETURN(SockAddr root, parse_sockaddr(e.root));
  UidContents uid{env_secret(e), root};
  if (e.rank == 0) {
    double t = config.timeout_s > 0 ? config.timeout_s : params::timeout_s();
    auto bound = start_root(root, uid.secret, t);
    if (!bound.is_ok())
      return bound.status().with_context("init_from_env: rank 0 cannot listen on LOOM_ROOT_ADDR " + e.root);
  }
  LOOM_INFO(kLogInit, "init_from_env: rank {}/{} from {}, root {}", e.rank, e.size, e.source, e.root);
  return init_rank(encode_uid(uid), e.size, e.rank, config);
}

Result<std::vector<std::unique_ptr<Comm>>> Comm::init_all(int nranks, const Config& config) {
  if (nranks < 1) return invalid_argument(fmt::format("init_all: nranks {} < 1", nranks));
  // One process, so one host: the rendezvous stays on loopback.
  LOOM_ASSIGN_OR_RETURN(UniqueId id,
                        make_unique_id(loopback_addr(), config.timeout_s > 0 ? config.timeout_s : params::timeout_s()));
  std::vector<Result<std::unique_ptr<Comm>>> results;
  results.reserve(nranks);
  for (int i = 0; i < nranks; ++i) results.emplace_back(invalid_usage("not started"));
  std::vector<std::thread> threads;
  for (int i = 0; i < nranks; ++i)
    threads.emplace_back([&, i] { results[i] = init_rank(id, nranks, i, config); });
  for (auto& t : threads) t.join();
  std::vector<std::unique_ptr<Comm>> comms;
  for (auto& r : results) {
    if (!r.is_ok()) return r.status();
    comms.push_back(std::move(r).value());
  }
  return comms;
}

Result<std::unique_ptr<Comm>> Comm::split(int color, int key) {
  // Regression: split and shrink after destroy used the released bootstrap
  // (a null dereference) instead of failing as every other call does.
  if (impl_->destroyed()) return invalid_usage("split: communicator used after destroy");
  // A revoked communicator splits through the bootstrap's star rendezvous:
  // its ring obeys the abort flag, and a revoke may have cut it mid-message.
  const bool revoked = impl_->revoked();
  if (!revoked)
    LOOM_RETURN_IF_ERROR(impl_->async_error().is_ok()
                             ? Status::ok()
                             : impl_->async_error().with_context("split on a failed communicator"));
  const int n = impl_->size(), me = impl_->rank();
  struct Entry {
    int32_t color, key, rank, pad;
    UniqueId uid;
  };
  std::vector<Entry> all(n);
  all[me] = {color, key, me, 0, {}};
  Deadline dl = deadline_after(impl_->timeout_s());
  auto allgather = [&](std::vector<Entry>& v) {
    return (revoked ? impl_->bootstrap().star_allgather(v.data(), sizeof(Entry), dl)
                    : impl_->bootstrap().allgather(v.data(), sizeof(Entry), dl))
        .with_context(revoked ? "split after revoke" : "split");
  };
  if (revoked) LOOM_RETURN_IF_ERROR(impl_->wait_quiescent(dl).with_context("split after revoke"));
  LOOM_RETURN_IF_ERROR(allgather(all));
  std::vector<Entry> group;
  for (const auto& e : all)
    if (color >= 0 && e.color == color) group.push_back(e);
  std::sort(group.begin(), group.end(), [](const Entry& a, const Entry& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  // The first member of each group starts its rendezvous root; a second
  // allgather hands the id to the members.
  bool leader = !group.empty() && group.front().rank == me;
  std::vector<Entry> ids(n);
  ids[me] = all[me];
  if (leader) {
    LOOM_ASSIGN_OR_RETURN(ids[me].uid, impl_->bootstrap().new_unique_id(impl_->timeout_s()));
  }
  LOOM_RETURN_IF_ERROR(allgather(ids));
  if (color < 0) return std::unique_ptr<Comm>();
  int new_rank = 0;
  for (size_t i = 0; i < group.size(); ++i)
    if (group[i].rank == me) new_rank = static_cast<int>(i);
  Config cfg = impl_->config();
  cfg.name = fmt::format("{}.split{}", impl_->name(), color);
  // The parent's cancel flag was for the parent's init (comm.h: not looked at
  // after init); regression: a set flag aborted every later split.
  cfg.cancel.reset();
  return init_rank(ids[group.front().rank].uid, static_cast<int>(group.size()), new_rank, cfg);
}

Result<std::unique_ptr<Comm>> Comm::shrink(const std::vector<int>& exclude, bool abort_first, const Config& config) {
  if (impl_->destroyed()) return invalid_usage("shrink: communicator used after destroy");
  const int n = impl_->size(), me = impl_->rank();
  std::vector<int> excl = exclude;
  std::sort(excl.begin(), excl.end());
  excl.erase(std::unique(excl.begin(), excl.end()), excl.end());
  for (int r : excl) {
    if (r < 0 || r >= n)
      return invalid_argument(fmt::format("shrink: excluded rank {} out of range [0, {})", r, n));
    if (r == me)
      return invalid_argument(fmt::format("shrink: rank {} excludes itself (excluded ranks must not call shrink)", me));
  }
  if (static_cast<int>(excl.size()) >= n) return invalid_argument("shrink: every rank is excluded");
  if (abort_first) impl_->abort("aborted by shrink");
  const double timeout = config.timeout_s > 0 ? config.timeout_s : impl_->timeout_s();  // also the child's
  Deadline dl = deadline_after(timeout);
  if (impl_->revoked()) LOOM_RETURN_IF_ERROR(impl_->wait_quiescent(dl).with_context("shrink after revoke"));
  auto id = impl_->bootstrap().shrink_rendezvous(excl, dl, timeout);
  if (!id.is_ok()) return id.status().with_context(fmt::format("shrink of {} rank {}", impl_->name(), me));
  int new_rank = me;
  for (int r : excl)
    if (r < me) --new_rank;
  Config cfg = config;
  if (cfg.name.empty()) cfg.name = impl_->name() + ".shrink";
  if (cfg.timeout_s <= 0) cfg.timeout_s = impl_->config().timeout_s;
  return init_rank(*id, n - static_cast<int>(excl.size()), new_rank, cfg);
}

int Comm::rank() const { return impl_->rank(); }
int Comm::size() const { return impl_->size(); }
const std::string& Comm::name() const { return impl_->name(); }

namespace {
CollArgs coll(Collective c, size_t count, DataType dt, RedOp op = RedOp::kSum, int root = 0) {
  CollArgs a;
  a.coll = c;
  a.count = count;
  a.dt = dt;
  a.op = op;
  a.root = root;
  return a;
}
}  // namespace

Result<Work> Comm::allreduce(const void* send, void* recv, size_t count, DataType dt, RedOp op) {
  return impl_->submit(coll(Collective::kAllReduce, count, dt, op), send, recv);
}
Result<Work> Comm::reduce_scatter(const void* send, void* recv, size_t count, DataType dt, RedOp op) {
  return impl_->submit(coll(Collective::kReduceScatter, count, dt, op), send, recv);
}
Result<Work> Comm::all_gather(const void* send, void* recv, size_t count, DataType dt) {
  return impl_->submit(coll(Collective::kAllGather, count, dt), send, recv);
}
Result<Work> Comm::broadcast(const void* send, void* recv, size_t count, DataType dt, int root) {
  return impl_->submit(coll(Collective::kBroadcast, count, dt, RedOp::kSum, root), send, recv);
}
Result<Work> Comm::reduce(const void* send, void* recv, size_t count, DataType dt, RedOp op, int root) {
  return impl_->submit(coll(Collective::kReduce, count, dt, op, root), send, recv);
}
Result<Work> Comm::all_to_all(const void* send, void* recv, size_t count, DataType dt) {
  return impl_->submit(coll(Collective::kAllToAll, count, dt), send, recv);
}
Result<Work> Comm::send(const void* buf, size_t count, DataType dt, int peer) {
  return impl_->submit_p2p(true, const_cast<void*>(buf), count, dt, peer);
}
Result<Work> Comm::recv(void* buf, size_t count, DataType dt, int peer) {
  return impl_->submit_p2p(false, buf, count, dt, peer);
}
void Comm::group_start() { impl_->group_start(); }
Result<Work> Comm::group_end() { return impl_->group_end(); }
void Comm::abort(const std::string& reason) { impl_->abort(reason); }
void Comm::revoke() { impl_->revoke(); }
void Comm::set_caller_waits(bool on) { impl_->set_caller_waits(on); }
bool Comm::revoked() const { return impl_->revoked(); }
bool Comm::quiescent() const { return impl_->quiescent(); }
Status Comm::destroy() { return impl_->destroy(); }
Status Comm::async_error() const { return impl_->async_error(); }
Result<double> Comm::predict_us(Collective coll, size_t bytes) const { return impl_->predict_us(coll, bytes); }

}  // namespace loom
