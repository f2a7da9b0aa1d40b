// Memory backend seam: everything the executor does to user memory goes
// through here (copy, reduce, divide, allocate, register, stream ordering),
// so CUDA device memory plugs in as a second backend without touching the
// algorithms or the executor's control flow.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/status.h"
#include "loom/types.h"

namespace loom {

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual const char* name() const = 0;
  // True when the CPU can read and write this backend's buffers directly, so
  // transports may copy into them themselves (host memory; not device memory).
  virtual bool host_accessible() const { return true; }
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // dst[i] = a[i] op b[i]; dst may alias a or b exactly.
  virtual void reduce(void* dst, const void* a, const void* b, size_t count, DataType dt, RedOp op) = 0;
  virtual void divide(void* dst, size_t count, DataType dt, uint64_t n) = 0;
  virtual Result<void*> allocate(size_t bytes) = 0;
  virtual void release(void* p, size_t bytes) = 0;
  // Pins / registers a user buffer for zero-copy transports (no-op on host).
  virtual Status register_buffer(void* p, size_t bytes) { return Status::ok(); }
  // Makes prior work on the user's stream visible before the op reads buffers
  // (host: nothing to wait for).
  virtual Status stream_wait(void* stream) { return Status::ok(); }
};

// The host backend: SIMD reductions from src/kernels.
MemoryBackend& host_memory();

}  // namespace loom
