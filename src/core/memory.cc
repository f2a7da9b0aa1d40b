#include "core/memory.h"

#include <sys/mman.h>

#include <cstring>

#include "kernels/host_reduce.h"

namespace loom {
namespace {

class HostMemory final : public MemoryBackend {
 public:
  const char* name() const override { return "host"; }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (dst != src) std::memmove(dst, src, bytes);
  }
  void reduce(void* dst, const void* a, const void* b, size_t count, DataType dt, RedOp op) override {
    kernels::reduce2(dst, a, b, count, dt, op);
  }
  void divide(void* dst, size_t count, DataType dt, uint64_t n) override { kernels::divide(dst, dst, count, dt, n); }
  Result<void*> allocate(size_t bytes) override {
    // mmap: page-aligned, zero pages mapped lazily, returned to the OS on release.
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return system_error("allocating " + std::to_string(bytes) + " bytes of scratch", errno);
    return p;
  }
  void release(void* p, size_t bytes) override {
    if (p) munmap(p, bytes);
  }
};

}  // namespace

MemoryBackend& host_memory() {
  static HostMemory m;
  return m;
}

}  // namespace loom
