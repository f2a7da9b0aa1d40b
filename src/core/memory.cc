#include "core/memory.h"

#include <sys/mman.h>

#include <cstring>

#include "core/config.h"
#include "core/shared_buffers.h"
#include "kernels/host_reduce.h"
#include "loom/memory.h"

namespace loom {
namespace {

class HostMemory final : public MemoryBackend {
 public:
  const char* name() const override { return "host"; }
  // Copies from this size take streaming stores (LOOM_COPY_STREAM_BYTES).
  const uint64_t stream_bytes_ = params::copy_stream_bytes();
  void copy(void* dst, const void* src, size_t bytes) override {
    if (dst == src) return;
    const auto* d = static_cast<const std::byte*>(dst);
    const auto* s = static_cast<const std::byte*>(src);
    if (bytes >= stream_bytes_ && stream_bytes_ > 0 && (d + bytes <= s || s + bytes <= d))
      kernels::stream_copy(dst, src, bytes);
    else
      std::memmove(dst, src, bytes);
  }
  void reduce(void* dst, const void* a, const void* b, size_t count, DataType dt, RedOp op) override {
    kernels::reduce2(dst, a, b, count, dt, op);
  }
  void divide(void* dst, size_t count, DataType dt, uint64_t n) override { kernels::divide(dst, dst, count, dt, n); }
  Result<void*> allocate(size_t bytes) override {
    // Scratch that messages leave from (ring partial sums, halving's working
    // copy) in mem_alloc memory when it is large enough to be sent single
    // copy: peers on this host then read it through a mapping, and between
    // oversubscribed ranks a reduced message from it costs the sender no
    // copy (Segment::map_min_bytes in the shm transport).
    if (bytes >= kMemAllocMinBytes)
      if (Result<void*> r = shared_buffers::allocate(bytes); r.is_ok()) return *r;
    // mmap: page-aligned, zero pages mapped lazily, returned to the OS on release.
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return system_error("allocating " + std::to_string(bytes) + " bytes of scratch", errno);
    return p;
  }
  void release(void* p, size_t bytes) override {
    if (p && !shared_buffers::release(p)) munmap(p, bytes);
  }
};

}  // namespace

MemoryBackend& host_memory() {
  static HostMemory m;
  return m;
}

}  // namespace loom
