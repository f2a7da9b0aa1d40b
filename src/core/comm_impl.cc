#include "core/comm_impl.h"

#include <algorithm>

#include <fmt/format.h>

#include <immintrin.h>
#include <sched.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>

#include "algorithms/algorithms.h"
#include "core/calibrate.h"
#include "core/config.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/schedule_args.h"
#include "core/threads.h"
#include "diag/params.h"
#include "kernels/host_reduce.h"
#include "topology/discover.h"
#include "topology/topo_xml.h"
#include "topology/xml.h"
#include "transport/hybrid_transport.h"

namespace loom {
namespace detail {
namespace {

// Topology discovery runs once per process (hwloc is not free); every
// communicator's tuner starts from a copy.
Result<topo::ImportResult> system_topology() {
  static std::mutex mu;
  static std::unique_ptr<Result<topo::ImportResult>> cached;
  std::lock_guard<std::mutex> lk(mu);
  if (!cached) cached = std::make_unique<Result<topo::ImportResult>>(topo::load_system_topology());
  return *cached;
}

}  // namespace

void WorkState::complete(Status st) {
  {
    std::lock_guard<std::mutex> lk(mu);
    status = std::move(st);
    done.store(1, std::memory_order_release);
  }
  cv.notify_all();
}

std::shared_ptr<WorkState> WorkState::completed(Status st) {
  auto w = std::make_shared<WorkState>();
  w->complete(std::move(st));
  return w;
}

Result<std::unique_ptr<CommImpl>> CommImpl::create(const UidContents& uid, int nranks, int rank, const Config& cfg) {
  std::unique_ptr<CommImpl> c(new CommImpl());
  c->rank_ = rank;
  c->nranks_ = nranks;
  c->config_ = cfg;
  c->name_ = cfg.name.empty() ? "comm" : cfg.name;
  c->timeout_s_ = cfg.timeout_s > 0 ? cfg.timeout_s : params::timeout_s();
  c->engine_spin_us_ = params::engine_spin_us();
  Deadline deadline = deadline_after(c->timeout_s_);
  // Until the comm is returned nobody can call its abort(): the caller's
  // cancel flag, if any, stops init's waits instead (the bootstrap's, the
  // socket setup's). Regression: ncclCommAbort of a comm still initialising
  // waited for init to fail at LOOM_TIMEOUT (NcclAbort.OfACommStillInitialising).
  const std::atomic<bool>* init_abort = cfg.cancel ? cfg.cancel.get() : &c->abort_;
  log_environment();  // INFO ENV: the LOOM_* variables this process runs with (once)
  LOOM_ASSIGN_OR_RETURN(c->boot_, Bootstrap::connect(uid, nranks, rank, deadline, init_abort));
  // Host index of every rank (its lowest rank with the same host hash), for
  // hierarchical algorithms (CollArgs::host_of_rank).
  c->host_of_rank_.assign(nranks, 0);
  for (int i = 0; i < nranks; ++i)
    for (int j = 0; j <= i; ++j)
      if (c->boot_->peers()[j].host_hash == c->boot_->peers()[i].host_hash) {
        c->host_of_rank_[i] = j;
        break;
      }

  // Before any transport is set up: ranks that disagree on LOOM_TRANSPORT
  // would run different setup exchanges and read each other's messages as
  // garbage (the error then named some other setting, or init hung).
  LOOM_RETURN_IF_ERROR(c->agree_settings(deadline));
  // Shared memory inside a host, sockets between hosts (LOOM_TRANSPORT).
  LOOM_ASSIGN_OR_RETURN(TransportMode mode, parse_transport_mode(params::transport()));
  LOOM_ASSIGN_OR_RETURN(c->transport_, HybridTransport::create(*c->boot_, mode, params::shm_fifo_bytes(), deadline,
                                                               init_abort));
  LOOM_ASSIGN_OR_RETURN(topo::ImportResult topology, system_topology());
  // LOOM_TOPO_DUMP_FILE: one rank writes it (LOOM_TOPO_DUMP_FILE_RANK, default 0), as NCCL.
  topo::dump_system_topology(topology.graph, rank);
  LOOM_RETURN_IF_ERROR(c->agree_topology(&topology.graph, deadline));
  // The tuner's model needs to know how many hosts there are: ranks per host
  // from the bootstrap's host hashes, always (its default is one rank per
  // GPU of the topology per host, which on one host with more ranks than
  // GPUs made several hosts; regression TunerHosts.OneHostWithMoreRanksThan
  // Gpus; before that it was one host for every job).
  topo::TunerOptions tuner_options;
  {
    std::vector<int> per_host(nranks, 0);
    for (int i = 0; i < nranks; ++i) ++per_host[c->host_of_rank_[i]];
    tuner_options.ranks_per_host = *std::max_element(per_host.begin(), per_host.end());
  }
  tuner_options.map_shared = c->all_map_shared_;  // the same on every rank
  auto tuner = topo::Tuner::from_env(std::move(topology.graph), nranks, tuner_options);
  if (!tuner.is_ok()) return tuner.status().with_context("algorithm selection (LOOM_ALGO, LOOM_TUNE_*, LOOM_TUNER_PLUGIN)");
  c->tuner_ = std::move(tuner).value();
  c->exec_ = std::make_unique<Executor>(rank, nranks, c->transport_.get(), &host_memory(), &c->abort_);
  LOOM_RETURN_IF_ERROR(c->diag_init(deadline));  // recorder, fingerprints, watchdog + query server
  LOOM_RETURN_IF_ERROR(c->calibrate_tuner(deadline));  // LOOM_TUNE_CALIBRATE=1; the executor is still free
  c->boot_->set_abort_flag(&c->abort_);  // from now on abort() is the way
  c->max_queued_ = static_cast<size_t>(params::max_queued_ops());
  c->gate_->comm = c.get();
  // Returns once the engine thread has run and sleeps (core/threads.h).
  c->engine_ = start_thread_asleep([p = c.get()] { p->engine_main(); }, &c->engine_tid_);
  LOOM_INFO(kLogInit, "{} rank {}/{}: ready (transport {}, timeout {} s)", c->name_, rank, nranks,
            c->transport_->name(), c->timeout_s_);
  return c;
}

CommImpl::~CommImpl() { (void)destroy(); }

Status CommImpl::check_usable(const char* what) const {
  if (destroyed_.load()) return invalid_usage(fmt::format("{}: communicator used after destroy", what));
  if (revoked_.load())
    return invalid_usage(fmt::format("{}: communicator {} rank {} was revoked (only split, shrink and destroy remain)",
                                     what, name_, rank_));
  if (!has_failed_.load(std::memory_order_acquire)) return Status::ok();  // no lock per op
  std::lock_guard<std::mutex> lk(mu_);
  return Status(failed_.code(), fmt::format("{}: communicator failed earlier: {}", what, failed_.message()));
}

namespace {

bool mul_overflows(size_t a, size_t b, size_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

Result<Work> CommImpl::submit(CollArgs args, const void* send, void* recv) {
  const char* what = collective_name(args.coll);
  LOOM_RETURN_IF_ERROR(check_usable(what));
  if (!is_valid(args.dt))
    return invalid_argument(fmt::format("{}: unknown data type {}", what, static_cast<int>(args.dt)));
  if (!is_valid(args.op)) return invalid_argument(fmt::format("{}: unknown reduction op {}", what, static_cast<int>(args.op)));
  const bool rooted = args.coll == Collective::kBroadcast || args.coll == Collective::kReduce;
  if (rooted && (args.root < 0 || args.root >= nranks_))
    return invalid_argument(fmt::format("{}: root {} out of range [0, {})", what, args.root, nranks_));
  const size_t es = dtype_size(args.dt);
  size_t bytes = 0, total = 0;
  if (mul_overflows(args.count, es, &bytes) || mul_overflows(bytes, static_cast<size_t>(nranks_), &total) ||
      total > static_cast<size_t>(std::numeric_limits<ptrdiff_t>::max()))
    return invalid_argument(fmt::format("{}: count*size overflows ({} x {})", what, args.count, dtype_name(args.dt)));
  // Which buffers must be non-null on this rank.
  bool need_send = args.count > 0, need_recv = args.count > 0;
  if (args.coll == Collective::kBroadcast) need_send = need_send && rank_ == args.root;
  if (args.coll == Collective::kReduce) need_recv = need_recv && rank_ == args.root;
  if (need_send && !send) return invalid_argument(fmt::format("{}: send buffer is null with count {}", what, args.count));
  if (need_recv && !recv) return invalid_argument(fmt::format("{}: recv buffer is null with count {}", what, args.count));
  auto* s = static_cast<std::byte*>(const_cast<void*>(send));
  auto* r = static_cast<std::byte*>(recv);
  switch (args.coll) {
    case Collective::kReduceScatter: args.in_place = s && r == s + rank_ * bytes; break;
    case Collective::kAllGather: args.in_place = r && s == r + rank_ * bytes; break;
    default: args.in_place = s == r; break;
  }
  args.nranks = nranks_;
  args.rank = rank_;
  // host_of_rank is filled in on a schedule-cache miss (schedule_for), not
  // copied into every op: the per-op path allocates as little as it can.
  if (group_depth_ > 0) {
    // Room for the scratch slot the executor fills in (no regrowth per op).
    group_subs_.push_back(SubOp{std::move(args), {s, r, nullptr}, 0});
    return Work();
  }
  // One reusable op: a blocking caller's op usually runs at issue and leaves
  // the storage for the next call (no allocation per op); a queued op takes
  // it along.
  Op& op = issue_op_;
  if (op.subs.size() != 1) op.subs.resize(1);
  SubOp& sub = op.subs.front();
  sub.args = std::move(args);
  if (sub.bufs.size() == 3) {  // the last op's: no reallocation, and no initializer list
    sub.bufs[0] = s, sub.bufs[1] = r, sub.bufs[2] = nullptr;
  } else {
    sub.bufs.assign({s, r, nullptr});  // with the scratch slot the executor fills in
  }
  // A lone op run at issue (see enqueue) goes straight to run_sub, without
  // enqueue's and execute()'s handling of gates and groups: 2 ranks, 8 B
  // allreduce 0.19-0.20 -> 0.16-0.17 us with that path skipped
  // (performance.md Run 42).
  std::unique_lock<GateLock> g;
  if (next_gates_.empty() && take_gate_at_issue(g)) {
    sub.seq = next_seq_++;
    sub.coll_seq = next_coll_seq_++;
    sub.defer_record = true;  // recorded while it waits (run_sub)
    return at_issue([&] {
      Status st = start_status();
      return st.is_ok() ? run_checked(sub) : st;
    });
  }
  return enqueue(op);
}

bool CommImpl::take_gate_at_issue(std::unique_lock<GateLock>& g) {
  // The engine gate proves that no op is running; pending_ == 0 under it,
  // that none is queued.
  if (!caller_waits_ || pending_.load(std::memory_order_acquire) != 0) return false;
  g = std::unique_lock<GateLock>(gate_->mu, std::try_to_lock);
  return g.owns_lock() && pending_.load(std::memory_order_acquire) == 0;
}

template <class Run>
Result<Work> CommImpl::at_issue(Run run) {
  running_at_issue_.store(true, std::memory_order_relaxed);
  Status st = run();
  running_at_issue_.store(false, std::memory_order_release);
  inline_ops_.store(inline_ops_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  // A finished op needs no shared state: an empty Work waits for nothing
  // and reports ok (no reference count to bump and drop per op).
  if (st.is_ok()) return Work();
  return Work(WorkState::completed(st));
}

Result<Work> CommImpl::submit_p2p(bool is_send, void* buf, size_t count, DataType dt, int peer) {
  const char* what = is_send ? "send" : "recv";
  LOOM_RETURN_IF_ERROR(check_usable(what));
  if (!is_valid(dt)) return invalid_argument(fmt::format("{}: unknown data type {}", what, static_cast<int>(dt)));
  if (peer < 0 || peer >= nranks_)
    return invalid_argument(fmt::format("{}: peer {} out of range [0, {})", what, peer, nranks_));
  size_t bytes = 0;
  if (mul_overflows(count, dtype_size(dt), &bytes) || bytes > static_cast<size_t>(std::numeric_limits<ptrdiff_t>::max()))
    return invalid_argument(fmt::format("{}: count*size overflows ({} x {})", what, count, dtype_name(dt)));
  if (count > 0 && !buf) return invalid_argument(fmt::format("{}: buffer is null with count {}", what, count));
  auto make_sub = [&]() {
    SubOp sub;
    sub.args.coll = Collective::kSendRecv;
    sub.args.dt = dt;
    sub.args.nranks = nranks_;
    sub.args.rank = rank_;
    sub.bufs = {nullptr, nullptr, nullptr};
    return sub;
  };
  if (group_depth_ > 0) {
    if (group_p2p_index_ < 0) {
      group_p2p_index_ = static_cast<int>(group_subs_.size());
      group_subs_.push_back(make_sub());
    }
    SubOp& g = group_subs_[group_p2p_index_];
    if (!g.args.p2p_bytes && g.args.dt != dt && !g.args.p2p.empty()) {
      // Types mixed in one group (legal in NCCL: a type only has to match
      // between the two ends of one send/recv): the group goes in bytes.
      // Regression: it was refused, and peers whose groups did not mix hung.
      const size_t es = dtype_size(g.args.dt);
      for (P2pOp& p : g.args.p2p) p.count *= es;
      g.args.dt = DataType::kUint8;
      g.args.p2p_bytes = true;
    }
    if (g.args.p2p_bytes) {
      g.args.p2p.push_back({is_send, peer, bytes});
    } else {
      g.args.dt = dt;
      g.args.p2p.push_back({is_send, peer, count});
    }
    g.bufs.push_back(static_cast<std::byte*>(buf));
    return Work();
  }
  SubOp sub = make_sub();
  sub.args.p2p.push_back({is_send, peer, count});
  sub.bufs.push_back(static_cast<std::byte*>(buf));
  Op op;
  op.subs.push_back(std::move(sub));
  return enqueue(op);
}

void CommImpl::group_start() { ++group_depth_; }

Result<Work> CommImpl::group_end() {
  if (group_depth_ == 0) return invalid_usage("group_end without group_start");
  if (--group_depth_ > 0) return Work();
  Op op;
  op.subs = std::move(group_subs_);
  group_subs_.clear();
  if (group_p2p_index_ >= 0) {
    mark_aliased_sends(op.subs[group_p2p_index_]);
    // The group's sends and receives run after its collectives, wherever
    // this rank called them: NCCL queues a group's point-to-point calls apart
    // from its collectives, so ranks may place them differently among the
    // collectives. Where the first call was, ranks that differed ran the
    // parts in different orders: "mismatched operations", or without
    // fingerprints a silent swap of messages or a hang
    // (Groups.SendRecvAnywhereAmongTheCollectives, found by loom-stress).
    std::rotate(op.subs.begin() + group_p2p_index_, op.subs.begin() + group_p2p_index_ + 1, op.subs.end());
  }
  group_p2p_index_ = -1;
  if (Status st = check_usable("group_end"); !st.is_ok()) {
    drop_start_gates(st);
    return st;
  }
  return enqueue(op);
}

void CommImpl::mark_aliased_sends(SubOp& g) {
  const size_t es = dtype_size(g.args.dt);
  auto& ops = g.args.p2p;
  for (size_t i = 0; i < ops.size(); ++i) {
    // Sends to self too: their copies run one after another, so a later
    // one's source may already have been overwritten by an earlier one.
    if (!ops[i].is_send || ops[i].count == 0) continue;
    const std::byte* s = g.bufs[kBufUser + i];
    for (size_t j = 0; j < ops.size() && !ops[i].stage; ++j) {
      if (ops[j].is_send || ops[j].count == 0) continue;
      const std::byte* r = g.bufs[kBufUser + j];
      if (s < r + ops[j].count * es && r < s + ops[i].count * es) ops[i].stage = true;
    }
  }
}

namespace {
// Polls `done()` for up to `spin_us` microseconds (yielding now and then, so
// an oversubscribed core still runs the thread that makes it true); true once
// it is.
template <class Done>
bool spin_until(Done done, int spin_us) {
  if (spin_us <= 0) return done();
  const auto until = Clock::now() + std::chrono::microseconds(spin_us);
  for (int i = 0;; ++i) {
    if (done()) return true;
    if ((i & 63) == 63) {
      if (Clock::now() >= until) return false;
      sched_yield();
    }
    _mm_pause();
  }
}

bool spin_for(const std::atomic<bool>& flag, int spin_us) {
  return spin_until([&] { return flag.load(std::memory_order_acquire); }, spin_us);
}
}  // namespace

void StartGate::open() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    open_ = true;
    opened_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

bool StartGate::wait_open(Deadline deadline, const std::atomic<bool>& abort, int spin_us) {
  if (spin_for(opened_, spin_us)) return true;
  std::unique_lock<std::mutex> lk(mu_);
  // Abort has no wake-up of its own here: look at it every few milliseconds.
  while (!open_) {
    if (abort.load() || Clock::now() >= deadline) return false;
    cv_.wait_for(lk, std::chrono::milliseconds(5));
  }
  return true;
}

void StartGate::finish(const Status& st) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (finished_) return;
    finished_ = true;
    status_ = st;
    finished_flag_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

Status StartGate::wait_finished(int spin_us) {
  (void)spin_for(finished_flag_, spin_us);
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return finished_; });
  return status_;
}

void CommImpl::add_start_gate(std::shared_ptr<StartGate> gate) { next_gates_.push_back(std::move(gate)); }

void CommImpl::drop_start_gates(const Status& st) {
  for (auto& g : next_gates_) g->finish(st);
  next_gates_.clear();
}

Result<Work> CommImpl::enqueue(Op& op) {
  op.gates = std::move(next_gates_);
  next_gates_.clear();
  for (auto& s : op.subs) {
    s.seq = next_seq_++;
    if (s.args.coll != Collective::kSendRecv) s.coll_seq = next_coll_seq_++;
    s.defer_record = false;
  }
  // A caller that waits at once (Comm::set_caller_waits) for an op nothing
  // else is ahead of: run it here and now, as Work::wait would a moment
  // later, without the queue, the work object and their locks (~1000
  // instructions of an 8 B op).
  std::unique_lock<GateLock> g;
  if (op.gates.empty() && !op.subs.empty() && take_gate_at_issue(g)) {
    // diag: a single op is recorded (enqueued and started at once) while
    // it waits for its peers, off the path to its first send (run_sub); a
    // group's members are recorded now, their start when each starts.
    if (op.subs.size() == 1) {
      op.subs.front().defer_record = true;
    } else {
      for (auto& s : op.subs) recorder_->on_enqueue(s.seq, s.coll_seq, s.args);
    }
    return at_issue([&] { return execute(op); });
  }
  for (auto& s : op.subs) recorder_->on_enqueue(s.seq, s.coll_seq, s.args);  // diag: queued, recorded now
  op.work = std::make_shared<WorkState>();
  op.work->gate = gate_;
  Work w(op.work);
  if (op.subs.empty()) {
    op.work->complete(Status::ok());
    for (auto& g : op.gates) g->finish(Status::ok());
    return w;
  }
  bool wake = true;
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (max_queued_ > 0 && queue_.size() >= max_queued_ && !stopping_) {
      // Back-pressure: a loop of non-blocking calls must not queue without
      // bound (memory, and a page fault per op for the growing heap). Wait
      // until half the queue has run; each queued op has its deadline, and
      // a failure drains the queue fast, so this wait ends. The engine (or a
      // thread in Work::wait) is running the queue; make sure of the engine.
      ++queue_full_waits_;
      issuer_waiting_ = true;
      cv_.notify_one();
      space_cv_.wait(lk, [&] { return queue_.size() <= max_queued_ / 2 || stopping_; });
      issuer_waiting_ = false;
    }
    if (stopping_) {
      Status st = invalid_usage("operation issued during destroy");
      for (auto& g : op.gates) g->finish(st);
      return st;
    }
    wake = !caller_waits_ || !op.gates.empty();
    queue_.push_back(std::move(op));
    queue_high_water_ = std::max(queue_high_water_, queue_.size());
    unfinished_.fetch_add(1, std::memory_order_release);
    pending_.fetch_add(1, std::memory_order_release);
  }
  // A caller that waits at once runs the op itself (Work::wait): waking the
  // engine too would only cost a context switch there and one back (the
  // engine shares the rank's core when ranks are pinned).
  if (wake) cv_.notify_one();
  return w;
}

namespace {
// The size the cost model prices a call at: all_gather's whole output,
// reduce_scatter's whole input and all_to_all's whole send buffer, i.e.
// nranks blocks (topo/cost_model.h). Regression: it was handed one block, so
// every prediction and pipelining chunk was for a buffer nranks times smaller
// than the real one (test: inproc/test_tuner_sizes).
size_t model_bytes_of(const CollArgs& a) {
  const size_t bytes = a.count * dtype_size(a.dt);
  return topo::bytes_are_blocks(a.coll) ? bytes * static_cast<size_t>(a.nranks) : bytes;
}
}  // namespace

Result<const RankSchedule*> CommImpl::schedule_for(const CollArgs& a) {
  if (a.coll == Collective::kSendRecv) return static_cast<const RankSchedule*>(nullptr);
  // A plain key: no formatting or allocation on a cache hit.
  const ScheduleKey key{static_cast<int>(a.coll), static_cast<int>(a.dt), static_cast<int>(a.op), a.root, a.in_place,
                        a.count};
  if (last_sched_ && key == last_key_) return last_sched_;
  auto it = schedule_cache_.find(key);
  if (it != schedule_cache_.end()) {
    last_key_ = key;
    last_sched_ = &it->second;
    return last_sched_;
  }
  // Cache miss: ask the tuner among the algorithms that can serve this call.
  CollArgs args = a;
  set_job_args(args, host_of_rank_);  // host_of_rank, oversubscribed, staging (core/schedule_args.h)
  const std::vector<std::string> available = runnable_algorithms(args);
  std::string chosen;
  const size_t bytes = a.count * dtype_size(a.dt);  // per-rank count (NCCL's), logged as is
  const size_t model_bytes = model_bytes_of(a);  // nranks blocks for the block collectives
  if (tuner_ && !available.empty()) {
    auto sel = tuner_->select(a.coll, model_bytes, a.nranks, available);
    if (sel.is_ok()) {
      chosen = sel->algorithm;
      // The model's pipelining chunk, unless LOOM_CHUNK_BYTES pins one.
      // Rounded up: a chunk of a whole block in bytes (ring, Rabenseifner)
      // must stay at least a block in elements, or the block would go in
      // two slices, the second of one element, and the op would take an
      // extra phase (regression: TunerSizes.AWholeBlockChunkIsOneSlice).
      if (const size_t c = tuned_chunk_elems(sel->chunk_bytes, a.dt)) args.chunk_elems = c;
      LOOM_INFO(kLogTune, "{} rank {}: {} {} B{} -> {} ({}, predicted {:.1f} us, chunk {} B{})", name_, rank_,
                collective_name(a.coll), bytes, a.in_place ? " in place" : "", chosen, sel->source, sel->predicted_us,
                args.chunk_elems ? args.chunk_elems * dtype_size(a.dt) : params::chunk_bytes(),  // LOOM_CHUNK_BYTES
                sel->runner_up.empty() ? "" : fmt::format(", runner-up {} {:.1f} us", sel->runner_up, sel->runner_up_us));
    }
  }
  LOOM_ASSIGN_OR_RETURN(RankSchedule s, make_schedule(args, chosen));
  if (schedule_cache_.size() > 512) {
    schedule_cache_.clear();
    last_sched_ = nullptr;
  }
  auto [pos, _] = schedule_cache_.emplace(key, std::move(s));
  return &pos->second;
}

Status CommImpl::run_sub(SubOp& s) {
  const CollArgs& a = s.args;
  RankSchedule p2p_sched;
  const RankSchedule* sched = nullptr;
  // The average of fp16 / bf16 / fp8, as NCCL computes it: every input times
  // T(1/n), then summed (kernels::avg_premultiplies). Summing first and
  // dividing once overflowed (fp16: 4 x 30000 -> inf) or saturated (e4m3:
  // 4 x 256 -> 112). The scaled input is this op's own buffer; the schedule
  // is the sum's, out of place. The recorder and fingerprint keep the avg.
  const bool premul = a.op == RedOp::kAvg && nranks_ > 1 && a.count > 0 && kernels::avg_premultiplies(a.dt) &&
                      (a.coll == Collective::kAllReduce || a.coll == Collective::kReduce ||
                       a.coll == Collective::kReduceScatter);
  std::optional<CollArgs> sum_args;  // constructed only here (the per-op path pays nothing)
  std::unique_ptr<std::byte[]> scaled;
  std::vector<std::byte*> premul_bufs;
  if (premul) {
    sum_args = a;
    sum_args->op = RedOp::kSum;
    sum_args->in_place = false;
    const size_t n = a.coll == Collective::kReduceScatter ? a.count * static_cast<size_t>(nranks_) : a.count;
    scaled.reset(new (std::nothrow) std::byte[n * dtype_size(a.dt)]);
    if (!scaled) return Status(StatusCode::kSystemError,
                               fmt::format("{} of {} x {}: no memory for the scaled input", redop_name(a.op), n,
                                           dtype_name(a.dt)));
    std::byte inv[8];
    kernels::reciprocal(a.dt, nranks_, inv);
    kernels::scale(scaled.get(), s.bufs[0], n, a.dt, inv);
    premul_bufs = s.bufs;
    premul_bufs[0] = scaled.get();
  }
  const CollArgs& run_args = premul ? *sum_args : a;
  std::vector<std::byte*>& run_bufs = premul ? premul_bufs : s.bufs;
  if (a.coll == Collective::kSendRecv) {
    LOOM_ASSIGN_OR_RETURN(p2p_sched, make_schedule(a));
    sched = &p2p_sched;
  } else {
    auto found = schedule_for(run_args);
    if (!found.is_ok()) {
      if (s.defer_record) recorder_->on_enqueue(s.seq, s.coll_seq, s.args);  // diag: the failed op is on record
      return found.status();
    }
    sched = *found;
  }
  exec_->progress().seq.store(s.seq, std::memory_order_relaxed);
  // ---- diag: recorder state and this op's fingerprint
  if (s.defer_record) {
    // Recorded once it idles (write_deferred_record): the recorder entry
    // and its clock read (~190 instructions, the TSC read alone ~11 ns here)
    // are off the path to its first send, done while it waits. Gains 0-4%
    // at 8-64 B, none measurable from 256 B (performance.md Run 22). An op
    // that ends first is recorded whole at its end (EndRecord below).
    // Until then the watchdog reads "started at 0" as "just started".
    running_since_ns_.store(0, std::memory_order_relaxed);
    deferred_sub_ = &s;
    deferred_sched_ = sched;
    exec_->defer_until_idle([](void* c) { static_cast<CommImpl*>(c)->write_deferred_record(); }, this);
  } else {
    running_since_ns_.store(
        recorder_->on_start(s.seq, sched->algorithm, static_cast<int>(sched->phases.size())),
        std::memory_order_relaxed);
  }
  running_seq_.store(s.seq + 1, std::memory_order_release);
  fingerprint_.set(&s.args, s.seq, s.coll_seq);
  exec_->set_fingerprint(fingerprints_ ? &fingerprint_ : nullptr);
  struct EndRecord {  // on every return path below
    CommImpl* c;
    uint64_t seq;
    bool ok = false;
    ~EndRecord() {
      if (c->exec_->take_deferred())
        c->record_whole(ok);  // an op that never waited long: its whole record, one clock read
      else
        c->recorder_->on_end(seq, ok);
      c->last_failed_.store(!ok, std::memory_order_relaxed);
      c->last_seq_.store(seq + 1, std::memory_order_relaxed);
      c->running_seq_.store(0, std::memory_order_release);
    }
  } end_record{this, s.seq};
  // ---- end diag
  // The op's name is only formatted when needed (errors), not per call.
  static const std::string kNoName;  // the executor's messages get the op's name below
  // The deadline is read from the clock only once the op has to wait for it
  // (an exchange whose peer answers at once never does).
  Status st = sched->single_exchange
                  ? exec_->run_exchange(*sched, run_bufs, a.dt, run_args.op, timeout_s_, kNoName)
                  : exec_->run(*sched, run_bufs, a.dt, run_args.op, coarse_deadline_after(timeout_s_), kNoName);
  if (!st.is_ok()) {
    std::string what;
    if (a.coll == Collective::kSendRecv)
      what = fmt::format("{} rank {}: {} #{} ({} send/recv)", name_, rank_, collective_name(a.coll), s.seq, a.p2p.size());
    else
      what = fmt::format("{} rank {}: {} #{} ({}, {} x {}, {}{})", name_, rank_, collective_name(a.coll), s.seq,
                         sched->algorithm, a.count, dtype_name(a.dt), redop_name(a.op),
                         (a.coll == Collective::kBroadcast || a.coll == Collective::kReduce)
                             ? fmt::format(", root {}", a.root)
                             : "");
    return Status(st.code(), what + st.message());
  }
  end_record.ok = true;  // diag
  return st;
}

void CommImpl::write_deferred_record() {
  const SubOp& s = *deferred_sub_;
  deferred_sub_ = nullptr;
  // Enqueued and started at once, a moment ago: one clock read and one
  // write of each field for both. Writing the enqueued entry and then the
  // started fields again measured 0.4-1.4% slower per 8 B op (2 ranks, in
  // process, modes alternating every 1000 ops; performance.md Run 28): the
  // record is not free even while the op waits.
  const int64_t now = recorder_->on_run_at_issue(s.seq, s.coll_seq, s.args, deferred_sched_->algorithm,
                                                 static_cast<int>(deferred_sched_->phases.size()));
  running_since_ns_.store(now, std::memory_order_relaxed);
}

void CommImpl::record_whole(bool ok) {
  const SubOp& s = *deferred_sub_;
  deferred_sub_ = nullptr;
  recorder_->on_ran_at_issue(s.seq, s.coll_seq, s.args, deferred_sched_->algorithm,
                             static_cast<int>(deferred_sched_->phases.size()), ok);
}

void CommImpl::fail(const Status& st) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (failed_.is_ok()) {
      failed_ = st;
      has_failed_.store(true, std::memory_order_release);
      first = true;
    }
  }
  if (transport_) transport_->announce_abort(st.to_string());
  if (first) diag_on_failure(st);  // dump (coordinated when this rank saw the problem first)
}

void CommImpl::engine_main() {
  for (;;) {
    // In a blocking loop the next op arrives microseconds after the last one
    // completed: poll for it briefly (yielding, so oversubscribed ranks still
    // run) before paying a futex sleep and wake-up.
    if (engine_spin_us_ > 0)
      (void)spin_until(
          [&] {
            return pending_.load(std::memory_order_acquire) != 0 || stop_requested_.load(std::memory_order_relaxed);
          },
          engine_spin_us_);
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return !queue_.empty() || stopping_; });
      if (queue_.empty()) return;
    }
    std::unique_lock<GateLock> g(gate_->mu, std::try_to_lock);
    if (!g.owns_lock()) {
      // A thread blocked in Work::wait is running ops. Do not queue up behind
      // it (that costs a second wake-up per op); look again shortly in case
      // it returns with ops left, e.g. ones issued after the one it waits for.
      // Parked on its own condition variable, so the enqueue of every op the
      // waiting thread will run itself does not wake the engine too.
      // Stopping (destroy) does not end this wait: the queued ops still run
      // once that thread lets go of the gate. Regression: the wait returned
      // at once while stopping_ was set, and the engine spun on a core until
      // the other thread's op ended (CallerRuns.DestroyBehindAHungOpAtIssueDoesNotSpin).
      std::unique_lock<std::mutex> lk(mu_);
      gate_cv_.wait_for(lk, std::chrono::milliseconds(1));
      continue;
    }
    while (run_next_queued()) {
    }
  }
}

void CommImpl::after_waiter_progress() {
  // Ops issued after the one the waiter needed are left: hand them to the
  // engine, wherever it waits: on the gate (it found the gate taken) or on
  // the queue (it found the queue empty, and an op queued by a caller that
  // waits does not wake it). Regression: only the gate's was signalled, so
  // an op queued while this thread held the gate was left to a sleeping
  // engine (CallerRuns.AnOpQueuedBehindAnotherThreadsWaitIsRun).
  if (pending_.load(std::memory_order_acquire) > 0) {
    gate_cv_.notify_one();
    cv_.notify_one();
  }
}

bool CommImpl::run_next_queued() {
  Op op;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (queue_.empty()) return false;
    op = std::move(queue_.front());
    queue_.pop_front();
    pending_.fetch_sub(1, std::memory_order_relaxed);
    if (issuer_waiting_ && queue_.size() <= max_queued_ / 2) space_cv_.notify_one();
  }
  Status st = execute(op);
  op.work->complete(st);
  for (auto& g : op.gates) g->finish(st);
  unfinished_.fetch_sub(1, std::memory_order_acq_rel);
  return true;
}

Status CommImpl::start_status() const {
  if (!has_failed_.load(std::memory_order_acquire) && !abort_.load()) return Status::ok();
  Status st = async_error();
  if (!st.is_ok()) return Status(st.code(), "communicator failed earlier: " + st.message());
  if (abort_.load()) return aborted_error("communicator aborted");
  return st;
}

Status CommImpl::run_checked(SubOp& sub) {
  Status st = run_sub(sub);
  if (!st.is_ok()) {
    if (abort_.load()) {
      // Stopped by abort()/revoke(): the executor only knows the flag; say why.
      Status why = async_error();
      if (!why.is_ok() && st.message().find(why.message()) == std::string::npos)
        st = Status(st.code(), st.message() + " (" + why.message() + ")");
    }
    LOOM_WARN(kLogColl, "{}", st.message());
    fail(st);
  }
  return st;
}

Status CommImpl::execute(Op& op) {
  Status st = start_status();
  if (st.is_ok() && !op.gates.empty()) {
    // Held back until the user's stream reaches the op (shim, CUDA streams).
    const Deadline deadline = deadline_after(timeout_s_);
    for (auto& g : op.gates) {
      if (g->wait_open(deadline, abort_, engine_spin_us_)) continue;
      st = abort_.load() ? aborted_error("communicator aborted")
                         : timeout_error(fmt::format("{} rank {}: op #{} never started: its CUDA stream did not "
                                                     "reach it within {} s (LOOM_TIMEOUT)",
                                                     name_, rank_, op.subs.front().seq, timeout_s_));
      LOOM_WARN(kLogColl, "{}", st.message());
      fail(st);
      break;
    }
  }
  for (auto& sub : op.subs) {
    if (!st.is_ok()) break;
    st = run_checked(sub);
  }
  return st;
}

void CommImpl::abort(const std::string& reason) {
  // seq_cst with destroy's tearing_down_ / aborters_: one of the two sees
  // the other (regression: an abort still in fail()'s dump used the
  // transport that a concurrent destroy had just freed).
  aborters_.fetch_add(1);
  struct Leave {
    std::atomic<int>& n;
    ~Leave() { n.fetch_sub(1); }
  } leave{aborters_};
  if (abort_.exchange(true)) return;
  if (tearing_down_.load()) {  // destroy has joined the engine: nothing left to wake or tell
    cv_.notify_all();
    return;
  }
  fail(aborted_error(fmt::format("{} rank {}: {}", name_, rank_, reason)));
  if (transport_) transport_->wake_self();
  cv_.notify_all();
}

void CommImpl::revoke() {
  if (revoked_.exchange(true)) return;
  LOOM_INFO(kLogInit, "{} rank {}: revoked", name_, rank_);
  // The abort machinery ends the operations here and on the peers; what
  // differs is what follows (check_usable, Comm::split/shrink).
  abort(fmt::format("communicator revoked by rank {}", rank_));
}

Status CommImpl::wait_quiescent(Deadline deadline) const {
  while (!quiescent()) {
    if (Clock::now() >= deadline)
      return timeout_error(fmt::format("{} rank {}: operations still running after revoke", name_, rank_));
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  return Status::ok();
}

Status CommImpl::destroy() {
  if (destroyed_.exchange(true)) return Status::ok();
  if (diag_registered_.exchange(false)) diag::Hub::get().remove(this);  // no tick or snapshot after this
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    stop_requested_.store(true);
  }
  cv_.notify_all();
  gate_cv_.notify_all();
  space_cv_.notify_all();
  if (engine_.joinable()) engine_.join();
  {
    // A thread inside Work::wait may still be running an op: wait for it,
    // then make sure no later wait can reach this communicator.
    std::lock_guard<GateLock> g(gate_->mu);
    gate_->comm = nullptr;
  }
  tearing_down_.store(true);
  while (aborters_.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  exec_.reset();
  transport_.reset();
  boot_.reset();
  return Status::ok();
}

Status CommImpl::agree_settings(Deadline deadline) {
  // Regression: LOOM_CHUNK_BYTES=64K on one rank of three hung every
  // pipelined broadcast / allreduce / reduce until the timeout ("recv ...
  // (281560 of 289216 bytes done)"), naming nothing about the variable.
  struct Setting {
    const char* name;
    std::string value;  // as this rank reads it
  };
  const uint64_t chunk = params::chunk_bytes_if_set().value_or(0);
  auto bytes_setting = [](const char* name) {
    const std::optional<uint64_t> v = env_bytes_if_set(name);
    return v ? std::to_string(*v) : std::string("(unset)");
  };
  auto plugin_setting = [] {
    const std::string path = env_string("LOOM_TUNER_PLUGIN", "");
    if (path.empty()) return std::string("(unset)");
    char resolved[PATH_MAX];
    return realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : path;
  };
  const std::vector<Setting> mine = {
      {"LOOM_CHUNK_BYTES", chunk ? std::to_string(chunk) : "(unset)"},
      {"LOOM_ALGO", env_string("LOOM_ALGO", "(unset)")},
      {"LOOM_TUNE_ALPHA_US", env_string("LOOM_TUNE_ALPHA_US", "(unset)")},
      {"LOOM_TUNE_BW_GBPS", env_string("LOOM_TUNE_BW_GBPS", "(unset)")},
      {"LOOM_TUNE_REDUCE_GBPS", env_string("LOOM_TUNE_REDUCE_GBPS", "(unset)")},
      {"LOOM_TRANSPORT", params::transport()},
      // A send and its receive must mark a staged message alike (Step::announced).
      {"LOOM_SHM_ANNOUNCED_MIN_BYTES", std::to_string(params::shm_announced_min_bytes())},
      // The direct broadcast stages from it (stages_broadcast). Only the
      // variable: hosts may differ in what sysfs says, ranks of one host not.
      {"LOOM_LLC_BYTES", env_string("LOOM_LLC_BYTES", "(unset)")},
      // The tuner prices single-copy messages from them (a 4-rank all_gather
      // of 1 MiB: direct on three ranks, hypercube on the one that set
      // LOOM_SHM_SINGLE_COPY_BYTES=16K: "single-copy read from rank 0
      // failed: Protocol error"). As read, so that 16K and 16384 agree.
      {"LOOM_SHM_SINGLE_COPY_BYTES", bytes_setting("LOOM_SHM_SINGLE_COPY_BYTES")},
      {"LOOM_SHM_SINGLE_COPY_PLAIN_BYTES", bytes_setting("LOOM_SHM_SINGLE_COPY_PLAIN_BYTES")},
      // An op's first message to a peer carries its fingerprint or not.
      // Regression: with it off on one rank, its peer read data where it
      // expected a header and blamed the calls ("mismatched operations: the
      // stream from rank 1 is out of step").
      {"LOOM_FINGERPRINT", diag::params::fingerprints() ? "1" : "0"},
      // The plugin chooses algorithms before the cost model does. Regression:
      // set on rank 1 of 2 only, its "tree" for a small allreduce met its
      // peer's hypercube: "mismatched operations: the stream from rank 1 is
      // out of step", or (4 ranks) a hang until the deadline. The file as
      // resolved, so that a relative path or a link to it agrees.
      {"LOOM_TUNER_PLUGIN", plugin_setting()},
  };
  const size_t kSettings = mine.size();
  // One more word per rank, not compared: its LOOM_SHM_MAP_SHARED, which may
  // differ (the receiving rank's setting decides) but which the tuner prices
  // (all_map_shared_). Regression: a rank with it off priced the staged
  // direct all_gather and broadcast without their mapped reads and chose
  // another algorithm than its peers: "single-copy read from rank 0 failed:
  // Protocol error", or a hang (SharedBuffers.ARankWithMappingOff...).
  const size_t kRow = kSettings + 1;
  std::vector<uint64_t> all(static_cast<size_t>(nranks_) * kRow);
  for (size_t i = 0; i < kSettings; ++i) all[static_cast<size_t>(rank_) * kRow + i] = fnv1a(mine[i].value);
  all[static_cast<size_t>(rank_) * kRow + kSettings] = static_cast<uint64_t>(params::shm_map_shared());
  LOOM_RETURN_IF_ERROR(boot_->allgather(all.data(), kRow * sizeof(uint64_t), deadline).with_context("settings exchange"));
  all_map_shared_ = true;
  for (int r = 0; r < nranks_; ++r) all_map_shared_ = all_map_shared_ && all[static_cast<size_t>(r) * kRow + kSettings] != 0;
  for (size_t i = 0; i < kSettings; ++i) {
    for (int r = 0; r < nranks_; ++r) {
      if (all[static_cast<size_t>(r) * kRow + i] == all[i]) continue;
      // Every rank sees the same table, so every rank fails alike; this
      // rank's own value is named (the others' are only hashes here).
      return invalid_argument(fmt::format(
          "{} differs between ranks (rank 0 and rank {} disagree; this is rank {}, {}={}): it must be the same on "
          "every rank", mine[i].name, r, rank_, mine[i].name, mine[i].value));
    }
  }
  return Status::ok();
}

Status CommImpl::agree_topology(topo::TopoGraph* graph, Deadline deadline) {
  // Regression: rank 1 with LOOM_TOPO_FILE=azure-ndv4.xml and rank 0 on this
  // host's discovery chose chunks of 8 MiB and 256 KiB for one 16 MiB ring
  // allreduce: "single-copy read from rank 1 failed: Protocol error".
  const std::string xml = topo::write_xml(topo::graph_to_xml(*graph));
  const uint64_t h = fnv1a(xml);
  struct Entry {
    uint64_t hash, bytes;
  };
  std::vector<Entry> all(static_cast<size_t>(nranks_));
  all[static_cast<size_t>(rank_)] = {h, xml.size()};
  LOOM_RETURN_IF_ERROR(boot_->allgather(all.data(), sizeof(Entry), deadline).with_context("topology agreement"));
  int differs = -1;
  for (int r = 1; r < nranks_ && differs < 0; ++r)
    if (all[static_cast<size_t>(r)].hash != all[0].hash) differs = r;
  if (differs < 0) return Status::ok();
  // Rank 0's text to every rank (a block per rank: only on hosts that differ).
  const size_t len = all[0].bytes;
  std::vector<char> blocks(static_cast<size_t>(nranks_) * std::max<size_t>(len, 1));
  if (rank_ == 0) std::memcpy(blocks.data(), xml.data(), len);
  LOOM_RETURN_IF_ERROR(
      boot_->allgather(blocks.data(), std::max<size_t>(len, 1), deadline).with_context("topology agreement"));
  if (rank_ != 0) {
    auto parsed = topo::graph_from_xml_text(std::string(blocks.data(), len), "rank 0's topology");
    if (!parsed.is_ok()) return parsed.status().with_context("topology agreement: rank 0's topology");
    *graph = std::move(parsed).value().graph;
  }
  if (rank_ == 0 || rank_ == differs)
    LOOM_WARN(kLogTopo, "{} rank {}: the ranks' topologies differ (rank 0's and rank {}'s at least): every rank's "
              "tuner uses rank 0's, so that all choose the same algorithms", name_, rank_, differs);
  return Status::ok();
}

Status CommImpl::calibrate_tuner(Deadline deadline) {
  CalibrationRequest mine;
  mine.calibrate = tuner_->calibration_requested() || params::tune_calibrate();
  mine.hand_off = params::tune_hand_off() && tuner_->cost(nranks_).oversubscribed;
  // The algorithm probe runs a hundred ops or so; on a host loaded far past
  // its cores each can take milliseconds, and a job that asked for a short
  // deadline (LOOM_TIMEOUT=2 in the doctor's tests, under ctest -j2) then
  // failed its init in the probe. A rank with less than kProbeMinLeft of its
  // init deadline left says no, and then nobody probes.
  constexpr auto kProbeMinLeft = std::chrono::seconds(10);
  mine.probe_algos = params::tune_probe_algos() && deadline - Clock::now() >= kProbeMinLeft;
  LOOM_ASSIGN_OR_RETURN(CalibrationRequest agreed, agree_calibration_request(*boot_, mine, deadline));
  if (agreed.calibrate) {
    auto cal = calibrate_comm(*exec_, *boot_, rank_, nranks_, deadline);
    if (!cal.is_ok()) return cal.status().with_context("tuner calibration (LOOM_TUNE_CALIBRATE=1)");
    LOOM_INFO(kLogTune, "{} rank {}: calibrated alpha {:.2f} us, bandwidth {:.2f} GB/s ({} ring pairs), reduce {:.2f} GB/s"
              " in {:.1f} ms", name_, rank_, cal->alpha_us, cal->bw_GBps, cal->pairs, cal->reduce_GBps, cal->elapsed_ms);
    if (cal->pairs > 0)  // one rank: no link to measure, keep the topology's parameters
      LOOM_RETURN_IF_ERROR(tuner_->calibrate(cal->alpha_us, cal->bw_GBps, cal->reduce_GBps).with_context("tuner calibration"));
  }
  if (agreed.hand_off) {
    const int cores = tuner_->cost(nranks_).cores;
    auto h = probe_hand_off(*exec_, *boot_, rank_, nranks_, cores, deadline);
    if (!h.is_ok()) return h.status().with_context("hand-off probe (LOOM_TUNE_HAND_OFF=0 skips it)");
    LOOM_RETURN_IF_ERROR(tuner_->set_hand_off_rounds(h->across_us, h->within_us).with_context("hand-off probe"));
    topo::CommCost c = tuner_->cost(nranks_);
    LOOM_INFO(kLogTune, "{} rank {}: {} ranks on {} cores, hand-off probe: a round {:.2f} us across cores, {:.2f} us"
              " within one -> hand-off {:.2f} / {:.2f} us per rank of a core, in {:.1f} ms", name_, rank_, nranks_,
              cores, h->across_us, h->within_us, c.hand_off_cross_us, c.hand_off_us, h->elapsed_ms);
  }
  // reduce_scatter is left out: its two priced algorithms (ring,
  // Rabenseifner) kept their order with the probe (8 ranks on 2 cores).
  if (agreed.probe_algos)
    for (Collective coll : {Collective::kAllReduce, Collective::kAllGather})
      LOOM_RETURN_IF_ERROR(probe_algorithms(coll, deadline));
  return Status::ok();
}

Status CommImpl::probe_algorithms(Collective coll, Deadline deadline) {
  // The latency end, where the model's fixed costs decide: one float per
  // rank, the smallest op in which every rank has a block of its own (with
  // fewer elements than ranks, two-shot's and Rabenseifner's schedules skip
  // their empty blocks' messages and measured half their real cost).
  CollArgs args;
  args.coll = coll;
  args.count = topo::bytes_are_blocks(coll) ? 1 : static_cast<size_t>(nranks_);  // a block per rank
  args.dt = DataType::kFloat32;
  args.op = RedOp::kSum;
  args.nranks = nranks_;
  args.rank = rank_;
  set_job_args(args, host_of_rank_);
  const size_t bytes = args.count * dtype_size(args.dt);
  const size_t model_bytes = model_bytes_of(args);
  const topo::CommCost cost = tuner_->cost(nranks_);
  // Candidates: what the job can run and the model prices within 4x of its
  // best, at least two (the same list on every rank: the cost is agreed).
  // Not fewer: an algorithm left unprobed keeps the model's fixed cost while
  // its rivals get measured ones, mostly higher; with only the best three
  // probed, 4 ranks' 16 KiB allreduce went from recursive doubling (11-14
  // us) to an unprobed Rabenseifner (14-18).
  struct Cand {
    topo::AlgoKind kind;
    double model_us;
    RankSchedule sched;
  };
  std::vector<Cand> cands;
  for (const std::string& name : runnable_algorithms(args)) {
    auto kind = topo::parse_algo(name, coll);
    if (!kind) continue;
    auto est = topo::estimate(*kind, coll, model_bytes, nranks_, cost);
    if (!est) continue;
    LOOM_ASSIGN_OR_RETURN(RankSchedule s, make_schedule(args, name));
    cands.push_back({*kind, est->us, std::move(s)});
  }
  std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) { return a.model_us < b.model_us; });
  size_t keep = cands.size();
  while (keep > 2 && cands[keep - 1].model_us > 4 * cands[0].model_us) --keep;
  cands.resize(keep);
  if (cands.size() < 2) return Status::ok();
  std::vector<const RankSchedule*> scheds;
  for (const Cand& c : cands) scheds.push_back(&c.sched);
  // Room for any collective: all_gather's output and reduce_scatter's input
  // are nranks blocks.
  const size_t room = args.count * static_cast<size_t>(nranks_);
  std::vector<float> send(room, 1.0f), recv(room);
  std::vector<std::byte*> bufs = {reinterpret_cast<std::byte*>(send.data()), reinterpret_cast<std::byte*>(recv.data())};
  auto probe = probe_schedules(*exec_, *boot_, scheds, bufs, args.dt, args.op, deadline);
  if (!probe.is_ok()) return probe.status().with_context("algorithm probe (LOOM_TUNE_PROBE_ALGOS=0 skips it)");
  std::string summary;
  for (size_t i = 0; i < cands.size(); ++i) {
    LOOM_RETURN_IF_ERROR(tuner_->set_measured_offset(coll, nranks_, cands[i].kind, probe->us[i] - cands[i].model_us));
    summary += fmt::format("{}{} {:.1f} us (model {:.1f})", i ? ", " : "", cands[i].sched.algorithm, probe->us[i],
                           cands[i].model_us);
  }
  LOOM_INFO(kLogTune, "{} rank {}: algorithm probe, {} {} B on {} ranks: {}; in {:.1f} ms", name_, rank_,
            collective_name(coll), bytes, nranks_, summary, probe->elapsed_ms);
  return Status::ok();
}

Result<double> CommImpl::predict_us(Collective coll, size_t bytes) const {
  if (!tuner_) return not_supported("no tuner on this communicator");
  std::vector<std::string> available;
  for (const Algorithm* algo : algorithms_for(coll)) available.push_back(algo->name);
  LOOM_ASSIGN_OR_RETURN(topo::Selection sel, tuner_->select(coll, bytes, nranks_, available));
  if (sel.predicted_us < 0) return not_supported(fmt::format("the cost model has no estimate for {}", sel.algorithm));
  return sel.predicted_us;
}

Status CommImpl::async_error() const {
  if (!has_failed_.load(std::memory_order_acquire)) return Status::ok();
  std::lock_guard<std::mutex> lk(mu_);
  return failed_;
}

}  // namespace detail
}  // namespace loom
