// loom::mem_alloc — host memory that the other ranks of this host can map.
//
// A large message between two processes of one host normally travels by a
// single copy: the receiver reads the sender's buffer with process_vm_readv,
// which pins every page of it in the kernel on each call. A buffer from
// mem_alloc lives in a shared-memory file instead; a receiving rank maps it
// once (pidfd_getfd + mmap) and from then on reads it with plain loads: no
// system call and no page pinning per message, and a reduction reads the
// sender's data in place instead of through a staging buffer.
//
// Nothing else changes: any pointer into such a buffer may be passed to any
// operation, buffers may be mixed with ordinary memory, and where mapping is
// not permitted (another user's process, a kernel without pidfd_getfd, or
// LOOM_SHM_MAP_SHARED=0) the transport falls back to process_vm_readv.
// ncclMemAlloc / ncclMemFree in the NCCL shim allocate host memory this way
// where no CUDA runtime sees a GPU (with one, they return device memory, as
// NVIDIA's do).
//
// Each buffer holds a file descriptor and a mapping until it is freed: use it
// for the few large buffers collectives move (messages from 256 KiB go single
// copy), not for every small allocation.
//
// A freed buffer's memory is released once every peer has dropped its
// mapping: a peer drops its mappings of a process that freed one when the
// next message from that process's mem_alloc memory arrives, or when it maps more than
// kMaxPeerMappings buffers (shm transport).
#pragma once

#include <cstddef>
#include <new>

#include "loom/status.h"

namespace loom {

// Zero-filled, page-aligned host memory of at least `bytes` (> 0) bytes.
Result<void*> mem_alloc(size_t bytes);
// Frees memory from mem_alloc; nullptr is a no-op. kInvalidArgument for a
// pointer mem_alloc did not return (or one already freed).
Status mem_free(void* p);

// Allocations of at least this many bytes are worth a mem_alloc buffer
// (single-copy message size); smaller ones never cross by single copy.
inline constexpr size_t kMemAllocMinBytes = size_t{256} << 10;

// A standard allocator for containers whose data collectives move, e.g.
// std::vector<float, loom::MemAllocator<float>> grads: blocks of at least
// kMemAllocMinBytes come from mem_alloc (zero-filled), smaller ones (and any
// mem_alloc failure) from operator new.
template <class T>
struct MemAllocator {
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "over-aligned types are not supported");
  using value_type = T;
  MemAllocator() = default;
  template <class U>
  MemAllocator(const MemAllocator<U>&) noexcept {}
  T* allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    if (n * sizeof(T) >= kMemAllocMinBytes) {
      Result<void*> r = mem_alloc(n * sizeof(T));
      if (r.is_ok()) return static_cast<T*>(*r);
    }
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) >= kMemAllocMinBytes && mem_free(p).is_ok()) return;
    ::operator delete(p);
  }
  template <class U>
  bool operator==(const MemAllocator<U>&) const noexcept { return true; }
};

}  // namespace loom
