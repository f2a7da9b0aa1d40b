// Executes one rank's Schedule over the transports (schedule.h semantics):
// local steps through the memory backend, communication steps streamed
// through the connections, every wait bounded by the op's deadline and the
// communicator's abort flag, with peers checked for death or abort while idle.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "bootstrap/socket.h"
#include "core/memory.h"
#include "transport/transport.h"

namespace loom {

// Live position of the running op, readable from other threads (diagnostics).
struct ExecProgress {
  std::atomic<uint64_t> seq{0};
  std::atomic<int> phase{-1};
  std::atomic<int> nphases{0};
  std::atomic<int> waiting_peer{-1};
};

class Executor {
 public:
  Executor(int rank, int nranks, Transport* transport, MemoryBackend* mem, const std::atomic<bool>* abort);

  // Runs `sched`; `bufs` indexed by BufId (scratch is provided here).
  // `what` names the op in errors ("allreduce #57 (ring, 1024 x float32)").
  Status run(const RankSchedule& sched, std::vector<std::byte*>& bufs, DataType dt, RedOp op, Deadline deadline,
             const std::string& what);

  ExecProgress& progress() { return progress_; }
  ~Executor();

 private:
  struct Active {
    const Step* step;
    Connection* conn;
    std::byte* dst;          // recv destination
    const std::byte* src;    // send source or recv_reduce local operand
    size_t total = 0;        // bytes
    size_t done = 0;
  };
  Status run_phase(const Phase& ph, std::vector<std::byte*>& bufs, DataType dt, RedOp op, Deadline deadline,
                   const std::string& what, size_t phase_index, size_t nphases);
  Status ensure_scratch(size_t bytes);

  int rank_, nranks_;
  Transport* transport_;
  MemoryBackend* mem_;
  const std::atomic<bool>* abort_;
  int spin_;
  std::byte* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::vector<Active> active_;
  std::vector<uint64_t> send_gate_, recv_gate_;
  uint64_t iter_ = 0;
  ExecProgress progress_;
};

}  // namespace loom
