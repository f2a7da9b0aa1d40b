#include "transport/shm/shm_connection.h"

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
#include "transport/shm/shm_layout.h"

namespace loom {
namespace shm LOOM_SHM_HIDDEN {
namespace {

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

}  // namespace

bool cma_read(bool same_process, int pid, uint64_t addr, std::byte* dst, size_t len, int* err) {
  return cma_copy(same_process, pid, addr, dst, len, false, err);
}
bool cma_write(bool same_process, int pid, uint64_t addr, const std::byte* src, size_t len, int* err) {
  return cma_copy(same_process, pid, addr, const_cast<std::byte*>(src), len, true, err);
}

namespace {

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
    const auto [n, adv] = ring_piece(msg_remaining, contig);
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

}  // namespace

std::unique_ptr<Connection> make_connection(ShmTransport::Segment* self, ShmTransport::Segment* peer, int rank,
                                            int peer_rank, int nranks, size_t cap, size_t step,
                                            SharedStores::Policy stores, bool can_push, bool map_peers,
                                            ShmTransport::DoorbellBatch* batch) {
  return std::make_unique<ShmConnection>(self, peer, rank, peer_rank, nranks, cap, step, stores, can_push, map_peers,
                                         batch);
}
std::string closed_problem(Connection* c, int peer) { return static_cast<ShmConnection*>(c)->closed_problem(peer); }
int cma_errno(Connection* c) { return static_cast<ShmConnection*>(c)->cma_errno(); }
bool peer_inside(Connection* c) { return static_cast<ShmConnection*>(c)->peer_inside(); }

}  // namespace shm
}  // namespace loom
