// The harness's view of Loom: the tp x pp x dp process grid built with
// Comm::init_from_env + Comm::split, and thin wrappers around loom::Comm that
// count calls, bytes and the time a rank spends blocked in each collective.
//
// Everything here uses only the public API (include/loom/comm.h). A Loom
// error is fatal for the harness: the rank prints it, aborts its
// communicators (so the peers learn at once) and exits with status 1.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm.h"

namespace loom::harness {

// Per-collective totals for one rank.
struct CollStats {
  uint64_t calls = 0;
  uint64_t bytes = 0;    // payload this rank handed to the collective
  double seconds = 0;    // time blocked issuing and waiting
};

class CommStats {
 public:
  void add(const std::string& kind, uint64_t bytes, double seconds);
  void reset() { by_kind_.clear(); }
  double total_seconds() const;
  // "allreduce 24x 1.50MiB 3.1ms, sendrecv 8x ..." (empty when nothing ran).
  std::string summary() const;
  const std::map<std::string, CollStats>& by_kind() const { return by_kind_; }

 private:
  std::map<std::string, CollStats> by_kind_;
};

// One communicator plus the stats it reports into. A null comm stands for a
// group of one rank: every operation is then a no-op (single-rank runs need
// no Loom communicator at all).
class Group {
 public:
  Group(std::unique_ptr<Comm> comm, CommStats* stats);
  int rank() const { return comm_ ? comm_->rank() : 0; }
  int size() const { return comm_ ? comm_->size() : 1; }
  Comm* comm() { return comm_.get(); }

  // Blocking sum in place.
  void allreduce_sum(float* p, size_t n);
  void allreduce_sum(double* p, size_t n);
  // Asynchronous sum in place; finish with wait().
  Work allreduce_sum_async(float* p, size_t n);
  void wait(const Work& w, const char* kind, uint64_t bytes);
  // Blocking ZeRO pieces: send holds size()*n values, recv gets n.
  void reduce_scatter_sum(const float* send, float* recv, size_t n);
  // In place: p holds size()*n values; this rank's block is at rank()*n.
  void all_gather_inplace(float* p, size_t n);
  void reduce_sum_to_root(const float* send, float* recv, size_t n);
  void broadcast(int* p, size_t n, int root);

  // Point-to-point inside one group_start/group_end, then wait for all.
  struct P2p {
    void* buf;
    size_t count;  // floats
    int peer;
    bool send;
  };
  void exchange(const std::vector<P2p>& ops);

  // Ends the process after printing `what` and aborting every communicator.
  [[noreturn]] static void fail(const std::string& what, const Status& st);

 private:
  std::unique_ptr<Comm> comm_;
  CommStats* stats_;
};

// Rank layout: tp innermost (neighbours share a node first, as Megatron
// orders them), then pp, then dp: world = (dp_rank*pp + pp_rank)*tp + tp_rank.
struct Grid {
  int world_rank = 0, world_size = 1;
  int tp = 1, pp = 1, dp = 1;
  int tp_rank = 0, pp_rank = 0, dp_rank = 0;
  std::unique_ptr<Group> world, tp_group, pp_group, dp_group;
};

// Creates the world communicator from the environment (loomrun, torchrun,
// mpirun, Slurm variables) and splits it; a 1x1x1 run without such variables
// gets a grid without communicators. `timeout_s` <= 0 keeps Loom's default.
Result<Grid> make_grid(int tp, int pp, int dp, CommStats* stats, double timeout_s);

// Seconds since an arbitrary epoch (steady clock).
inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace loom::harness
