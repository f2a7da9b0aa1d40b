// loom::Comm — a communicator: a fixed group of ranks that run collectives.
//
// Contract
// - Create with Comm::init_rank (unique id shared by the caller, like
//   ncclCommInitRank), Comm::init_from_env (LOOM_*, torchrun, Open MPI or Slurm
//   variables) or Comm::init_all (N ranks as threads of this process).
// - Every operation is asynchronous: it validates its arguments, enqueues, and
//   returns a Work handle. Operations of one communicator execute in the order
//   they were issued, on the communicator's progress engine. Every rank must
//   issue the same sequence of collectives.
// - Buffers must stay valid and untouched until the Work completes.
// - In-place: allreduce/broadcast/reduce/all_to_all with send == recv;
//   reduce_scatter with send + rank*count*size == recv; all_gather with
//   send == recv + rank*count*size (NCCL's conventions).
// - Every wait has a deadline (Config::timeout, LOOM_TIMEOUT). If a peer dies,
//   aborts or the deadline passes, the operation fails with a message naming
//   the peer and the step, the communicator is marked failed, and every later
//   operation fails at once with the first error.
// - Thread safety: one thread issues operations on a Comm at a time; Work
//   handles may be waited on from any thread; abort() may be called from any
//   thread at any time.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/status.h"
#include "loom/types.h"

namespace loom {

inline constexpr size_t kUniqueIdBytes = 128;

// Opaque rendezvous token (128 bytes, like ncclUniqueId): the root's address and
// a random secret that every peer must present.
struct UniqueId {
  char bytes[kUniqueIdBytes] = {};
};

struct Config {
  // Deadline for every wait, in seconds; <= 0 takes LOOM_TIMEOUT (default 300).
  double timeout_s = 0;
  // Name used in logs and diagnostics ("tp", "dp0", ...).
  std::string name;
  // Optional: set it to true from any thread to make an init_rank still
  // waiting for its peers fail at once with kAborted (ncclCommAbort of a
  // communicator that is still initialising). Not looked at after init.
  std::shared_ptr<std::atomic<bool>> cancel;
};

// Creates a unique id and, in this process, the rendezvous root that the
// ranks connect to. Call on one rank and hand the bytes to every rank. The
// root listens on LOOM_SOCKET_IFNAME, else on the interface NCCL would pick
// (ib*, then any but loopback/docker*, then docker*, then loopback), so the
// id works from other hosts too.
Result<UniqueId> get_unique_id();

namespace detail {
struct WorkState;
class CommImpl;
}  // namespace detail

// Handle to an enqueued operation. Cheap to copy; all copies share one state.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::WorkState> s) : state_(std::move(s)) {}
  // Blocks until the operation finishes or `timeout` passes. Returns the
  // operation's status, or kTimeout if the wait (not the op) timed out.
  Status wait(std::chrono::milliseconds timeout = std::chrono::milliseconds::max()) const;
  // True once the operation has finished (successfully or not).
  bool test() const;
  // The final status; kInProgress while running.
  Status status() const;
  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<detail::WorkState> state_;
};

class Comm {
 public:
  ~Comm();  // destroys (waits for queued operations, then releases resources)
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  static Result<std::unique_ptr<Comm>> init_rank(const UniqueId& id, int nranks, int rank,
                                                 const Config& config = {});
  // Reads LOOM_RANK/LOOM_WORLD_SIZE/LOOM_ROOT_ADDR (host:port), else RANK/
  // WORLD_SIZE/MASTER_ADDR/MASTER_PORT (torchrun), else OMPI_COMM_WORLD_RANK/
  // OMPI_COMM_WORLD_SIZE (+ LOOM_ROOT_ADDR or MASTER_ADDR/PORT), else
  // SLURM_PROCID/SLURM_NTASKS (likewise). Rank 0 listens on the root address.
  static Result<std::unique_ptr<Comm>> init_from_env(const Config& config = {});
  // N ranks as threads of this process; element i is rank i.
  static Result<std::vector<std::unique_ptr<Comm>>> init_all(int nranks, const Config& config = {});

  // Collective: ranks with the same color form a new communicator, ordered by
  // (key, old rank). color < 0 means "not part of any": returns nullptr.
  Result<std::unique_ptr<Comm>> split(int color, int key);

  // Called by the ranks NOT in `exclude` only (excluded ranks may be dead):
  // they form a new communicator whose ranks follow their old order. With
  // abort_first this communicator is aborted first (error recovery: its
  // outstanding operations fail at once); it must still be destroyed. Every
  // survivor must pass the same list (any order). Bad lists (this rank, out of
  // range, everyone) are kInvalidArgument; lists that differ between
  // survivors are kInvalidUsage on all of them. An empty name in `config`
  // gives "<name>.shrink"; timeout_s <= 0 keeps this communicator's timeout.
  Result<std::unique_ptr<Comm>> shrink(const std::vector<int>& exclude, bool abort_first = false,
                                       const Config& config = {});

  int rank() const;
  int size() const;
  const std::string& name() const;

  Result<Work> allreduce(const void* send, void* recv, size_t count, DataType dt, RedOp op);
  // recv receives count elements: this rank's block of the reduction of
  // send (nranks*count elements).
  Result<Work> reduce_scatter(const void* send, void* recv, size_t count, DataType dt, RedOp op);
  // send holds count elements; recv receives nranks*count.
  Result<Work> all_gather(const void* send, void* recv, size_t count, DataType dt);
  // send significant at root only; recv receives count elements on every rank.
  Result<Work> broadcast(const void* send, void* recv, size_t count, DataType dt, int root);
  // recv significant at root only (may be null elsewhere).
  Result<Work> reduce(const void* send, void* recv, size_t count, DataType dt, RedOp op, int root);
  // send and recv hold nranks*count elements; block j of send goes to rank j.
  Result<Work> all_to_all(const void* send, void* recv, size_t count, DataType dt);

  // Point-to-point. Outside a group each call is its own operation (and a
  // blocking send waits for the matching recv). Inside group_start/group_end
  // all sends and receives progress together and complete together; their
  // data types may differ (the two ends of one message must move the same
  // bytes; a group that mixes types is checked in bytes).
  Result<Work> send(const void* buf, size_t count, DataType dt, int peer);
  Result<Work> recv(void* buf, size_t count, DataType dt, int peer);

  // Groups nest; the outermost group_end submits everything issued since the
  // outermost group_start as one operation and returns its Work. Inner
  // group_end calls return an invalid Work. A group's collectives run in the
  // order they were called (the same on every rank); its sends and receives
  // run together after them, wherever among the collectives a rank called
  // them (as NCCL, which queues them apart from the collectives).
  void group_start();
  Result<Work> group_end();

  // Fails every queued and running operation with kAborted, tells the peers,
  // and releases transports. Safe from any thread; idempotent.
  void abort(const std::string& reason = "abort() called");
  // For blocking layers on top of Loom (the NCCL shim's blocking
  // communicators, benchmarks' blocking mode): the issuing thread promises to
  // call Work::wait() (no timeout) on every op it issues, at once. The engine
  // thread is then not woken for them; the waiting thread runs them itself,
  // which saves two context switches per op, and when nothing is queued or
  // running the call itself runs the op and returns a completed Work. An op
  // that is never waited for only runs when something else wakes the engine.
  // Issuing thread only.
  void set_caller_waits(bool on);
  // Revoke (NCCL 2.28's ncclCommRevoke): stops every queued and running
  // operation and tells the peers, like abort(): here they fail with "communicator
  // revoked by rank R", on the peers as soon as they wait on this rank.
  // Unlike abort() the communicator stays usable for management: split() and
  // shrink() still work (they meet through the bootstrap's star rendezvous,
  // not the ring or a collective), while new operations fail with
  // kInvalidUsage. Every rank is expected to revoke, and split() after a
  // revoke needs every rank to have revoked (revoked ranks meet through the
  // star, the others through the ring). Returns at once; poll quiescent() to
  // know when the operations have ended (split and shrink wait for it).
  // Safe from any thread; idempotent.
  void revoke();
  bool revoked() const;
  // True when no operation is queued or running.
  bool quiescent() const;
  // Waits for queued operations and releases everything. Operations after
  // destroy fail with kInvalidUsage. Idempotent.
  Status destroy();
  // First error that failed the communicator, or ok.
  Status async_error() const;
  // The tuner's predicted time (microseconds) of one collective of `bytes` on
  // this communicator, with the algorithm it would choose (what
  // ncclGroupSimulateEnd reports). `bytes` as nccl-tests counts sizes: the
  // buffer for allreduce/broadcast/reduce/send, the whole output of
  // all_gather, the whole input of reduce_scatter, one rank's whole send
  // buffer for all_to_all.
  Result<double> predict_us(Collective coll, size_t bytes) const;

  detail::CommImpl* impl() { return impl_.get(); }

 private:
  explicit Comm(std::unique_ptr<detail::CommImpl> impl);
  std::unique_ptr<detail::CommImpl> impl_;
  friend class detail::CommImpl;
};

}  // namespace loom
