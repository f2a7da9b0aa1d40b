// CUDA device buffers staged through pinned host memory.
//
// Loom's engine reads and writes host memory. A call whose buffers are CUDA
// device memory runs on pinned host copies instead, all ordered on the
// caller's stream:
//   cudaMemcpyAsync(device -> staging)   what the collective reads
//   host function: start the op          (api_coll.cc, StreamOp / StartGate)
//   the stream waits for the op          (a flag word, or a blocking host fn)
//   cudaMemcpyAsync(staging -> device)   what the collective writes
//   host function: staging back to the pool
// Staging buffers come from a per-communicator pool (power-of-two size
// classes, reused: a training loop does not allocate per call) and are
// freed with cudaFreeHost when the communicator is destroyed. Host functions
// may not call CUDA, so a buffer given back from one after its pool closed
// waits in a graveyard that the next pool call on a user thread frees.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/cuda_loader.h"
#include "loom/status.h"

namespace loom::shim {

class StagingPool;

// One pinned host buffer, back to its pool when the last reference goes.
class StagingLease {
 public:
  StagingLease(std::shared_ptr<StagingPool> pool, void* ptr, size_t size_class)
      : pool_(std::move(pool)), ptr_(ptr), class_(size_class) {}
  ~StagingLease();
  StagingLease(const StagingLease&) = delete;
  StagingLease& operator=(const StagingLease&) = delete;
  std::byte* data() const { return static_cast<std::byte*>(ptr_); }

 private:
  std::shared_ptr<StagingPool> pool_;
  void* ptr_;
  size_t class_;
};

class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  explicit StagingPool(const cuda::CudaRuntimeApi& rt) : rt_(rt) {}
  // No CUDA here: the last lease may be dropped inside a host function.
  ~StagingPool() = default;

  // A buffer of at least `bytes` (reused when one of its class is idle).
  Result<std::shared_ptr<StagingLease>> take(size_t bytes);
  // Frees the idle buffers; buffers still out are freed when they come back
  // (through the graveyard). Call from a user thread, not a host function.
  void close();
  // Buffers allocated and not yet freed (idle + out).
  size_t allocated() const;

 private:
  friend class StagingLease;
  void give_back(void* ptr, size_t size_class);

  const cuda::CudaRuntimeApi& rt_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> idle_;  // by size class
  size_t allocated_ = 0;
  bool closed_ = false;
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
  StagePlan(const cuda::CudaRuntimeApi& rt, std::shared_ptr<StagingPool> pool) : rt_(rt), pool_(std::move(pool)) {}

  // The host pointer the op uses for [p, p + bytes): `p` itself when it is
  // not device memory. A range inside one staged before shares its copy (the
  // in-place forms), so stage the larger buffer of a call first.
  Result<void*> map(const void* p, size_t bytes, bool read, bool write);
  bool empty() const { return regions_.empty(); }

  // Each enqueues on `stream`; the first failure is returned.
  Status enqueue_copy_in(cuda::CudaStream stream);
  Status enqueue_copy_out(cuda::CudaStream stream);
  // Gives the staging buffers back once the stream has passed everything
  // enqueued before this. `self` is this plan's owner.
  Status enqueue_release(cuda::CudaStream stream, std::shared_ptr<StagePlan> self);

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
