// CUDA device buffers staged through pinned host memory.
//
// Loom's engine reads and writes host memory. A call whose buffers are CUDA
// device memory runs on pinned host copies instead, all ordered on the
// caller's stream:
//   cudaMemcpyAsync(device -> staging)   what the collective reads
//   host function: start the op          (api_coll.cc, StreamOp / StartGate)
//   the stream waits for the op          (the comm's flag word, or a blocking host fn)
//   cudaMemcpyAsync(staging -> device)   what the collective writes
//   host function: staging back to the pool
// Staging buffers come from a per-communicator pool (power-of-two size
// classes, reused: a training loop does not allocate per call) and are
// freed with cudaFreeHost when the communicator is destroyed. Host functions
// may not call CUDA, so a buffer given back from one after its pool closed
// waits in a graveyard that the next pool call on a user thread frees.
//
// Calls queued on one stream share buffers: once a call's last copy is on
// its stream, the next call on that stream may take the same buffer at once
// (the stream runs its copies, and the op that waits for them, after the
// earlier call's copy out), while a call on another stream waits until the
// stream has passed the earlier call (its release host function). Without
// this the pool held one buffer per call in flight (a queue of 20 16 MiB
// calls: 20 x 2 buffers, and a working set 20 times the cache's).
//
// The stream waits for its op on one word per communicator: each
// stream-ordered op gets the next ticket, and the stream waits until the word
// (cyclically, cuStreamWaitValue32's GEQ) reaches its ticket. The word is the
// highest ticket up to which every op is done: an op's end may come before
// an earlier op's (the earlier one's completion steps, e.g. Gather's root
// block, run on its own thread), and a stream must not pass an op that is
// not done because a later one is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda/cuda_loader.h"
#include "loom/status.h"

namespace loom::shim {

class StagingPool;

// One pinned host buffer, back to its pool when the last reference goes.
class StagingLease {
 public:
  StagingLease(std::shared_ptr<StagingPool> pool, void* ptr, uint64_t taker)
      : pool_(std::move(pool)), ptr_(ptr), taker_(taker) {}
  ~StagingLease();
  StagingLease(const StagingLease&) = delete;
  StagingLease& operator=(const StagingLease&) = delete;
  std::byte* data() const { return static_cast<std::byte*>(ptr_); }

 private:
  friend class StagingPool;
  std::shared_ptr<StagingPool> pool_;
  void* ptr_;
  uint64_t taker_;       // which take() this lease is (the pool's record names its current taker)
  bool handed_ = false;  // given to its stream (hand_to_stream)
};

// A stream's place in line for the comm's flag word: the stream waits until
// the word (cyclically) reaches wait_value(); done() once the op is done.
struct FlagTicket {
  std::shared_ptr<StagingPool> pool;
  std::shared_ptr<StagingLease> lease;  // the word's buffer: hold it while the word may be used
  uint32_t* word = nullptr;
  unsigned long long device_address = 0;  // what cuStreamWaitValue32 takes
  uint64_t ticket = 0;
  uint32_t wait_value() const { return static_cast<uint32_t>(ticket); }
  void done() const;
};
// Whether the word has (cyclically) reached `value`, as cuStreamWaitValue32's GEQ.
bool flag_reached(const uint32_t* word, uint32_t value);

class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  explicit StagingPool(const cuda::CudaRuntimeApi& rt) : rt_(rt) {}
  // No CUDA here: the last lease may be dropped inside a host function.
  ~StagingPool() = default;

  // A buffer of at least `bytes` (reused when one of its class is idle).
  // `stream`: the caller's stream (0: none, or one whose handle may name
  // different streams); an idle buffer last given to that stream comes first.
  Result<std::shared_ptr<StagingLease>> take(size_t bytes, uintptr_t stream = 0);
  // The lease's last use is on its stream now (copies enqueued): a later
  // take() on the same stream may have the buffer at once; others only once
  // the lease is dropped (after the stream has passed those copies).
  void hand_to_stream(StagingLease& lease);
  // The next ticket on the comm's flag word (the word allocated on first use).
  Result<FlagTicket> next_flag_ticket();
  // The op of `ticket` is done (every ticket taken must be done once, or
  // the streams waiting for later ones wait forever): the word moves up to
  // the highest ticket below which all are done.
  void flag_done(uint64_t ticket);
  // Tests: the next ticket is `t` (to cross the word's wraparound).
  void set_next_ticket_for_test(uint64_t t);
  // Frees the idle buffers; buffers still out are freed when they come back
  // (through the graveyard). Call from a user thread, not a host function.
  void close();
  // Buffers allocated and not yet freed (idle + out).
  size_t allocated() const;

 private:
  friend class StagingLease;
  void give_back(StagingLease& lease);
  void make_idle(void* ptr, size_t size_class);  // mu_ held

  struct Buf {
    size_t size_class = 0;
    uintptr_t stream = 0;  // the stream it was last taken for (0: none)
    int pending = 0;       // handed-over leases whose stream has not passed them yet
    uint64_t taker = 0;    // the lease that holds it now (0: none)
  };
  const cuda::CudaRuntimeApi& rt_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Buf> bufs_;                                  // every buffer not yet freed
  std::map<size_t, std::vector<void*>> idle_;                            // free for anyone, by size class
  std::map<std::pair<uintptr_t, size_t>, std::vector<void*>> stream_idle_;  // free for one stream
  uint64_t next_taker_ = 0;
  size_t allocated_ = 0;
  bool closed_ = false;
  std::shared_ptr<StagingLease> flag_;  // the flag word's buffer (dropped by close())
  uint32_t* flag_word_ = nullptr;       // in it (kept: ticket holders still store)
  unsigned long long flag_device_address_ = 0;
  uint64_t last_ticket_ = 0;    // the last ticket given
  uint64_t done_upto_ = 0;      // every ticket <= this is done (the word's value)
  std::set<uint64_t> done_early_;  // done tickets above done_upto_ + 1
};

// A communicator's pool, created on first use; closed when the comm goes.
class StagingRef {
 public:
  StagingRef() = default;
  ~StagingRef();
  StagingRef(const StagingRef&) = delete;
  StagingRef& operator=(const StagingRef&) = delete;
  std::shared_ptr<StagingPool> get(const cuda::CudaRuntimeApi& rt);

 private:
  std::mutex mu_;
  std::shared_ptr<StagingPool> pool_;
};

// The staging of one call: which device ranges map to which host copies and
// which parts are copied in (read by the op) and out (written by it).
class StagePlan {
 public:
  // `stream`: the call's stream (its key for StagingPool::take).
  StagePlan(const cuda::CudaRuntimeApi& rt, std::shared_ptr<StagingPool> pool, uintptr_t stream)
      : rt_(rt), pool_(std::move(pool)), stream_(stream) {}

  // The host pointer the op uses for [p, p + bytes): `p` itself when it is
  // not device memory. A range inside one staged before shares its copy (the
  // in-place forms), so stage the larger buffer of a call first.
  Result<void*> map(const void* p, size_t bytes, bool read, bool write);
  bool empty() const { return regions_.empty(); }

  // Each enqueues on `stream`; the first failure is returned.
  Status enqueue_copy_in(cuda::CudaStream stream);
  Status enqueue_copy_out(cuda::CudaStream stream);
  // The plan's copies are all on its stream: later calls on that stream may
  // reuse its buffers (StagingPool::hand_to_stream).
  void hand_to_stream();

 private:
  struct Region {
    const std::byte* dev;
    size_t bytes;
    std::shared_ptr<StagingLease> lease;
  };
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  const cuda::CudaRuntimeApi& rt_;
  std::shared_ptr<StagingPool> pool_;
  uintptr_t stream_;
  std::vector<Region> regions_;
  std::vector<Copy> in_, out_;
};

// Drops `keep` (a lease, a plan) in a host function once the stream has
// passed everything enqueued on it so far.
Status keep_until_passed(const cuda::CudaRuntimeApi& rt, cuda::CudaStream stream, std::shared_ptr<void> keep);

// Runs `job` on a helper thread of its own (threads are reused; there are as
// many as jobs run at once). For waits that must not run in a host function.
void run_off_stream(std::function<void()> job);

}  // namespace loom::shim
