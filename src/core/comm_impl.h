// CommImpl: the communicator behind loom::Comm — bootstrap, transport,
// executor and the progress engine (one thread that runs queued operations in
// issue order).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/schedule.h"
#include "bootstrap/bootstrap.h"
#include "core/executor.h"
#include "diag/fingerprint.h"
#include "diag/hub.h"
#include "diag/recorder.h"
#include "loom/comm.h"
#include "topology/tuner.h"
#include "transport/transport.h"

namespace loom {
namespace detail {

class CommImpl;

// The engine gate's lock. Taken with try_lock on the per-op path: one
// exchange, and a plain store to release (a pthread mutex's trylock + unlock
// are two locked instructions, ~20 ns here against a few hundred per 8 B op).
// lock() is for destroy.
class GateLock {
 public:
  bool try_lock() {
    return !held_.load(std::memory_order_relaxed) && !held_.exchange(true, std::memory_order_acquire);
  }
  void lock() {
    for (int i = 0; !try_lock(); ++i) {
      if (i < 64) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  void unlock() { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

// Whoever holds mu runs the communicator's ops: the engine thread, a thread
// blocked in Work::wait (which then runs them itself instead of paying two
// cross-thread wake-ups per op), or the issuing thread (ops run at issue).
// comm is cleared (under mu) by destroy.
struct EngineGate {
  GateLock mu;
  CommImpl* comm = nullptr;
};

struct WorkState {
  std::atomic<int> done{0};
  Status status;  // written once before done is set
  std::mutex mu;
  std::condition_variable cv;
  std::weak_ptr<EngineGate> gate;
  void complete(Status st);
  static std::shared_ptr<WorkState> completed(Status st);  // already done, with st
};

// Holds an op back until something outside Loom is ready (the shim: the
// user's CUDA stream reached the op). The engine waits for open() before the
// op starts, bounded by the op's deadline and the abort flag, and calls
// finish() once the op completed, so whoever opened the gate can wait for
// the op (later stream work is ordered after it).
struct StartGate {
  void open();
  // Waits for open(); false on deadline or abort. Polls for up to `spin_us`
  // first (LOOM_ENGINE_SPIN_US: a sleeping thread's wake-up is the larger
  // part of a stream-ordered op's latency where futex wake-ups are slow).
  bool wait_open(Deadline deadline, const std::atomic<bool>& abort, int spin_us = 0);
  void finish(const Status& st);
  Status wait_finished(int spin_us = 0);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false, finished_ = false;
  std::atomic<bool> opened_{false}, finished_flag_{false};  // the same, for polling
  Status status_;
};

class CommImpl final : public diag::DiagClient {
 public:
  static Result<std::unique_ptr<CommImpl>> create(const UidContents& uid, int nranks, int rank, const Config& cfg);
  ~CommImpl();

  int rank() const { return rank_; }
  int size() const { return nranks_; }
  const std::string& name() const { return name_; }
  Bootstrap& bootstrap() { return *boot_; }
  Executor& executor_for_test() { return *exec_; }  // tests: run a schedule outside an op
  const Config& config() const { return config_; }
  double timeout_s() const { return timeout_s_; }

  // Validated collective call (NCCL buffer conventions, see comm.h).
  Result<Work> submit(CollArgs args, const void* send, void* recv);
  Result<Work> submit_p2p(bool is_send, void* buf, size_t count, DataType dt, int peer);
  void group_start();
  Result<Work> group_end();
  // The next op enqueued (a lone call, or the group being built) waits for
  // `gate` before it starts; several gates: it waits for all.
  void add_start_gate(std::shared_ptr<StartGate> gate);
  // Gates added but not yet given to an op are finished with `st` (the call
  // failed before it enqueued anything).
  void drop_start_gates(const Status& st);

  void abort(const std::string& reason);
  void set_caller_waits(bool on) { caller_waits_ = on; }
  void revoke();
  bool revoked() const { return revoked_.load(std::memory_order_acquire); }
  bool destroyed() const { return destroyed_.load(); }
  bool quiescent() const {
    return unfinished_.load(std::memory_order_acquire) == 0 && !running_at_issue_.load(std::memory_order_acquire);
  }
  // Waits (polling) until quiescent() or the deadline passes.
  Status wait_quiescent(Deadline deadline) const;
  Status destroy();
  Status async_error() const;
  Result<double> predict_us(Collective coll, size_t bytes) const;
  // Runs the oldest queued op, if any; the caller holds the EngineGate.
  bool run_next_queued();
  // The lock whose holder runs the ops (tests: stand in for a thread in
  // Work::wait that runs them).
  GateLock& gate_lock_for_test() { return gate_->mu; }
  // Ops a waiting caller ran at issue, without the queue (tests).
  uint64_t inline_ops() const { return inline_ops_.load(std::memory_order_relaxed); }
  // The engine thread's kernel thread id (tests).
  long engine_tid() const { return engine_tid_; }
  // Times an issuer found the queue full and waited (LOOM_MAX_QUEUED_OPS).
  uint64_t queue_full_waits() const {
    std::lock_guard<std::mutex> lk(mu_);
    return queue_full_waits_;
  }
  // The most ops ever queued at once.
  size_t queue_high_water() const {
    std::lock_guard<std::mutex> lk(mu_);
    return queue_high_water_;
  }
  // Called by a waiter (holding the EngineGate) when it stops running ops.
  void after_waiter_progress();
  // The communicator's tuner (tests read its calibrated cost parameters).
  topo::Tuner* tuner() { return tuner_.get(); }

  // diag::DiagClient (defined in diag/comm_diag.cc)
  nlohmann::json diag_state(size_t max_ops = SIZE_MAX) override;
  void diag_tick() override;

 private:
  struct SubOp {
    CollArgs args;
    std::vector<std::byte*> bufs;
    uint64_t seq = 0;
    uint64_t coll_seq = 0;  // position among this comm's collectives (fingerprints)
    // Run at issue: its recorder entry is written once it waits for its
    // peers (Executor::defer_until_idle), not before its first send.
    bool defer_record = false;
  };
  struct Op {
    std::vector<SubOp> subs;
    std::shared_ptr<WorkState> work;
    std::vector<std::shared_ptr<StartGate>> gates;  // waited for before the op starts
  };

  CommImpl() = default;
  Status check_usable(const char* what) const;
  // Runs `op` at once (see the comment inside) or moves it into the queue.
  Result<Work> enqueue(Op& op);
  // Runs a dequeued (or never queued) op: its start gates, its sub-ops, and
  // on failure marks the communicator failed. The caller holds the EngineGate.
  Status execute(Op& op);
  // Why no op may start now (the communicator failed or was aborted), or ok.
  Status start_status() const;
  // run_sub; a failure marks the communicator failed (fail()).
  Status run_checked(SubOp& sub);
  // A caller that waits (Comm::set_caller_waits), nothing queued, and the
  // engine gate free: takes it into `g` and says the op may run at issue.
  bool take_gate_at_issue(std::unique_lock<GateLock>& g);
  // Runs `run` as an op at issue under the gate held: the bookkeeping of
  // running_at_issue_ and the Work handed back.
  template <class Run>
  Result<Work> at_issue(Run run);
  // Marks group sends whose buffer overlaps a receive of the group (staged).
  void mark_aliased_sends(SubOp& group);
  void engine_main();
  Status run_sub(SubOp& s);
  void fail(const Status& st);
  Result<const RankSchedule*> schedule_for(const CollArgs& args);
  // LOOM_TUNE_CALIBRATE=1: measure links and reduction, agree, and feed the tuner (core/calibrate.h).
  Status calibrate_tuner(Deadline deadline);
  // Oversubscribed: times the model's candidates for a small `coll` and hands
  // the tuner the measured offsets (LOOM_TUNE_PROBE_ALGOS; calibrate.h).
  Status probe_algorithms(Collective coll, Deadline deadline);
  // Fails init, naming the variable and this rank's value, when a setting
  // that shapes every schedule, the tuner's choice, the wire format or a
  // connection differs between ranks (LOOM_CHUNK_BYTES, LOOM_ALGO,
  // LOOM_TUNE_*, LOOM_TRANSPORT, LOOM_FINGERPRINT, ...: the list is in the
  // definition and in docs/troubleshooting.md): such ranks would run
  // different schedules or setups and wait for each other.
  // Also learns whether every rank reads mappings (all_map_shared_).
  Status agree_settings(Deadline deadline);
  // The tuner models every host as the graph it is given; ranks whose
  // discovered (or LOOM_TOPO_FILE) topologies differ would pick different
  // algorithms or chunks for one call. When the graphs differ, *graph
  // becomes rank 0's on every rank (the graph feeds the tuner only).
  Status agree_topology(topo::TopoGraph* graph, Deadline deadline);

  int rank_ = 0, nranks_ = 0;
  std::string name_;
  Config config_;
  double timeout_s_ = 300;
  std::unique_ptr<Bootstrap> boot_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Executor> exec_;
  std::unique_ptr<topo::Tuner> tuner_;  // algorithm choice: LOOM_ALGO > plugin > cost model
  std::atomic<bool> abort_{false};
  std::atomic<bool> destroyed_{false};
  // abort()/revoke() may come from any thread, during destroy() too (to end
  // the op destroy waits for): destroy frees the transport only once no
  // abort is inside (aborters_), and an abort that comes later than
  // tearing_down_ leaves the transport alone.
  std::atomic<int> aborters_{0};
  std::atomic<bool> tearing_down_{false};
  std::atomic<bool> revoked_{false};
  std::atomic<int> unfinished_{0};  // ops enqueued and not yet completed

  mutable std::mutex mu_;  // guards queue_, failed_, stopping_
  std::condition_variable cv_;
  std::condition_variable gate_cv_;  // engine parked while a waiter runs ops
  // Back-pressure (LOOM_MAX_QUEUED_OPS): an issuer finding max_queued_ ops
  // queued waits on space_cv_ until half of them have run.
  std::condition_variable space_cv_;
  size_t max_queued_ = 0;      // 0: unbounded
  bool issuer_waiting_ = false;  // guarded by mu_
  uint64_t queue_full_waits_ = 0;  // guarded by mu_ (tests)
  size_t queue_high_water_ = 0;    // guarded by mu_ (tests)
  std::deque<Op> queue_;
  Status failed_;
  std::atomic<bool> has_failed_{false};  // failed_ is set (read without the lock)
  bool stopping_ = false;
  std::thread engine_;
  long engine_tid_ = 0;  // the engine thread's kernel id, set by create()

  uint64_t next_seq_ = 0;  // issuing thread only
  bool caller_waits_ = false;  // issuing thread only: see Comm::set_caller_waits
  int engine_spin_us_ = 0;     // LOOM_ENGINE_SPIN_US, read once at create()
  std::vector<std::shared_ptr<StartGate>> next_gates_;  // issuing thread only
  int group_depth_ = 0;
  std::vector<SubOp> group_subs_;
  Op issue_op_;  // issuing thread only: storage of the op being issued (submit)
  int group_p2p_index_ = -1;  // position of the merged p2p sub-op in group_subs_

  struct ScheduleKey {
    int coll, dt, op, root;
    bool in_place;
    size_t count;
    auto operator<=>(const ScheduleKey&) const = default;
  };
  std::map<ScheduleKey, RankSchedule> schedule_cache_;  // engine thread only
  // The last hit: a loop of one op (the common case) skips the map's search.
  // Map nodes stay put until clear(), which resets it.
  ScheduleKey last_key_{};
  const RankSchedule* last_sched_ = nullptr;
  std::atomic<int> pending_{0};             // ops in queue_, polled without the lock
  std::shared_ptr<EngineGate> gate_ = std::make_shared<EngineGate>();
  // An op run at issue (enqueue) under the engine gate. Written only by the
  // gate's holder, so plain stores do: a locked read-modify-write costs ~10 ns
  // here, and an 8 B op has a few hundred ns per rank (docs/performance.md, Run 10).
  std::atomic<bool> running_at_issue_{false};
  std::atomic<uint64_t> inline_ops_{0};  // likewise written under the gate only
  std::atomic<bool> stop_requested_{false};
  std::vector<int> host_of_rank_;  // host index per rank, from the bootstrap's host hashes
  // LOOM_SHM_MAP_SHARED is on at every rank (agree_settings). Each rank's
  // own setting decides its receives; the tuner prices mapped reads from
  // this, so that every rank chooses the same algorithm.
  bool all_map_shared_ = true;

  // ---- diagnostics (src/diag): flight recorder, fingerprints, watchdog state
  Status diag_init(Deadline deadline);
  void diag_on_failure(const Status& st);
  std::unique_ptr<diag::FlightRecorder> recorder_;
  // The op whose recorder entry waits until it idles (run_sub): written
  // then (write_deferred_record), or whole at its end (record_whole).
  const SubOp* deferred_sub_ = nullptr;
  const RankSchedule* deferred_sched_ = nullptr;
  void write_deferred_record();
  void record_whole(bool ok);
  diag::Fingerprint fingerprint_;  // engine thread only
  bool fingerprints_ = true;
  uint64_t next_coll_seq_ = 0;              // issuing thread only
  std::atomic<uint64_t> running_seq_{0};    // seq + 1 of the op on the engine, 0 when none
  std::atomic<int64_t> running_since_ns_{0};
  std::atomic<uint64_t> last_seq_{0};       // seq + 1 of the last op the engine finished
  std::atomic<bool> last_failed_{false};
  std::atomic<bool> dumped_{false};
  std::atomic<bool> diag_registered_{false};
  int64_t last_idle_check_ns_ = 0;          // watchdog thread only
  std::string comm_id_;
  std::vector<std::string> peer_diag_addrs_;
};

}  // namespace detail
}  // namespace loom
