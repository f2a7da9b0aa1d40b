// Internals of the shared-memory transport that both of its files use: the
// segment's layout (control blocks, slots, FIFOs, the single-copy descriptor),
// the process-wide test counters and a few small helpers. The transport
// (shm_transport.cc: segment set-up, liveness, doorbells) and its
// connections (shm_connection.cc: the message paths) include it; nothing else.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <ctime>

#include "transport/shm/shm_connection.h"  // LOOM_SHM_HIDDEN
#include "transport/shm/shm_transport.h"

namespace loom {
namespace shm LOOM_SHM_HIDDEN {

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
inline std::atomic<uint64_t> g_shared_copy_bytes{0};  // written by senders, this process
inline std::atomic<uint64_t> g_wait_timeouts{0};      // waits that ended by timeout, this process
inline std::atomic<uint64_t> g_missed_wakeups{0};     // ... with the doorbell rung meanwhile
// Test counters of this process: small messages sent through slots, FIFO
// writes that published bytes, messages sent from two pieces (send_gather),
// and messages received by single copy.
inline std::atomic<uint64_t> g_slot_messages{0};
inline std::atomic<uint64_t> g_fifo_writes{0};
inline std::atomic<uint64_t> g_gathered_messages{0};
inline std::atomic<uint64_t> g_single_copy_messages{0};
inline std::atomic<uint64_t> g_mapped_messages{0};
inline std::atomic<uint64_t> g_streamed_steps{0};   // FIFO steps written (in part) by streaming stores
inline std::atomic<uint64_t> g_store_switches{0};   // SharedStores changes of mode
// Bumps a test counter on the message path with a plain load + store, not an
// atomic increment: with several thread ranks a count may be lost, which only
// matters to a test that asks for > 0.
inline void bump_test_counter(std::atomic<uint64_t>& c) { c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
constexpr uint64_t kCmaMagic = 0x434d41444553431ull;
constexpr uint64_t kInlineMagic = 0x494e4c494e45484dull;  // header of a message whose bytes follow in the FIFO
constexpr size_t kCmaStageBytes = 256 << 10;   // staging for reduce-on-receive
constexpr size_t kCmaReadChunk = 4 << 20;      // bytes per process_vm_readv


inline long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

inline std::atomic<void (*)(bool)> g_peer_memory_hook{nullptr};  // tests (set_peer_memory_hook_for_test)

// Byte offset of the FIFO that carries messages from rank `from`.
inline size_t fifo_offset(int from, int nranks, size_t fifo_bytes) {
  return kHeaderBytes + static_cast<size_t>(nranks) * kFifoCtlBytes + static_cast<size_t>(from) * fifo_bytes;
}

}  // namespace shm

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

  shm::FifoCtl* ctl(int from) {
    return reinterpret_cast<shm::FifoCtl*>(reinterpret_cast<char*>(this) + shm::kHeaderBytes + from * shm::kFifoCtlBytes);
  }
  std::byte* data(int from, int nranks, size_t fifo_bytes) {
    return reinterpret_cast<std::byte*>(this) + shm::fifo_offset(from, nranks, fifo_bytes);
  }
  // Rare events (abort, close, self wake-up): always bump the doorbell.
  void ring() {
    doorbell.fetch_add(1, std::memory_order_seq_cst);
    if (waiters.load(std::memory_order_seq_cst)) shm::futex(&doorbell, FUTEX_WAKE, INT_MAX, nullptr);
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
      shm::futex(&doorbell, FUTEX_WAKE, INT_MAX, nullptr);
    }
  }
};
static_assert(sizeof(ShmTransport::Segment) <= shm::kHeaderBytes);

namespace shm LOOM_SHM_HIDDEN {

// Whether two segments' creators are one process (ranks as threads): the
// same pid in the same pid namespace; two live processes never share both.
// Regression: pids alone were compared, so two containers' ranks, both pid
// 1 in their own namespaces, took each other for threads of one process and
// memcpy'd from addresses of the other's address space.
// The random token settles it where /proc cannot name the namespace.
inline bool same_process(const ShmTransport::Segment* a, const ShmTransport::Segment* b) {
  return a->pid == b->pid && a->pid_ns == b->pid_ns && a->proc_token == b->proc_token;
}
// Whether b's pid is meaningless to a (another pid namespace: no
// process_vm_readv, pidfd or kill(pid, 0) with it). Two live processes with
// one pid are in different namespaces too.
inline bool other_pid_namespace(const ShmTransport::Segment* a, const ShmTransport::Segment* b) {
  if (a->pid_ns != 0 && b->pid_ns != 0) return a->pid_ns != b->pid_ns;
  return a->pid == b->pid && a->proc_token != b->proc_token;
}

}  // namespace shm
}  // namespace loom
