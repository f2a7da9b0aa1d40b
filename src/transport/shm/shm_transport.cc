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

namespace loom {
namespace {

constexpr uint64_t kSegMagic = 0x4c4f4f4d53484d31ull;  // "LOOMSHM1"
constexpr size_t kHeaderBytes = 4096;

// Small messages (an 8 B allreduce with its 32 B op header is 40 B) travel
// in slots, not in the FIFO: the payload and its stamp share one cache line,
// so the receiver's poll brings in the data with it. Through the FIFO a
// message costs the receiver two serial cache-line transfers (the tail, then
// the bytes) and the sender a third (the head), about 0.15 us each here. A
// slot's stamp is the sequence number of the message in it, plus one; stamps
// only ever live in the stamp word, so no payload can look like one. The
// receiver publishes how many slots it has freed; the sender reads that only
// when its ring looks full. Which path a message takes both ends decide from
// its size, as for single copy.
//
// The ring is deep so that a stream of rooted ops can run ahead: a broadcast
// root does not wait for its leaves, and with more ranks than cores it sends
// while they wait for a core, then they catch up in a batch. Measured, 8 B
// (us per op, 4 pairs each), 64 -> 512 slots: broadcast 4 ranks 0.47-0.49 ->
// 0.39-0.42, 8 ranks 0.97-1.04 -> 0.76-0.83, reduce 8 ranks 1.18-1.29 ->
// 0.84-0.90; allreduce 2 and 4 ranks unchanged (2.52-2.71 vs 2.45-2.78 at 4,
// 8 pairs). 4096 slots made the allreduce slower (4 ranks 3.1-3.4 us): the
// ring no longer stays in cache. 512 x 128 B = 64 KiB per pair and direction.
constexpr size_t kSlots = 512;
constexpr size_t kSlotBytes = 128;
constexpr size_t kSlotPayload = kSlotBytes - sizeof(uint64_t);
struct alignas(kSlotBytes) Slot {
  std::atomic<uint64_t> stamp;
  std::byte data[kSlotPayload];
};

struct alignas(kSlotBytes) FifoCtl {
  std::atomic<uint64_t> tail;  // written by the sender
  // Shared single copy (see CmaDescriptor): bytes the sender has written
  // into the receiver's buffer on request (monotonic), and the sequence
  // number of the last request it could not serve.
  std::atomic<uint64_t> push_done;
  std::atomic<uint64_t> push_failed;
  // 1 while the sender writes a pushed half into the receiver's memory
  // (PeerMemory below).
  std::atomic<uint32_t> tx_in_receiver;
  char pad0[36];
  std::atomic<uint64_t> head;  // written by the receiver
  // The receiver's request: write [push_off, push_off + push_len) of the
  // current message to push_dst in my address space; push_seq publishes it.
  std::atomic<uint64_t> push_seq;
  uint64_t push_dst, push_off, push_len;
  std::atomic<uint64_t> slots_freed;  // small-message slots the receiver has consumed
  char pad1[16];
  // Bytes of single-copy messages the receiver has read so far (monotonic,
  // written by the receiver): the sender's source buffer is busy until then.
  std::atomic<uint64_t> cma_ack;
  // 1 while the receiver reads a single-copy message from the sender's
  // memory (PeerMemory below).
  std::atomic<uint32_t> rx_in_sender;
  char pad2[52];
  Slot slots[kSlots];  // small messages, written by the sender
};
constexpr size_t kFifoCtlBytes = sizeof(FifoCtl);

// In the FIFO, a single-copy message is replaced by this descriptor: the
// receiver reads the payload straight from the sender's memory with
// process_vm_readv (Linux CMA), one copy instead of two.
//
// Shared single copy: when the sender has nothing else to do (its phase only
// sends) and may write into the receiver (probed), it says so in `flags`;
// a receiver that knows the destination then asks it to write the second
// half with process_vm_writev while it reads the first half itself, so two
// cores copy one message (2-rank broadcast, send/recv).
//
// Mapped single copy: when the message lies in a buffer of loom::mem_alloc
// (a shared-memory file), the descriptor also says which file and where; the
// receiver maps the file once (pidfd_getfd + mmap, PeerMaps below) and reads
// the bytes with plain loads: no system call or page pinning per message,
// and a reduction reads them in place instead of through the staging buffer.
struct CmaDescriptor {
  uint64_t magic;
  uint64_t addr;
  uint64_t len;
  int64_t pid;
  uint64_t flags;
  // With kCmaMappable: the buffer's file (shared_buffers::Ref) and the
  // sender's count of freed buffers (a change drops the receiver's mappings).
  uint64_t map_id;
  int64_t map_fd;
  uint64_t map_inode;
  uint64_t map_offset;
  uint64_t map_file_bytes;
  uint64_t map_releases;
};
constexpr uint64_t kCmaSenderCanPush = 1;
constexpr uint64_t kCmaMappable = 2;
constexpr size_t kPushMinBytes = 512 << 10;  // below this, one reader is as fast
std::atomic<uint64_t> g_shared_copy_bytes{0};  // written by senders, this process
std::atomic<uint64_t> g_wait_timeouts{0};      // waits that ended by timeout, this process
std::atomic<uint64_t> g_missed_wakeups{0};     // ... with the doorbell rung meanwhile
// Test counters of this process: small messages sent through slots, FIFO
// writes that published bytes, messages sent from two pieces (send_gather),
// and messages received by single copy.
std::atomic<uint64_t> g_slot_messages{0};
std::atomic<uint64_t> g_fifo_writes{0};
std::atomic<uint64_t> g_gathered_messages{0};
std::atomic<uint64_t> g_single_copy_messages{0};
std::atomic<uint64_t> g_mapped_messages{0};
std::atomic<uint64_t> g_streamed_steps{0};   // FIFO steps written (in part) by streaming stores
std::atomic<uint64_t> g_store_switches{0};   // SharedStores changes of mode
// Bumps a test counter on the message path with a plain load + store, not an
// atomic increment: with several thread ranks a count may be lost, which only
// matters to a test that asks for > 0.
void bump_test_counter(std::atomic<uint64_t>& c) { c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
constexpr uint64_t kCmaMagic = 0x434d41444553431ull;
constexpr uint64_t kInlineMagic = 0x494e4c494e45484dull;  // header of a message whose bytes follow in the FIFO
constexpr size_t kCmaStageBytes = 256 << 10;   // staging for reduce-on-receive
constexpr size_t kCmaReadChunk = 4 << 20;      // bytes per process_vm_readv

size_t round8(size_t n) { return (n + 7) & ~size_t{7}; }

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

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
std::atomic<void (*)(bool)> g_peer_memory_hook{nullptr};  // tests (set_peer_memory_hook_for_test)

bool peer_alive(int pid) {
  bool (*probe)(int) = g_liveness_probe.load(std::memory_order_acquire);
  return probe ? probe(pid) : process_alive(pid);
}

// Byte offset of the FIFO that carries messages from rank `from`.
size_t fifo_offset(int from, int nranks, size_t fifo_bytes) {
  return kHeaderBytes + static_cast<size_t>(nranks) * kFifoCtlBytes + static_cast<size_t>(from) * fifo_bytes;
}

}  // namespace

struct ShmTransport::Segment {
  uint64_t magic;
  int32_t pid;
  int32_t rank;
  // Inode of the creator's pid namespace (0: unknown). Ranks of one host may
  // live in different pid namespaces (containers sharing /dev/shm and the
  // host name, e.g. two containers of a Kubernetes pod, often both pid 1):
  // then `pid` means nothing to the peer. See same_process below.
  uint64_t pid_ns;
  uint64_t proc_token;  // random, one per process (process_token)
  alignas(64) std::atomic<uint32_t> doorbell;
  alignas(64) std::atomic<uint32_t> waiters;
  alignas(64) std::atomic<uint32_t> aborted;
  // Set by an orderly destroy after the rank's last send: its peers still
  // drain what it left in their FIFOs instead of reporting it dead.
  alignas(64) std::atomic<uint32_t> closed;
  char abort_reason[1024];
  // Messages to this rank of at least this many bytes use the single-copy
  // path (UINT64_MAX: disabled, e.g. when process_vm_readv is not permitted):
  // cma_threshold for messages this rank reduces, cma_plain_threshold for
  // those it only stores (Connection::set_recv_reduced says which);
  // The xproc thresholds replace them when the sender is another process
  // (process_vm_readv; between threads single copy is a memcpy).
  uint64_t cma_threshold;
  uint64_t cma_plain_threshold;
  uint64_t cma_xproc_threshold;
  uint64_t cma_plain_xproc_threshold;
  // Messages to this rank of at most this many bytes use the slots (0: none).
  uint64_t slot_max_bytes;
  // Messages to this rank of at least this many bytes that the thresholds
  // above leave to the FIFO start with a header (a CmaDescriptor): the
  // sender's descriptor when the bytes lie in a mem_alloc buffer (read
  // through a mapping), else a kInlineMagic marker before the bytes in the
  // FIFO. UINT64_MAX: no such messages (mapping off or not permitted).
  uint64_t hdr_min_bytes;
  // The same for announced messages (Step::announced), when headers are on.
  uint64_t announced_min_bytes;
  uint64_t cma_probe_addr;  // address of a word holding kCmaMagic, for peers' probe

  FifoCtl* ctl(int from) {
    return reinterpret_cast<FifoCtl*>(reinterpret_cast<char*>(this) + kHeaderBytes + from * kFifoCtlBytes);
  }
  std::byte* data(int from, int nranks, size_t fifo_bytes) {
    return reinterpret_cast<std::byte*>(this) + fifo_offset(from, nranks, fifo_bytes);
  }
  // Rare events (abort, close, self wake-up): always bump the doorbell.
  void ring() {
    doorbell.fetch_add(1, std::memory_order_seq_cst);
    if (waiters.load(std::memory_order_seq_cst)) futex(&doorbell, FUTEX_WAKE, INT_MAX, nullptr);
  }
  // Data events (bytes written, space freed, acknowledgements): only a rank
  // that armed itself for sleeping (arm_wait) needs the doorbell. An atomic
  // increment of a line the peer polls costs a cache-line round trip per
  // message, ~0.1 us of an 8 B allreduce. The fence orders the caller's
  // state store before the load of `waiters`; the waiter increments
  // `waiters` before its last poll (Dekker): one of the two sees the other.
  void ring_if_armed() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    ring_if_waiting();
  }
  // The same after a fence the caller already ran (ShmTransport::pay_owed).
  void ring_if_waiting() {
    if (waiters.load(std::memory_order_relaxed)) {
      doorbell.fetch_add(1, std::memory_order_seq_cst);
      futex(&doorbell, FUTEX_WAKE, INT_MAX, nullptr);
    }
  }
};
static_assert(sizeof(ShmTransport::Segment) <= kHeaderBytes);

namespace {

// Whether two segments' creators are one process (ranks as threads): the
// same pid in the same pid namespace; two live processes never share both.
// Regression: pids alone were compared, so two containers' ranks, both pid
// 1 in their own namespaces, took each other for threads of one process and
// memcpy'd from addresses of the other's address space.
// The random token settles it where /proc cannot name the namespace.
bool same_process(const ShmTransport::Segment* a, const ShmTransport::Segment* b) {
  return a->pid == b->pid && a->pid_ns == b->pid_ns && a->proc_token == b->proc_token;
}
// Whether b's pid is meaningless to a (another pid namespace: no
// process_vm_readv, pidfd or kill(pid, 0) with it). Two live processes with
// one pid are in different namespaces too.
bool other_pid_namespace(const ShmTransport::Segment* a, const ShmTransport::Segment* b) {
  if (a->pid_ns != 0 && b->pid_ns != 0) return a->pid_ns != b->pid_ns;
  return a->pid == b->pid && a->proc_token != b->proc_token;
}

// Copies len bytes between `local` here and addr in process pid (Linux CMA:
// process_vm_writev when `write`, else process_vm_readv); same process: memcpy.
// (Not pid == getpid(): a peer in another pid namespace may have our pid.)
bool cma_copy(bool same_process, int pid, uint64_t addr, std::byte* local, size_t len, bool write, int* err) {
  void* remote_p = reinterpret_cast<void*>(addr);
  if (same_process) {
    if (write) std::memcpy(remote_p, local, len);
    else std::memcpy(local, remote_p, len);
    return true;
  }
  size_t done = 0;
  while (done < len) {
    iovec here{local + done, len - done};
    iovec there{static_cast<std::byte*>(remote_p) + done, len - done};
    ssize_t n = write ? process_vm_writev(pid, &here, 1, &there, 1, 0) : process_vm_readv(pid, &here, 1, &there, 1, 0);
    if (n <= 0) {
      *err = n < 0 ? errno : EIO;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

bool cma_read(bool same_process, int pid, uint64_t addr, std::byte* dst, size_t len, int* err) {
  return cma_copy(same_process, pid, addr, dst, len, false, err);
}
bool cma_write(bool same_process, int pid, uint64_t addr, const std::byte* src, size_t len, int* err) {
  return cma_copy(same_process, pid, addr, const_cast<std::byte*>(src), len, true, err);
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

// A receiver's mappings of its peers' mem_alloc buffers, shared by every
// connection of this process and kept across operations (mapping costs two
// system calls and the page-table set-up of the whole buffer). Keyed by
// (pid, buffer id, file inode): a process never reuses an id, but a pid
// comes back, and processes forked from one that had used mem_alloc start
// at its next id. Regression: keyed by (pid, id), a sender that got a dead
// one's pid had its first buffer read through the mapping of the dead
// one's (SharedBuffers.ASenderWithAReusedPidIsNotReadThroughTheDeadOnesMapping).
// A mapped file's inode is not handed to another file while the mapping
// holds it. A mapping keeps its buffer's
// memory alive after the sender frees it, so all mappings of a process go
// as soon as one of its descriptors shows that it freed a buffer since, and
// the least recently used goes beyond kMaxPeerMappings. A process whose
// descriptors may not be taken (EPERM: another user; ENOSYS: kernel before
// 5.6) is read by process_vm_readv from then on.
constexpr size_t kMaxPeerMappings = 64;

struct PeerMapping {
  void* base = nullptr;
  size_t bytes = 0;
  PeerMapping(void* b, size_t n) : base(b), bytes(n) {}
  PeerMapping(const PeerMapping&) = delete;
  PeerMapping& operator=(const PeerMapping&) = delete;
  ~PeerMapping() { munmap(base, bytes); }
};

class PeerMaps {
 public:
  static PeerMaps& get() {
    static auto* maps = new PeerMaps();  // leaked: connections may outlive static destruction
    return *maps;
  }

  // The mapping of the buffer `d` names, or nullptr (then: process_vm_readv).
  std::shared_ptr<PeerMapping> lookup(const CmaDescriptor& d) {
    std::lock_guard<std::mutex> lk(mu_);
    Peer& peer = peers_[d.pid];
    if (peer.denied) return nullptr;
    if (peer.releases != d.map_releases) {  // it freed a buffer: drop what may be stale
      std::erase_if(entries_, [&](const Entry& e) { return e.pid == d.pid; });
      peer.releases = d.map_releases;
    }
    ++clock_;
    for (Entry& e : entries_)
      if (e.pid == d.pid && e.id == d.map_id && e.inode == d.map_inode) {
        e.last_use = clock_;
        return e.map;
      }
    std::shared_ptr<PeerMapping> m = map(d, &peer);
    if (!m) return nullptr;
    if (entries_.size() >= kMaxPeerMappings)
      entries_.erase(std::min_element(entries_.begin(), entries_.end(),
                                      [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; }));
    entries_.push_back({d.pid, d.map_id, d.map_inode, clock_, m});
    return m;
  }

 private:
  struct Peer {
    uint64_t releases = 0;
    bool denied = false;
  };
  struct Entry {
    int64_t pid;
    uint64_t id;
    uint64_t inode;
    uint64_t last_use;
    std::shared_ptr<PeerMapping> map;
  };

  static std::shared_ptr<PeerMapping> map(const CmaDescriptor& d, Peer* peer) {
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(d.pid), 0));
    if (pidfd < 0) {
      if (errno == ENOSYS || errno == EPERM) peer->denied = true;
      return nullptr;
    }
    const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, static_cast<int>(d.map_fd), 0));
    const int err = errno;
    close(pidfd);
    if (fd < 0) {
      if (err == ENOSYS || err == EPERM || err == EACCES) {
        peer->denied = true;
        LOOM_INFO(kLogShm, "cannot map buffers of process {} ({}): reading them by process_vm_readv", d.pid,
                 strerror(err));
      }
      return nullptr;
    }
    // The descriptor names a file by number in the sender; make sure it is
    // the buffer's (same inode, large enough) before reading through it.
    struct stat st {};
    void* p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_ino) == d.map_inode &&
        static_cast<uint64_t>(st.st_size) >= d.map_file_bytes && d.map_offset + d.len <= d.map_file_bytes)
      p = mmap(nullptr, static_cast<size_t>(d.map_file_bytes), PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return nullptr;
    return std::make_shared<PeerMapping>(p, static_cast<size_t>(d.map_file_bytes));
  }

  std::mutex mu_;
  std::vector<Entry> entries_;
  std::map<int64_t, Peer> peers_;
  uint64_t clock_ = 0;
};

class ShmConnection final : public Connection {
 public:
  ShmConnection(ShmTransport::Segment* self, ShmTransport::Segment* peer, int rank, int peer_rank, int nranks,
                size_t cap, size_t step, SharedStores::Policy stores, bool can_push, bool map_peers,
                ShmTransport::DoorbellBatch* batch)
      : batch_(batch),
        peer_rank_(peer_rank),
        self_(self),
        peer_(peer),
        out_ctl_(peer->ctl(rank)),
        out_data_(peer->data(rank, nranks, cap)),
        in_ctl_(self->ctl(peer_rank)),
        in_data_(self->data(peer_rank, nranks, cap)),
        cap_(cap),
        step_(step),
        stores_(stores),
        same_process_(same_process(self, peer)) {
    tail_ = out_ctl_->tail.load(std::memory_order_relaxed);
    head_ = in_ctl_->head.load(std::memory_order_relaxed);
    out_push_seen_ = out_ctl_->push_seq.load(std::memory_order_relaxed);
    in_push_seq_ = in_ctl_->push_seq.load(std::memory_order_relaxed);
    can_push_ = can_push;
    map_peers_ = map_peers;
  }

  void set_sender_idle(bool idle) override { sender_idle_ = idle; }

  // The receiving segment's single-copy threshold for a message of this class
  // between this pair (both ends compute it alike).
  uint64_t single_copy_threshold(const ShmTransport::Segment* receiver, bool reduced) const {
    if (same_process_) return reduced ? receiver->cma_threshold : receiver->cma_plain_threshold;
    return reduced ? receiver->cma_xproc_threshold : receiver->cma_plain_xproc_threshold;
  }

  // The size from which a message to `receiver` starts with a header (both
  // ends compute it alike): the receiver's hdr_min_bytes, or for an announced
  // message (Step::announced) its announced_min_bytes where headers are on.
  static uint64_t header_threshold(const ShmTransport::Segment* receiver, bool announced) {
    const uint64_t h = receiver->hdr_min_bytes;
    return announced && h != UINT64_MAX ? std::min(h, receiver->announced_min_bytes) : h;
  }

  size_t send_some(const std::byte* src, size_t msg_remaining) override {
    if (out_total_ == 0) {  // a new message starts
      out_total_ = msg_remaining;
      out_done_ = 0;
      out_cma_ = msg_remaining >= single_copy_threshold(peer_, send_reduced_);
      // Past the receiver's hdr_min_bytes a message the thresholds leave to
      // the FIFO is announced by a header: a descriptor if it can be mapped.
      out_hdr_ = !out_cma_ && msg_remaining >= header_threshold(peer_, send_announced_);
      out_ref_ = (out_cma_ || (out_hdr_ && send_mappable_)) ? shared_buffers::find(src, msg_remaining) : std::nullopt;
      if (out_hdr_ && out_ref_) out_cma_ = true, out_hdr_ = false;
      out_slot_ = !out_cma_ && !out_hdr_ && msg_remaining <= peer_->slot_max_bytes;
      out_desc_posted_ = false;
    }
    size_t n = out_slot_  ? send_slot(src, msg_remaining)
               : out_cma_ ? send_cma(src, msg_remaining)
               : out_hdr_ ? send_inline(src, msg_remaining)
                          : send_fifo(src, msg_remaining);
    out_done_ += n;
    if (out_done_ == out_total_) out_total_ = 0;
    // Only a change is published: the watchdog reads it, the hot path rarely writes it.
    if (send_pending_.load(std::memory_order_relaxed) != (out_total_ != 0))
      send_pending_.store(out_total_ != 0, std::memory_order_release);
    return n;
  }

  // A whole small message from two pieces, written where send_some would put
  // it (a slot, or the FIFO when it fits before the wrap), so the receiver
  // cannot tell the difference. Larger classes (single copy, headers) and a
  // message that would wrap the FIFO go through send_some.
  size_t send_gather(const std::byte* head, size_t head_len, const std::byte* body, size_t body_len) override {
    const size_t total = head_len + body_len;
    if (out_total_ != 0 || total >= single_copy_threshold(peer_, send_reduced_) ||
        total >= header_threshold(peer_, send_announced_))
      return kNoGather;
    if (total <= peer_->slot_max_bytes) {
      Slot* slot = free_slot();
      if (!slot) return 0;
      std::memcpy(slot->data, head, head_len);
      std::memcpy(slot->data + head_len, body, body_len);
      publish_slot(*slot);
    } else {
      const size_t pos = static_cast<size_t>(tail_ % cap_), adv = round8(total);
      if (adv > cap_ - pos || adv > step_) return kNoGather;
      if (fifo_free(adv) < adv) return 0;
      std::memcpy(out_data_ + pos, head, head_len);
      std::memcpy(out_data_ + pos + head_len, body, body_len);
      publish_fifo(adv);
    }
    bump_test_counter(g_gathered_messages);
    return total;
  }

  std::span<const std::byte> recv_peek(size_t msg_remaining) override {
    begin_recv(msg_remaining);
    if (in_hdr_ && !resolve_header()) return {};
    if (in_slot_) return peek_slot();
    if (!in_cma_) return peek_fifo(msg_remaining);
    if (!read_descriptor()) return {};
    // With a shared copy under way the sender writes the rest straight into
    // the destination: only recv_into can complete this message.
    if (push_pending_ && in_done_ >= read_end_) return {};
    if (peer_src_) {  // the bytes stay in the sender's buffer until recv_consume
      if (!peek_in_sender_ && !enter_peer_memory(in_ctl_->rx_in_sender, false)) return {};
      peek_in_sender_ = true;
      return {peer_src_ + in_done_, std::min({msg_remaining, kCmaReadChunk, read_end_ - in_done_})};
    }
    if (!stage_) stage_ = std::make_unique<std::byte[]>(kCmaStageBytes);
    size_t n = std::min({msg_remaining, kCmaStageBytes, read_end_ - in_done_});
    if (!enter_peer_memory(in_ctl_->rx_in_sender, false)) return {};
    const bool ok =
        cma_read(same_process_, static_cast<int>(desc_.pid), desc_.addr + in_done_, stage_.get(), n, &cma_errno_);
    leave_peer_memory(in_ctl_->rx_in_sender);
    if (!ok) return {};
    return {stage_.get(), n};
  }

  // The word recv_peek looked at: the awaited slot's stamp (stamps only
  // grow: the message is in once it reaches its number) or the FIFO's tail
  // (any byte past what was read). Single-copy reads in progress: none.
  Watch recv_watch() const override {
    if (in_total_ == 0) return {};
    if (in_slot_) return {&in_ctl_->slots[slot_next_ % kSlots].stamp, slot_next_ + 1};
    if (in_cma_ && have_desc_) return {};
    return {&in_ctl_->tail, head_ + 1};
  }

  void recv_consume(size_t n, size_t msg_remaining) override {
    if (in_slot_) {
      if (n == msg_remaining) {  // the whole message is read: the slot is free
        ++slot_next_;
        in_ctl_->slots_freed.store(slot_next_, std::memory_order_release);
        ring_peer();  // the sender may wait for a slot
      }
    } else if (in_cma_) {
      if (peek_in_sender_) {
        peek_in_sender_ = false;
        leave_peer_memory(in_ctl_->rx_in_sender);
      }
      ack(n);
    } else {
      head_ += (n == msg_remaining) ? round8(n) : n;
      in_ctl_->head.store(head_, std::memory_order_release);
      ring_peer();  // the sender may be waiting for space
    }
    finish_recv(n);
  }

  size_t recv_into(std::byte* dst, size_t msg_remaining) override {
    begin_recv(msg_remaining);
    if (in_hdr_ && !resolve_header()) return 0;
    if (!in_cma_) return Connection::recv_into(dst, msg_remaining);
    if (!read_descriptor()) return 0;
    if (in_done_ == 0 && !push_pending_ && (desc_.flags & kCmaSenderCanPush) && in_total_ >= kPushMinBytes)
      request_push(dst);
    if (push_pending_ && in_done_ >= read_end_) return take_pushed();
    size_t n = std::min({msg_remaining, kCmaReadChunk, read_end_ - in_done_});
    if (!enter_peer_memory(in_ctl_->rx_in_sender, false)) return 0;
    bool ok = true;
    if (peer_src_) std::memcpy(dst, peer_src_ + in_done_, n);
    else ok = cma_read(same_process_, static_cast<int>(desc_.pid), desc_.addr + in_done_, dst, n, &cma_errno_);
    leave_peer_memory(in_ctl_->rx_in_sender);
    if (!ok) return 0;
    ack(n);
    finish_recv(n);
    return n;
  }



  // Non-zero errno of a failed single-copy read (reported by check_peer).
  int cma_errno() const { return cma_errno_; }

  // The peer is inside this rank's memory: reading a single-copy message
  // from it, or writing a pushed half into it (enter_peer_memory). Any thread.
  bool peer_inside() const {
    return out_ctl_->rx_in_sender.load(std::memory_order_seq_cst) != 0 ||
           in_ctl_->tx_in_receiver.load(std::memory_order_seq_cst) != 0;
  }

  // The peer left in an orderly way (its `closed` flag, set after its last
  // FIFO write): empty while everything this rank waits for is already in
  // the FIFO, else why the wait can never end. Any thread.
  std::string closed_problem(int peer) const {
    if (send_pending_.load(std::memory_order_acquire))
      return fmt::format("rank {} destroyed its communicator (orderly close) before receiving what this rank sends to it",
                         peer);
    // Slot stamps only grow: the awaited message is in once its slot's stamp
    // reached its number.
    if (const uint64_t want = need_slot_.load(std::memory_order_acquire);
        want && in_ctl_->slots[(want - 1) % kSlots].stamp.load(std::memory_order_acquire) < want)
      return fmt::format("rank {} destroyed its communicator (orderly close) before sending what this recv expects "
                         "(its small message #{} on this connection)",
                         peer, want);
    const uint64_t sent = in_ctl_->tail.load(std::memory_order_acquire);
    const uint64_t need = need_end_.load(std::memory_order_acquire);
    if (need > sent)
      return fmt::format("rank {} destroyed its communicator (orderly close) before sending what this recv expects "
                         "(it sent {} bytes on this connection, the recv needs {})",
                         peer, sent, need);
    return {};
  }

 private:
  // The peer's memory (its send buffer for a single-copy read, its receive
  // buffer for a pushed half) is touched only between these two. `inside`
  // says so to the peer; a peer that announced its failure is not entered.
  // The failing rank's announce_abort sets its flag, then waits until the
  // peer is out (Dekker: each stores its flag, then loads the other's, all
  // seq_cst: one of the two sees the other). Then its failed op returns and
  // the user may free the buffer. Regression: it returned while the peer
  // still copied, chunk after chunk without looking at the abort: with
  // thread ranks a memcpy from (or into) freed memory, between processes
  // bytes of a reused buffer (ShmAbort tests).
  bool enter_peer_memory(std::atomic<uint32_t>& inside, bool writes) {
    if (auto hook = g_peer_memory_hook.load(std::memory_order_acquire)) hook(writes);
    inside.store(1, std::memory_order_seq_cst);
    if (peer_->aborted.load(std::memory_order_seq_cst) == 0) return true;
    inside.store(0, std::memory_order_release);
    return false;  // the executor learns why from check_peer
  }
  static void leave_peer_memory(std::atomic<uint32_t>& inside) { inside.store(0, std::memory_order_release); }

  // After a write the peer may wait for (bytes, a freed slot or FIFO space,
  // an acknowledgement): ring its doorbell if it sleeps, now or, while the
  // executor holds the doorbells (Transport::hold_doorbells), at its next
  // ring_owed().
  void ring_peer() {
    if (!batch_->hold) return peer_->ring_if_armed();
    if (batch_->is_owed[peer_rank_]) return;
    batch_->is_owed[peer_rank_] = 1;
    batch_->owed.push_back(peer_rank_);
  }

  // Free bytes after tail_ as far as the last head we read says; the shared
  // head is read again only when that is not enough (`want`): reading it on
  // every send costs a cache-line transfer per message.
  size_t fifo_free(size_t want) {
    size_t free = cap_ - static_cast<size_t>(tail_ - head_seen_);
    if (free < want) {
      head_seen_ = out_ctl_->head.load(std::memory_order_acquire);
      free = cap_ - static_cast<size_t>(tail_ - head_seen_);
    }
    return free;
  }

  // The next slot to write, or nullptr while the receiver is kSlots messages behind.
  Slot* free_slot() {
    if (slot_seq_ - slots_freed_seen_ >= kSlots) {
      slots_freed_seen_ = out_ctl_->slots_freed.load(std::memory_order_acquire);
      if (slot_seq_ - slots_freed_seen_ >= kSlots) return nullptr;
    }
    return &out_ctl_->slots[slot_seq_ % kSlots];
  }
  void publish_slot(Slot& slot) {
    slot.stamp.store(++slot_seq_, std::memory_order_release);
    ring_peer();
    bump_test_counter(g_slot_messages);
  }
  // Makes `adv` bytes written at the tail visible to the receiver.
  void publish_fifo(size_t adv) {
    tail_ += adv;
    out_ctl_->tail.store(tail_, std::memory_order_release);
    ring_peer();
    bump_test_counter(g_fifo_writes);
  }

  // A FIFO step's bytes, by cached or streaming stores (SharedStores).
  void copy_step(std::byte* dst, const std::byte* src, size_t n) {
    if (n < SharedStores::kMeasureBytes) {  // cached in every mode; not worth a call on the small-message path
      std::memcpy(dst, src, n);
      return;
    }
    const uint64_t switches = stores_.switches();
    if (stores_.copy(dst, src, n, n) > 0) bump_test_counter(g_streamed_steps);
    if (stores_.switches() != switches) {
      bump_test_counter(g_store_switches);
      LOOM_INFO(kLogShm, "shm: to rank {}: cached FIFO stores at {:.1f} GB/s: {} stores", peer_rank_,
                stores_.last_gbps(), stores_.streaming() ? "streaming" : "cached");
    }
  }

  size_t send_slot(const std::byte* src, size_t len) {
    Slot* slot = free_slot();
    if (!slot) return 0;
    std::memcpy(slot->data, src, len);
    publish_slot(*slot);
    return len;
  }

  size_t send_fifo(const std::byte* src, size_t msg_remaining) {
    size_t pos = static_cast<size_t>(tail_ % cap_);
    size_t contig = std::min({fifo_free(std::min(round8(msg_remaining), cap_ - pos)), cap_ - pos, step_});
    size_t n, adv;
    // Positions and free space are multiples of 8, so a whole padded message
    // fits whenever its unpadded size does.
    if (round8(msg_remaining) <= contig) {
      n = msg_remaining;
      adv = round8(n);
    } else {
      n = adv = contig & ~size_t{7};
    }
    if (n == 0) return 0;
    copy_step(out_data_ + pos, src, n);
    publish_fifo(adv);
    return n;
  }

  // A message that could have gone mapped but lies in ordinary memory: the
  // kInlineMagic header, then the bytes through the FIFO.
  size_t send_inline(const std::byte* src, size_t msg_remaining) {
    if (!out_desc_posted_) {
      if (fifo_free(sizeof(CmaDescriptor)) < sizeof(CmaDescriptor)) return 0;
      CmaDescriptor h{};
      h.magic = kInlineMagic;
      h.len = msg_remaining;
      write_wrapped(reinterpret_cast<const std::byte*>(&h), sizeof(h));
      tail_ += sizeof(h);
      out_ctl_->tail.store(tail_, std::memory_order_release);
      out_desc_posted_ = true;
      ring_peer();
    }
    return send_fifo(src, msg_remaining);
  }

  size_t send_cma(const std::byte* src, size_t msg_remaining) {
    if (!out_desc_posted_) {
      if (fifo_free(sizeof(CmaDescriptor)) < sizeof(CmaDescriptor)) return 0;
      const bool push = can_push_ && sender_idle_ && msg_remaining >= kPushMinBytes;
      CmaDescriptor d{};
      d.magic = kCmaMagic;
      d.addr = reinterpret_cast<uint64_t>(src);
      d.len = msg_remaining;
      d.pid = getpid();
      d.flags = push ? kCmaSenderCanPush : 0;
      if (const auto& ref = out_ref_) {  // found by send_some
        d.flags |= kCmaMappable;
        d.map_id = ref->id;
        d.map_fd = ref->fd;
        d.map_inode = ref->inode;
        d.map_offset = ref->offset;
        d.map_file_bytes = ref->file_bytes;
        d.map_releases = shared_buffers::releases();
      }
      // Previous single-copy messages were fully acknowledged, so the counter
      // now marks where this message's acknowledgements start.
      out_ack_base_ = out_ctl_->cma_ack.load(std::memory_order_acquire);
      out_push_base_ = out_ctl_->push_done.load(std::memory_order_relaxed);
      out_push_offered_ = push;
      write_wrapped(reinterpret_cast<const std::byte*>(&d), sizeof(d));
      tail_ += sizeof(d);
      out_ctl_->tail.store(tail_, std::memory_order_release);
      out_desc_posted_ = true;
      ring_peer();
      return 0;
    }
    if (out_push_offered_) serve_push(src - out_done_);
    uint64_t acked = out_ctl_->cma_ack.load(std::memory_order_acquire) - out_ack_base_ +
                     (out_ctl_->push_done.load(std::memory_order_relaxed) - out_push_base_);
    return static_cast<size_t>(acked) - out_done_;
  }

  // Sender: write the part the receiver asked for (at most one request per
  // message, posted after it read this message's descriptor).
  void serve_push(const std::byte* msg) {
    uint64_t seq = out_ctl_->push_seq.load(std::memory_order_acquire);
    if (seq == out_push_seen_) return;
    out_push_seen_ = seq;
    out_push_offered_ = false;
    int err = 0;
    const uint64_t off = out_ctl_->push_off, len = out_ctl_->push_len;
    bool ok = off + len <= out_total_ && enter_peer_memory(out_ctl_->tx_in_receiver, true);
    if (ok) {
      ok = cma_write(same_process_, peer_->pid, out_ctl_->push_dst, msg + off, static_cast<size_t>(len), &err);
      leave_peer_memory(out_ctl_->tx_in_receiver);
    }
    if (ok) {
      out_ctl_->push_done.store(out_ctl_->push_done.load(std::memory_order_relaxed) + len, std::memory_order_release);
      g_shared_copy_bytes.fetch_add(len, std::memory_order_relaxed);
    } else {
      out_ctl_->push_failed.store(seq, std::memory_order_release);  // the receiver reads it itself
    }
    ring_peer();
  }

  // Receiver: ask the sender to write the second half of this message
  // (page-aligned split) while this rank reads the first.
  void request_push(std::byte* msg_dst) {
    const size_t split = (in_total_ / 2) & ~size_t{4095};
    push_base_ = in_ctl_->push_done.load(std::memory_order_acquire);
    push_len_ = in_total_ - split;
    in_ctl_->push_dst = reinterpret_cast<uint64_t>(msg_dst + split);
    in_ctl_->push_off = split;
    in_ctl_->push_len = push_len_;
    in_ctl_->push_seq.store(++in_push_seq_, std::memory_order_release);
    ring_peer();  // the sender may be asleep waiting for our acknowledgements
    push_pending_ = true;
    read_end_ = split;
  }

  // Receiver: the first half is read; done once the sender's half is in.
  size_t take_pushed() {
    if (in_ctl_->push_done.load(std::memory_order_acquire) - push_base_ >= push_len_) {
      push_pending_ = false;
      read_end_ = SIZE_MAX;
      finish_recv(push_len_);
      return push_len_;
    }
    if (in_ctl_->push_failed.load(std::memory_order_acquire) == in_push_seq_) {
      push_pending_ = false;  // read the rest ourselves (acknowledged as usual)
      read_end_ = SIZE_MAX;
    }
    return 0;
  }

  void write_wrapped(const std::byte* p, size_t n) {
    size_t pos = static_cast<size_t>(tail_ % cap_);
    size_t first = std::min(n, cap_ - pos);
    std::memcpy(out_data_ + pos, p, first);
    std::memcpy(out_data_, p + first, n - first);
  }

  void begin_recv(size_t msg_remaining) {
    if (in_total_ != 0) return;
    in_total_ = msg_remaining;
    in_done_ = 0;
    read_end_ = SIZE_MAX;
    in_cma_ = msg_remaining >= single_copy_threshold(self_, recv_reduced_);
    in_hdr_ = !in_cma_ && msg_remaining >= header_threshold(self_, recv_announced_);  // resolved by resolve_header()
    in_slot_ = !in_cma_ && !in_hdr_ && msg_remaining <= self_->slot_max_bytes;
    have_desc_ = false;
  }

  std::span<const std::byte> peek_slot() {
    const Slot& slot = in_ctl_->slots[slot_next_ % kSlots];
    if (slot.stamp.load(std::memory_order_acquire) != slot_next_ + 1) {
      if (need_slot_.load(std::memory_order_relaxed) != slot_next_ + 1)
        need_slot_.store(slot_next_ + 1, std::memory_order_release);
      return {};
    }
    return {slot.data + in_done_, in_total_ - in_done_};
  }

  void finish_recv(size_t n) {
    in_done_ += n;
    if (in_done_ == in_total_) in_total_ = 0;
  }

  std::span<const std::byte> peek_fifo(size_t msg_remaining) {
    note_need(head_ + msg_remaining);
    uint64_t tail = in_ctl_->tail.load(std::memory_order_acquire);
    size_t avail = static_cast<size_t>(tail - head_);
    if (avail == 0) return {};
    size_t pos = static_cast<size_t>(head_ % cap_);
    size_t n = std::min({avail, cap_ - pos, msg_remaining, step_});
    return {in_data_ + pos, n};
  }

  bool read_descriptor() {
    if (have_desc_) return true;
    return take_header() && accept_descriptor();
  }

  // A message announced by a header (Segment::hdr_min_bytes): a descriptor
  // makes it single copy, kInlineMagic a FIFO message whose bytes follow.
  bool resolve_header() {
    if (!take_header()) return false;
    in_hdr_ = false;
    if (desc_.magic == kInlineMagic && desc_.len == in_total_) {
      in_cma_ = false;
      return true;
    }
    in_cma_ = true;
    return accept_descriptor();
  }

  // Reads the CmaDescriptor-sized header at head_ into desc_.
  bool take_header() {
    note_need(head_ + sizeof(CmaDescriptor));
    uint64_t tail = in_ctl_->tail.load(std::memory_order_acquire);
    if (tail - head_ < sizeof(CmaDescriptor)) return false;
    size_t pos = static_cast<size_t>(head_ % cap_);
    size_t first = std::min(sizeof(CmaDescriptor), cap_ - pos);
    auto* d = reinterpret_cast<std::byte*>(&desc_);
    std::memcpy(d, in_data_ + pos, first);
    std::memcpy(d + first, in_data_, sizeof(CmaDescriptor) - first);
    head_ += sizeof(CmaDescriptor);
    in_ctl_->head.store(head_, std::memory_order_release);
    return true;
  }

  bool accept_descriptor() {
    if (desc_.magic != kCmaMagic || desc_.len != in_total_) {
      cma_errno_ = EPROTO;  // streams out of step: reported by check_peer
      return false;
    }
    have_desc_ = true;
    bump_test_counter(g_single_copy_messages);
    peer_map_.reset();
    peer_src_ = nullptr;
    if ((desc_.flags & kCmaMappable) && map_peers_ && !same_process_) {
      peer_map_ = PeerMaps::get().lookup(desc_);
      if (peer_map_) {
        peer_src_ = static_cast<const std::byte*>(peer_map_->base) + desc_.map_offset;
        bump_test_counter(g_mapped_messages);
      }
    }
    return true;
  }

  // FIFO offset up to which the executor waits for bytes (closed_problem).
  void note_need(uint64_t end) {
    if (need_end_.load(std::memory_order_relaxed) != end) need_end_.store(end, std::memory_order_release);
  }

  void ack(size_t n) {
    in_ctl_->cma_ack.store(in_ctl_->cma_ack.load(std::memory_order_relaxed) + n, std::memory_order_release);
    ring_peer();  // the sender waits for the acknowledgement
  }

  ShmTransport::DoorbellBatch* batch_;
  int peer_rank_;
  ShmTransport::Segment* self_;
  ShmTransport::Segment* peer_;
  FifoCtl* out_ctl_;
  std::byte* out_data_;
  FifoCtl* in_ctl_;
  std::byte* in_data_;
  size_t cap_;
  // Most bytes one FIFO write publishes or one read hands out, so the peer
  // works on one step while this rank moves the next (LOOM_SHM_FIFO_STEP_BYTES).
  size_t step_;
  SharedStores stores_;
  bool same_process_;  // the peer is a thread of this process: single copy is a memcpy
  uint64_t tail_ = 0;  // our copy of out_ctl_->tail (we are its only writer)
  uint64_t head_seen_ = 0;  // out_ctl_->head as last read (it only grows)
  uint64_t head_ = 0;  // our copy of in_ctl_->head
  // Small-message slots: next sequence number to write / freed as last read
  // (sender), next to read (receiver).
  uint64_t slot_seq_ = 0, slots_freed_seen_ = 0, slot_next_ = 0;
  bool out_slot_ = false, in_slot_ = false;
  // Outgoing message state.
  size_t out_total_ = 0, out_done_ = 0;
  bool out_cma_ = false, out_desc_posted_ = false;  // (out_desc_posted_: descriptor or inline header)
  bool out_hdr_ = false;
  std::optional<shared_buffers::Ref> out_ref_;  // the message's mem_alloc buffer, if any
  uint64_t out_ack_base_ = 0;
  // Incoming message state.
  size_t in_total_ = 0, in_done_ = 0;
  bool in_cma_ = false, have_desc_ = false;
  bool in_hdr_ = false;  // a header says how this message comes (Segment::hdr_min_bytes)
  CmaDescriptor desc_{};
  std::unique_ptr<std::byte[]> stage_;
  int cma_errno_ = 0;
  // Mapped single copy: reading the current message through a mapping of
  // the sender's buffer (kCmaMappable), which stays alive while we hold it.
  bool map_peers_ = true;
  std::shared_ptr<PeerMapping> peer_map_;
  const std::byte* peer_src_ = nullptr;
  bool peek_in_sender_ = false;  // recv_peek handed out bytes of the mapping, not yet consumed
  // Shared single copy. Sender: may write into this peer (probed), its
  // phase only sends, the current message offered it, last request seen.
  bool can_push_ = false, sender_idle_ = false, out_push_offered_ = false;
  uint64_t out_push_seen_ = 0, out_push_base_ = 0;
  // Receiver: a request is out, where this rank's own reading stops.
  bool push_pending_ = false;
  size_t read_end_ = SIZE_MAX, push_len_ = 0;
  uint64_t in_push_seq_ = 0, push_base_ = 0;
  // Published by the executor for closed_problem() on other threads.
  std::atomic<uint64_t> need_end_{0};
  std::atomic<uint64_t> need_slot_{0};  // number of the small message awaited + 1 (0: none yet)
  std::atomic<bool> send_pending_{false};
};

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
        std::make_unique<ShmConnection>(self, t->segs_[i], r, i, n, t->fifo_bytes_, step, stores, can_push,
                                        map_peers, &t->batch_);
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
      auto* c = static_cast<ShmConnection*>(conns_[peer].get());
      if (!c) return Status::ok();
      std::string why = c->closed_problem(peer);
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
  if (int e = static_cast<ShmConnection*>(conns_[peer].get())->cma_errno())
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
    auto* c = static_cast<ShmConnection*>(conns_[p].get());
    for (int i = 0; c && c->peer_inside(); ++i) {
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
