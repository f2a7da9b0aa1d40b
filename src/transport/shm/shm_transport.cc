#include "transport/shm/shm_transport.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <vector>

#include "core/config.h"
#include "core/log.h"
#include "core/shared_buffers.h"
#include "core/shared_stores.h"

#include "transport/shm/shm_connection.h"
#include "transport/shm/shm_layout.h"

namespace loom {
using namespace shm;  // NOLINT: the layout and helpers shared with shm_connection.cc
namespace {

bool process_alive(int pid) {
  if (pid <= 0) return true;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  // A killed child not yet reaped by its parent is a zombie: count it dead.
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return true;  // cannot tell (other pid namespace?)
  size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

std::atomic<bool (*)(int)> g_liveness_probe{nullptr};  // tests (set_liveness_probe_for_test)

bool peer_alive(int pid) {
  bool (*probe)(int) = g_liveness_probe.load(std::memory_order_acquire);
  return probe ? probe(pid) : process_alive(pid);
}

// A random number of this process, never 0; a forked child draws its own.
std::atomic<uint64_t> g_proc_token{0};
uint64_t process_token() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, [] { g_proc_token.store(0); }); });
  uint64_t t = g_proc_token.load();
  if (t != 0) return t;
  uint64_t fresh = 0;
  if (getrandom(&fresh, sizeof(fresh), 0) != sizeof(fresh))
    fresh = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9e3779b97f4a7c15ull;
  fresh |= 1;
  return g_proc_token.compare_exchange_strong(t, fresh) ? fresh : t;  // t: another thread's, if it won
}

// The inode of this process's pid namespace, 0 when /proc cannot tell.
uint64_t own_pid_namespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// Liveness of a peer whose pid means nothing here (another pid namespace):
// its creator holds an exclusive flock on its segment for as long as it
// lives (the kernel drops it when the process dies); `fd` is ours on that
// segment. True while the lock is held, or when this cannot tell.
bool segment_owner_alive(int fd) {
  if (fd < 0) return true;
  if (flock(fd, LOCK_SH | LOCK_NB) != 0) return true;  // held (EWOULDBLOCK) or cannot tell
  flock(fd, LOCK_UN);
  return false;
}

// Maps [p, p+len) now instead of on first use. A FIFO is touched page by page
// as it fills for the first time; each first touch is a page fault in the
// sender's mapping and another in the receiver's (about 10 us each in a VM),
// which made the first few hundred small and mid-size operations of a job 10-100x
// slower than the steady state. MADV_POPULATE_WRITE (Linux 5.14) faults the
// range in one call; then every page is read once as well: under a sandboxing
// kernel such as gVisor (this project's CI machines) madvise and MAP_POPULATE
// succeed without mapping anything into the process, and only a touch does.
// Measured there, 16 MiB of shm after MADV_POPULATE_WRITE: first memset 23-34
// ms, second 0.7-1.1 ms, after a read per page 0.66 ms; 8 ranks on 2 cores, a
// 64 KiB two-shot allreduce ran 1.3-1.7 ms per op for its first ~130 ops (until
// every FIFO had wrapped once), 0.13-0.15 ms after. Reads, not writes: the
// peers' FIFOs are only read here, and a read maps the page in either case.
// `writable`: we will write the bytes (our outbound FIFO).
std::atomic<uint64_t> g_prefaulted_pages{0};
void prefault(std::byte* p, size_t len, bool writable) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto begin = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  auto end = (reinterpret_cast<uintptr_t>(p) + len + page - 1) & ~(page - 1);
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;
#endif
#ifndef MADV_POPULATE_READ
  constexpr int MADV_POPULATE_READ = 22;
#endif
  (void)madvise(reinterpret_cast<void*>(begin), end - begin, writable ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
  uint64_t touched = 0;
  for (uintptr_t a = begin; a < end; a += page, ++touched) (void)*reinterpret_cast<volatile const std::byte*>(a);
  g_prefaulted_pages.fetch_add(touched, std::memory_order_relaxed);
}

// One mapping per segment per process. Ranks that are threads of one process
// (Comm::init_all) use the mapping that already exists instead of mapping the
// segment again at another address: the FIFO counters' release/acquire pairs
// then sit at one address, which is what ThreadSanitizer (and any reader of
// the code) can see, and the address space is not spent twice.
class SegmentMaps {
 public:
  static SegmentMaps& get() {
    static auto* maps = new SegmentMaps();  // leaked: destructors may run at exit
    return *maps;
  }
  void add(const std::string& name, void* p, size_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    entries_.push_back({name, p, bytes, 1});
  }
  void* acquire(const std::string& name) {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& e : entries_)
      if (e.name == name) {
        ++e.refs;
        return e.p;
      }
    return nullptr;
  }
  void release(void* p) {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].p != p) continue;
      if (--entries_[i].refs == 0) {
        munmap(p, entries_[i].bytes);
        entries_.erase(entries_.begin() + static_cast<ptrdiff_t>(i));
      }
      return;
    }
  }

 private:
  struct Entry {
    std::string name;
    void* p;
    size_t bytes;
    int refs;
  };
  std::mutex mu_;
  std::vector<Entry> entries_;
};

// Two ranks of a host with different FIFO sizes (shm setup).
Status fifo_size_mismatch(int me, int peer, size_t my_fifo, size_t peer_fifo) {
  return invalid_usage("shm setup: rank " + std::to_string(peer) + " uses " + std::to_string(peer_fifo) +
                       " B FIFOs, rank " + std::to_string(me) + " uses " + std::to_string(my_fifo) +
                       " B: set LOOM_SHM_FIFO_BYTES the same on every rank of a host (or leave it unset)");
}

}  // namespace

std::string shm_segment_name(uint64_t secret, int rank, int pid) {
  char buf[80];
  snprintf(buf, sizeof(buf), "/loom-%016llx-%d-%d", static_cast<unsigned long long>(secret), rank, pid);
  return buf;
}

Result<std::unique_ptr<ShmTransport>> ShmTransport::create(Bootstrap& boot, const std::vector<bool>& local,
                                                           size_t fifo_bytes, Deadline deadline) {
  std::unique_ptr<ShmTransport> t(new ShmTransport());
  const int n = boot.nranks(), r = boot.rank();
  const int nlocal = static_cast<int>(std::count(local.begin(), local.end(), true));  // this rank included
  t->rank_ = r;
  t->nranks_ = n;
  t->fifo_bytes_ = std::max<size_t>(4096, round8(fifo_bytes));
  t->seg_bytes_ = kHeaderBytes + n * kFifoCtlBytes + n * t->fifo_bytes_;
  t->segs_.assign(n, nullptr);
  t->peer_fds_.assign(n, -1);
  t->conns_.resize(n);
  t->batch_.is_owed.assign(n, 0);
  t->batch_.owed.reserve(n);
  for (const auto& p : boot.peers()) {
    t->peer_pids_.push_back(p.pid);
    t->peer_hosts_.push_back(p.hostname);
  }
  t->own_name_ = shm_segment_name(boot.secret(), r, static_cast<int>(getpid()));

  // Every rank lays out its own segment and reads its peers' with its own
  // FIFO size: the ranks of a host must agree on it (LOOM_SHM_FIFO_BYTES set
  // in one launcher's environment only). Agreed before anything is created,
  // so that every rank fails with the reason, not only the first to see it.
  // Regression: mismatched ranks read each other's FIFOs at wrong offsets.
  {
    std::vector<uint64_t> sizes(static_cast<size_t>(n));
    sizes[static_cast<size_t>(r)] = t->fifo_bytes_;
    Status agreed = boot.allgather(sizes.data(), sizeof(uint64_t), deadline);
    if (!agreed.is_ok()) return agreed.with_context("shm setup: FIFO sizes");
    for (int i = 0; i < n; ++i)
      if (local[i] && sizes[static_cast<size_t>(i)] != t->fifo_bytes_)
        return fifo_size_mismatch(r, i, t->fifo_bytes_, sizes[static_cast<size_t>(i)]);
  }

  // Create our segment. A stale one with the same random name cannot exist
  // unless a previous job with the same secret was killed mid-init: replace it.
  shm_unlink(t->own_name_.c_str());
  int fd = shm_open(t->own_name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return system_error("shm_open " + t->own_name_, errno);
  if (ftruncate(fd, static_cast<off_t>(t->seg_bytes_)) != 0) {
    int e = errno;
    close(fd);
    shm_unlink(t->own_name_.c_str());
    return system_error("ftruncate shm segment (is /dev/shm large enough?)", e);
  }
  // Reserve the FIFOs local peers will write into now: a /dev/shm too small
  // for them (Docker's default is 64 MiB) fails here with a clear message
  // instead of a SIGBUS in the middle of a collective.
  for (int i = 0; i < n; ++i) {
    if (i == r || !local[i]) continue;
    int e = posix_fallocate(fd, static_cast<off_t>(fifo_offset(i, n, t->fifo_bytes_)),
                            static_cast<off_t>(t->fifo_bytes_));
    if (e != 0 && e != EOPNOTSUPP && e != EINVAL) {
      close(fd);
      shm_unlink(t->own_name_.c_str());
      const int local_peers = nlocal - 1;
      return system_error(fmt::format("reserving {} MiB of shared memory for {} local peers' FIFOs (is /dev/shm large "
                                      "enough? Docker: --shm-size; or lower LOOM_SHM_FIFO_BYTES)",
                                      (local_peers * t->fifo_bytes_) >> 20, local_peers),
                          e);
    }
  }
  void* p = mmap(nullptr, t->seg_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    close(fd);
    shm_unlink(t->own_name_.c_str());
    return system_error("mmap shm segment", e);
  }
  // Held until this process dies: how peers in another pid namespace tell
  // that it is alive (segment_owner_alive).
  (void)flock(fd, LOCK_EX | LOCK_NB);
  t->own_fd_ = fd;
  SegmentMaps::get().add(t->own_name_, p, t->seg_bytes_);
  auto* self = static_cast<Segment*>(p);
  t->segs_[r] = self;  // released by the destructor from here on
  self->pid = getpid();
  self->pid_ns = own_pid_namespace();
  self->proc_token = process_token();
  self->rank = r;
  new (&self->doorbell) std::atomic<uint32_t>(0);
  new (&self->waiters) std::atomic<uint32_t>(0);
  new (&self->aborted) std::atomic<uint32_t>(0);
  new (&self->closed) std::atomic<uint32_t>(0);
  const uint64_t single_copy = params::shm_single_copy_bytes(nlocal);
  const uint64_t single_copy_plain = params::shm_single_copy_plain_bytes(nlocal);
  const uint64_t single_copy_xproc = params::shm_single_copy_xproc_bytes(nlocal);
  const uint64_t single_copy_plain_xproc = params::shm_single_copy_plain_xproc_bytes(nlocal);
  self->cma_threshold = single_copy ? single_copy : UINT64_MAX;
  self->cma_plain_threshold = single_copy_plain ? single_copy_plain : UINT64_MAX;
  self->cma_xproc_threshold = single_copy_xproc ? single_copy_xproc : UINT64_MAX;
  self->slot_max_bytes = params::shm_slots() ? kSlotPayload : 0;
  self->cma_plain_xproc_threshold = single_copy_plain_xproc ? single_copy_plain_xproc : UINT64_MAX;
  self->hdr_min_bytes = params::shm_map_shared() ? params::shm_map_min_bytes() : UINT64_MAX;
  self->announced_min_bytes = params::shm_announced_min_bytes();
  self->cma_probe_addr = reinterpret_cast<uint64_t>(&t->cma_probe_);
  for (int i = 0; i < n; ++i) {
    new (&self->ctl(i)->tail) std::atomic<uint64_t>(0);
    new (&self->ctl(i)->head) std::atomic<uint64_t>(0);
    new (&self->ctl(i)->cma_ack) std::atomic<uint64_t>(0);
    new (&self->ctl(i)->slots_freed) std::atomic<uint64_t>(0);
    for (Slot& slot : self->ctl(i)->slots) new (&slot.stamp) std::atomic<uint64_t>(0);
  }
  std::atomic_thread_fence(std::memory_order_release);
  self->magic = kSegMagic;

  // Everyone created theirs -> map the peers' -> everyone mapped -> unlink ours.
  Status st = boot.barrier(deadline);
  if (!st.is_ok()) return st.with_context("shm setup");
  for (int i = 0; i < n; ++i) {
    if (i == r || !local[i]) continue;
    std::string name = shm_segment_name(boot.secret(), i, t->peer_pids_[static_cast<size_t>(i)]);
    void* q = SegmentMaps::get().acquire(name);  // a rank of this process
    if (q == nullptr) {
      int pfd = shm_open(name.c_str(), O_RDWR, 0600);
      if (pfd < 0)
        return system_error("shm_open peer segment " + name + " of rank " + std::to_string(i) +
                                " (ranks with the same host name and boot id must share /dev/shm: containers need "
                                "a common /dev/shm or --ipc=host; or set LOOM_HOST_ID per container, or "
                                "LOOM_TRANSPORT=socket)",
                            errno);
      q = mmap(nullptr, t->seg_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
      if (q == MAP_FAILED) {
        const int e = errno;
        close(pfd);
        return system_error("mmap peer segment of rank " + std::to_string(i), e);
      }
      SegmentMaps::get().add(name, q, t->seg_bytes_);
      if (other_pid_namespace(self, static_cast<Segment*>(q))) t->peer_fds_[i] = pfd;  // liveness by its lock
      else close(pfd);
    }
    t->segs_[i] = static_cast<Segment*>(q);
    if (t->segs_[i]->magic != kSegMagic || t->segs_[i]->rank != i)
      return internal_error("peer segment of rank " + std::to_string(i) + " is not initialised");
  }
  // Single copy needs permission to read the peers' memory (same user, and no
  // Yama/seccomp restriction): probe every local peer; if one fails, messages
  // to this rank fall back to the FIFO path.
  if (self->cma_threshold != UINT64_MAX || self->cma_plain_threshold != UINT64_MAX ||
      self->cma_xproc_threshold != UINT64_MAX || self->cma_plain_xproc_threshold != UINT64_MAX ||
      self->hdr_min_bytes != UINT64_MAX) {
    for (int i = 0; i < n; ++i) {
      if (i == r || !t->segs_[i]) continue;
      uint64_t word = 0;
      int err = 0;
      const bool foreign = other_pid_namespace(self, t->segs_[i]);
      if (foreign || !cma_read(same_process(self, t->segs_[i]), t->segs_[i]->pid, t->segs_[i]->cma_probe_addr,
                               reinterpret_cast<std::byte*>(&word), sizeof(word), &err) ||
          word != kCmaMagic) {
        LOOM_INFO(kLogShm, "rank {}: single-copy reads from rank {} not possible ({}); using FIFO copies", r, i,
                  foreign ? "it runs in another pid namespace"
                  : err   ? std::strerror(err)
                          : "probe mismatch");
        self->cma_threshold = UINT64_MAX;
        self->cma_plain_threshold = UINT64_MAX;
        self->cma_xproc_threshold = UINT64_MAX;
        self->cma_plain_xproc_threshold = UINT64_MAX;
        self->hdr_min_bytes = UINT64_MAX;  // a mapping that fails falls back to the same reads
        break;
      }
    }
  }
  // Shared single copy needs the reverse permission: writing into the peers
  // (the probe writes the word's own value back). Same-process peers copy
  // with memcpy and need no probe.
  bool can_push = self->cma_threshold != UINT64_MAX || self->cma_plain_threshold != UINT64_MAX ||
                  self->cma_xproc_threshold != UINT64_MAX || self->cma_plain_xproc_threshold != UINT64_MAX;
  for (int i = 0; i < n && can_push; ++i) {
    if (i == r || !t->segs_[i] || same_process(self, t->segs_[i])) continue;
    uint64_t word = kCmaMagic;
    int err = 0;
    const bool foreign = other_pid_namespace(self, t->segs_[i]);
    if (foreign || !cma_write(false, t->segs_[i]->pid, t->segs_[i]->cma_probe_addr,
                              reinterpret_cast<const std::byte*>(&word), sizeof(word), &err)) {
      LOOM_INFO(kLogShm, "rank {}: writing into rank {} not possible ({}); receivers copy alone", r, i,
                foreign ? "it runs in another pid namespace" : std::strerror(err));
      can_push = false;
    }
  }
  if (params::shm_shared_copy() == 0) can_push = false;
  // Not with more ranks than cores: the sender's half is a turn on a core
  // its readers need, and a root that only sends (a direct broadcast in
  // place) writes half of every receiver's copy, one after the other.
  // Measured, 2 cores, broadcast -A direct -R 1 in place (mapped reads),
  // us, pushing / not: 4 ranks 1 MiB 140-159 / 75-79, 4 MiB 523-599 /
  // 248-252, 16 MiB 4715-5029 / 2196-2202; 8 ranks 1 MiB 318-324 / 176-190,
  // 4 MiB 1718-2271 / 797-886, 16 MiB 8526-8980 / 5061-5627.
  if (params::oversubscribed(nlocal)) can_push = false;
  const size_t fifo_step = params::shm_fifo_step_bytes(nlocal);
  const size_t step = fifo_step ? std::max<size_t>(4096, round8(fifo_step)) : SIZE_MAX;
  const bool map_peers = params::shm_map_shared() != 0;
  const SharedStores::Policy stores = SharedStores::configured();
  // Before the barrier that lets traffic start: nobody writes a FIFO yet.
  for (int i = 0; i < n; ++i) {
    if (i == r || !t->segs_[i]) continue;
    prefault(reinterpret_cast<std::byte*>(self->ctl(i)), kFifoCtlBytes, false);      // control + slots from i
    prefault(reinterpret_cast<std::byte*>(t->segs_[i]->ctl(r)), kFifoCtlBytes, true);  // control + slots to i
    prefault(self->data(i, n, t->fifo_bytes_), t->fifo_bytes_, false);           // inbound from i
    prefault(t->segs_[i]->data(r, n, t->fifo_bytes_), t->fifo_bytes_, true);     // outbound to i
  }
  st = boot.barrier(deadline);
  shm_unlink(t->own_name_.c_str());
  t->unlinked_ = true;
  if (!st.is_ok()) return st.with_context("shm setup");
  for (int i = 0; i < n; ++i) {
    if (i == r || !t->segs_[i]) continue;
    t->conns_[i] =
        make_connection(self, t->segs_[i], r, i, n, t->fifo_bytes_, step, stores, can_push, map_peers, &t->batch_);
  }
  LOOM_INFO(kLogShm, "rank {}: shm transport up, {} local peers, fifo {} KiB", r,
            nlocal - 1, t->fifo_bytes_ >> 10);
  return t;
}

uint64_t ShmTransport::shared_copy_bytes() { return g_shared_copy_bytes.load(std::memory_order_relaxed); }

// kill(pid, 0) + /proc for a peer of this pid namespace; the segment's lock
// for one in another (its pid means nothing here).
bool ShmTransport::rank_alive(int peer) const {
  if (other_pid_namespace(segs_[rank_], segs_[peer])) return segment_owner_alive(peer_fds_[peer]);
  return peer_alive(segs_[peer]->pid);
}

ShmTransport::~ShmTransport() {
  // Orderly close: the engine has stopped, so every FIFO write of this rank
  // is done; peers may drain them after we are gone. A rank that announced a
  // failure stays failed in its peers' eyes.
  if (Segment* self = !segs_.empty() ? segs_[rank_] : nullptr; self && !self->aborted.load(std::memory_order_acquire)) {
    self->closed.store(1, std::memory_order_release);
    for (int i = 0; i < nranks_; ++i)
      if (segs_[i] && i != rank_) segs_[i]->ring();  // an engine waiting on us re-checks now
  }
  conns_.clear();
  for (auto* s : segs_)
    if (s) SegmentMaps::get().release(s);
  if (!unlinked_ && !own_name_.empty()) shm_unlink(own_name_.c_str());
  for (int fd : peer_fds_)
    if (fd >= 0) close(fd);
  if (own_fd_ >= 0) close(own_fd_);  // drops the liveness lock
}

// One fence for every write since the last call (the writes' side of the
// doorbell's Dekker pair, see Segment::ring_if_armed), then each owed peer's
// `waiters`. Held, a send no longer waits for its cache line at the fence:
// the line moves while this rank goes on to poll for its peer's message.
// Measured, 2 ranks, blocking allreduce, host in its slow phase: the 8 B
// send 167 -> 17 ns (TSC around it in the executor); per op 8 B 0.51-0.52 ->
// 0.47-0.48 us, 1 KiB 0.80-0.83 -> 0.71-0.74, 4 KiB 1.11-1.19 -> 0.98-1.03
// (builds alternating, 4 rounds; docs/performance.md Run 25).
void ShmTransport::pay_owed() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int peer : batch_.owed) {
    batch_.is_owed[peer] = 0;
    segs_[peer]->ring_if_waiting();
  }
  batch_.owed.clear();
}

Connection* ShmTransport::connection(int peer) {
  return (peer >= 0 && peer < nranks_) ? conns_[peer].get() : nullptr;
}

uint32_t ShmTransport::events() { return segs_[rank_]->doorbell.load(std::memory_order_seq_cst); }

void ShmTransport::arm_wait() { segs_[rank_]->waiters.fetch_add(1, std::memory_order_seq_cst); }

void ShmTransport::disarm_wait() { segs_[rank_]->waiters.fetch_sub(1, std::memory_order_seq_cst); }

void ShmTransport::wait_events(uint32_t seen, std::chrono::microseconds timeout) {
  Segment* self = segs_[rank_];
  // The caller armed (arm_wait) before its last poll. One that did not may
  // miss a data event from before this call and then sleeps to the timeout
  // (counted: tests check that it does not happen).
  self->waiters.fetch_add(1, std::memory_order_seq_cst);
  if (self->doorbell.load(std::memory_order_seq_cst) == seen) {
    timespec ts{static_cast<time_t>(timeout.count() / 1000000), static_cast<long>((timeout.count() % 1000000) * 1000)};
    if (futex(&self->doorbell, FUTEX_WAIT, seen, &ts) != 0 && errno == ETIMEDOUT) {
      g_wait_timeouts.fetch_add(1, std::memory_order_relaxed);
      if (self->doorbell.load(std::memory_order_seq_cst) != seen) g_missed_wakeups.fetch_add(1, std::memory_order_relaxed);
    }
  }
  self->waiters.fetch_sub(1, std::memory_order_seq_cst);
}

uint64_t ShmTransport::slot_messages() { return g_slot_messages.load(std::memory_order_relaxed); }
uint64_t ShmTransport::fifo_writes() { return g_fifo_writes.load(std::memory_order_relaxed); }
uint64_t ShmTransport::streamed_steps() { return g_streamed_steps.load(std::memory_order_relaxed); }
uint64_t ShmTransport::store_switches() { return g_store_switches.load(std::memory_order_relaxed); }
uint64_t ShmTransport::gathered_messages() { return g_gathered_messages.load(std::memory_order_relaxed); }
size_t ShmTransport::slot_ring_size() { return kSlots; }
uint64_t ShmTransport::prefaulted_pages() { return g_prefaulted_pages.load(std::memory_order_relaxed); }
uint64_t ShmTransport::single_copy_messages() { return g_single_copy_messages.load(std::memory_order_relaxed); }
uint64_t ShmTransport::mapped_messages() { return g_mapped_messages.load(std::memory_order_relaxed); }

uint64_t ShmTransport::wait_timeouts() { return g_wait_timeouts.load(std::memory_order_relaxed); }
uint64_t ShmTransport::missed_wakeups() { return g_missed_wakeups.load(std::memory_order_relaxed); }

void ShmTransport::wake_self() { segs_[rank_]->ring(); }

void ShmTransport::set_liveness_probe_for_test(bool (*probe)(int pid)) {
  g_liveness_probe.store(probe, std::memory_order_release);
}

Status ShmTransport::check_peer(int peer) {
  Segment* s = (peer >= 0 && peer < nranks_) ? segs_[peer] : nullptr;
  if (!s) return Status::ok();
  // What the peer said about itself: a failure it announced, or an orderly
  // close (checked before liveness: a rank that closed may have exited since,
  // and what it sent before is still in our FIFO). Nullopt: nothing said.
  auto said = [&]() -> std::optional<Status> {
    if (s->aborted.load(std::memory_order_acquire)) {
      std::string reason(s->abort_reason, strnlen(s->abort_reason, sizeof(s->abort_reason)));
      return remote_error("rank " + std::to_string(peer) + " failed: " + reason);
    }
    if (s->closed.load(std::memory_order_acquire)) {
      Connection* c = conns_[peer].get();
      if (!c) return Status::ok();
      std::string why = shm::closed_problem(c, peer);
      return why.empty() ? Status::ok() : remote_error(why);
    }
    return std::nullopt;
  };
  if (auto st = said()) return *st;
  if (!rank_alive(peer)) {
    // Read again: the peer may have announced its failure (or closed) and
    // exited between the reads above and the liveness check. Its flags were
    // written before it exited, so they are visible now. Regression: a rank
    // that failed because a third one was killed, then exited, was reported
    // as the one that "died" (test_kill, 1 run in ~40 under load).
    if (auto st = said()) return *st;
    return remote_error("rank " + std::to_string(peer) + " (pid " + std::to_string(s->pid) +
                        (other_pid_namespace(segs_[rank_], s) ? " in another pid namespace" : "") + " on " +
                        peer_hosts_[peer] + ") died");
  }
  if (int e = shm::cma_errno(conns_[peer].get()))
    return remote_error("single-copy read from rank " + std::to_string(peer) + " failed: " + std::strerror(e));
  return Status::ok();
}

void ShmTransport::announce_abort(const std::string& reason) {
  // Every caller returns only once the first has waited for the peers (the
  // executor thread's fail() may follow an abort() from another thread).
  std::lock_guard<std::mutex> lk(abort_mu_);
  if (announced_) return;
  announced_ = true;
  Segment* self = segs_[rank_];
  size_t len = std::min(reason.size(), sizeof(self->abort_reason) - 1);
  std::memcpy(self->abort_reason, reason.data(), len);
  self->abort_reason[len] = '\0';
  self->aborted.store(1, std::memory_order_seq_cst);  // before the loads of peer_inside (Dekker)
  for (int i = 0; i < nranks_; ++i)
    if (segs_[i]) segs_[i]->ring();
  // The failed op returns after this, and its buffers go back to the user:
  // wait until no peer is inside them (ShmConnection::enter_peer_memory).
  // Peers enter no more now; one inside finishes its copy (a chunk of at
  // most kCmaReadChunk, or a pushed half). Bounded, for a peer stopped in
  // the middle (SIGSTOP, a debugger); a dead one copies nothing.
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  for (int p = 0; p < nranks_; ++p) {
    Connection* c = conns_[p].get();
    for (int i = 0; c && shm::peer_inside(c); ++i) {
      if ((i & 1023) == 1023) {
        if (!rank_alive(p)) break;
        if (Clock::now() - start > std::chrono::seconds(10)) {
          LOOM_WARN(kLogShm,
                    "rank {}: rank {} is still copying from or into this rank's buffers 10 s after the failure; "
                    "the failed op returns them anyway",
                    rank_, p);
          break;
        }
      }
      sched_yield();
    }
  }
}

void ShmTransport::set_peer_memory_hook_for_test(void (*hook)(bool writes)) {
  g_peer_memory_hook.store(hook, std::memory_order_release);
}

}  // namespace loom
