#include "core/shared_buffers.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <mutex>
#include <random>
#include <string>

#include "loom/memory.h"

namespace loom {
namespace shared_buffers {
namespace {

struct Entry {
  size_t bytes;  // mapped (page-rounded)
  Ref ref;
};

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Entry> by_addr;  // key: start address
  std::atomic<size_t> live{0};
  std::atomic<uint64_t> releases{0};
  uint64_t next_id;
  Registry() {
    // Ids must not repeat across processes either: a peer caches mappings by
    // (pid, id), and a pid can be reused by a later process.
    std::random_device rd;
    next_id = (static_cast<uint64_t>(rd()) << 32 | rd()) & ~uint64_t{0xffff};
  }
};

Registry& reg() {
  static auto* r = new Registry();  // leaked: buffers may be freed during exit
  return *r;
}

}  // namespace

Result<void*> allocate(size_t bytes) {
  if (bytes == 0) return invalid_argument("mem_alloc: size is 0");
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (bytes > SIZE_MAX - page) return invalid_argument("mem_alloc: size " + std::to_string(bytes) + " overflows");
  const size_t rounded = (bytes + page - 1) / page * page;
  const int fd = memfd_create("loom-buffer", MFD_CLOEXEC);
  if (fd < 0) return system_error("mem_alloc: memfd_create", errno);
  struct stat st {};
  if (ftruncate(fd, static_cast<off_t>(rounded)) != 0 || fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return system_error("mem_alloc(" + std::to_string(bytes) + "): sizing the buffer's file", err);
  }
  void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return system_error("mem_alloc(" + std::to_string(bytes) + "): mmap", err);
  }
  Registry& r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  Ref ref;
  ref.id = r.next_id++;
  ref.fd = fd;
  ref.inode = static_cast<uint64_t>(st.st_ino);
  ref.file_bytes = rounded;
  r.by_addr[reinterpret_cast<uintptr_t>(p)] = Entry{rounded, ref};
  r.live.fetch_add(1, std::memory_order_release);
  return p;
}

bool release(void* p) {
  Registry& r = reg();
  Entry e;
  {
    std::lock_guard<std::mutex> lk(r.mu);
    auto it = r.by_addr.find(reinterpret_cast<uintptr_t>(p));
    if (it == r.by_addr.end()) return false;
    e = it->second;
    r.by_addr.erase(it);
    r.live.fetch_sub(1, std::memory_order_release);
    r.releases.fetch_add(1, std::memory_order_release);
  }
  munmap(p, e.bytes);
  close(e.ref.fd);
  return true;
}

std::optional<Ref> find(const void* p, size_t len) {
  Registry& r = reg();
  if (r.live.load(std::memory_order_acquire) == 0) return std::nullopt;
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.by_addr.upper_bound(a);
  if (it == r.by_addr.begin()) return std::nullopt;
  --it;
  const uintptr_t base = it->first;
  if (a - base >= it->second.bytes || len > it->second.bytes - (a - base)) return std::nullopt;
  Ref ref = it->second.ref;
  ref.offset = a - base;
  return ref;
}

uint64_t releases() { return reg().releases.load(std::memory_order_acquire); }
size_t live() { return reg().live.load(std::memory_order_acquire); }

}  // namespace shared_buffers

Result<void*> mem_alloc(size_t bytes) { return shared_buffers::allocate(bytes); }

Status mem_free(void* p) {
  if (p == nullptr) return Status::ok();
  if (!shared_buffers::release(p)) return invalid_argument("mem_free: pointer was not returned by mem_alloc (or is freed)");
  return Status::ok();
}

}  // namespace loom
