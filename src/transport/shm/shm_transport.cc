#include "transport/shm/shm_transport.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <fstream>

#include "core/log.h"

namespace loom {
namespace {

constexpr uint64_t kSegMagic = 0x4c4f4f4d53484d31ull;  // "LOOMSHM1"
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kFifoCtlBytes = 256;

struct alignas(64) FifoCtl {
  std::atomic<uint64_t> tail;  // written by the sender
  char pad0[56];
  std::atomic<uint64_t> head;  // written by the receiver
  char pad1[56];
};
static_assert(sizeof(FifoCtl) <= kFifoCtlBytes);

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

}  // namespace

struct ShmTransport::Segment {
  uint64_t magic;
  int32_t pid;
  int32_t rank;
  alignas(64) std::atomic<uint32_t> doorbell;
  alignas(64) std::atomic<uint32_t> waiters;
  alignas(64) std::atomic<uint32_t> aborted;
  char abort_reason[1024];

  FifoCtl* ctl(int from) {
    return reinterpret_cast<FifoCtl*>(reinterpret_cast<char*>(this) + kHeaderBytes + from * kFifoCtlBytes);
  }
  std::byte* data(int from, int nranks, size_t fifo_bytes) {
    return reinterpret_cast<std::byte*>(this) + kHeaderBytes + nranks * kFifoCtlBytes + from * fifo_bytes;
  }
  void ring() {
    doorbell.fetch_add(1, std::memory_order_seq_cst);
    if (waiters.load(std::memory_order_seq_cst)) futex(&doorbell, FUTEX_WAKE, INT_MAX, nullptr);
  }
};
static_assert(sizeof(ShmTransport::Segment) <= kHeaderBytes);

namespace {

class ShmConnection final : public Connection {
 public:
  ShmConnection(ShmTransport::Segment* self, ShmTransport::Segment* peer, int rank, int peer_rank, int nranks,
                size_t cap)
      : self_(self),
        peer_(peer),
        out_ctl_(peer->ctl(rank)),
        out_data_(peer->data(rank, nranks, cap)),
        in_ctl_(self->ctl(peer_rank)),
        in_data_(self->data(peer_rank, nranks, cap)),
        cap_(cap) {
    tail_ = out_ctl_->tail.load(std::memory_order_relaxed);
    head_ = in_ctl_->head.load(std::memory_order_relaxed);
  }

  size_t send_some(const std::byte* src, size_t msg_remaining) override {
    uint64_t head = out_ctl_->head.load(std::memory_order_acquire);
    size_t free = cap_ - static_cast<size_t>(tail_ - head);
    size_t pos = static_cast<size_t>(tail_ % cap_);
    size_t contig = std::min(free, cap_ - pos);
    size_t n, adv;
    if (round8(msg_remaining) <= contig) {
      n = msg_remaining;
      adv = round8(n);
    } else {
      n = adv = contig & ~size_t{7};
      if (n >= msg_remaining) n = adv = 0;  // cannot happen; keep the invariant obvious
    }
    if (n == 0) return 0;
    std::memcpy(out_data_ + pos, src, n);
    tail_ += adv;
    out_ctl_->tail.store(tail_, std::memory_order_release);
    peer_->ring();
    return n;
  }

  std::span<const std::byte> recv_peek(size_t msg_remaining) override {
    uint64_t tail = in_ctl_->tail.load(std::memory_order_acquire);
    size_t avail = static_cast<size_t>(tail - head_);
    if (avail == 0) return {};
    size_t pos = static_cast<size_t>(head_ % cap_);
    size_t n = std::min({avail, cap_ - pos, msg_remaining});
    return {in_data_ + pos, n};
  }

  void recv_consume(size_t n, size_t msg_remaining) override {
    head_ += (n == msg_remaining) ? round8(n) : n;
    in_ctl_->head.store(head_, std::memory_order_release);
    peer_->ring();  // the sender may be waiting for space
  }

 private:
  ShmTransport::Segment* self_;
  ShmTransport::Segment* peer_;
  FifoCtl* out_ctl_;
  std::byte* out_data_;
  FifoCtl* in_ctl_;
  std::byte* in_data_;
  size_t cap_;
  uint64_t tail_ = 0;  // our copy of out_ctl_->tail (we are its only writer)
  uint64_t head_ = 0;  // our copy of in_ctl_->head
};

std::string seg_name(uint64_t secret, int rank) {
  char buf[64];
  snprintf(buf, sizeof(buf), "/loom-%016llx-%d", static_cast<unsigned long long>(secret), rank);
  return buf;
}

}  // namespace

Result<std::unique_ptr<ShmTransport>> ShmTransport::create(Bootstrap& boot, const std::vector<bool>& local,
                                                           size_t fifo_bytes, Deadline deadline) {
  std::unique_ptr<ShmTransport> t(new ShmTransport());
  const int n = boot.nranks(), r = boot.rank();
  t->rank_ = r;
  t->nranks_ = n;
  t->fifo_bytes_ = std::max<size_t>(4096, round8(fifo_bytes));
  t->seg_bytes_ = kHeaderBytes + n * kFifoCtlBytes + n * t->fifo_bytes_;
  t->segs_.assign(n, nullptr);
  t->conns_.resize(n);
  t->own_name_ = seg_name(boot.secret(), r);
  for (const auto& p : boot.peers()) {
    t->peer_pids_.push_back(p.pid);
    t->peer_hosts_.push_back(p.hostname);
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
  void* p = mmap(nullptr, t->seg_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(t->own_name_.c_str());
    return system_error("mmap shm segment", errno);
  }
  auto* self = static_cast<Segment*>(p);
  self->pid = getpid();
  self->rank = r;
  new (&self->doorbell) std::atomic<uint32_t>(0);
  new (&self->waiters) std::atomic<uint32_t>(0);
  new (&self->aborted) std::atomic<uint32_t>(0);
  for (int i = 0; i < n; ++i) {
    new (&self->ctl(i)->tail) std::atomic<uint64_t>(0);
    new (&self->ctl(i)->head) std::atomic<uint64_t>(0);
  }
  std::atomic_thread_fence(std::memory_order_release);
  self->magic = kSegMagic;
  t->segs_[r] = self;

  // Everyone created theirs -> map the peers' -> everyone mapped -> unlink ours.
  Status st = boot.barrier(deadline);
  if (!st.is_ok()) return st.with_context("shm setup");
  for (int i = 0; i < n; ++i) {
    if (i == r || !local[i]) continue;
    std::string name = seg_name(boot.secret(), i);
    int pfd = shm_open(name.c_str(), O_RDWR, 0600);
    if (pfd < 0) return system_error("shm_open peer segment " + name + " of rank " + std::to_string(i), errno);
    void* q = mmap(nullptr, t->seg_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
    close(pfd);
    if (q == MAP_FAILED) return system_error("mmap peer segment of rank " + std::to_string(i), errno);
    t->segs_[i] = static_cast<Segment*>(q);
    if (t->segs_[i]->magic != kSegMagic || t->segs_[i]->rank != i)
      return internal_error("peer segment of rank " + std::to_string(i) + " is not initialised");
  }
  st = boot.barrier(deadline);
  shm_unlink(t->own_name_.c_str());
  t->unlinked_ = true;
  if (!st.is_ok()) return st.with_context("shm setup");
  for (int i = 0; i < n; ++i)
    if (i != r && t->segs_[i])
      t->conns_[i] = std::make_unique<ShmConnection>(self, t->segs_[i], r, i, n, t->fifo_bytes_);
  LOOM_INFO(kLogShm, "rank {}: shm transport up, {} local peers, fifo {} KiB", r,
            std::count(local.begin(), local.end(), true) - 1, t->fifo_bytes_ >> 10);
  return t;
}

ShmTransport::~ShmTransport() {
  conns_.clear();
  for (auto* s : segs_)
    if (s) munmap(s, seg_bytes_);
  if (!unlinked_ && !own_name_.empty()) shm_unlink(own_name_.c_str());
}

Connection* ShmTransport::connection(int peer) {
  return (peer >= 0 && peer < nranks_) ? conns_[peer].get() : nullptr;
}

uint32_t ShmTransport::events() { return segs_[rank_]->doorbell.load(std::memory_order_seq_cst); }

void ShmTransport::wait_events(uint32_t seen, std::chrono::microseconds timeout) {
  Segment* self = segs_[rank_];
  self->waiters.fetch_add(1, std::memory_order_seq_cst);
  if (self->doorbell.load(std::memory_order_seq_cst) == seen) {
    timespec ts{static_cast<time_t>(timeout.count() / 1000000), static_cast<long>((timeout.count() % 1000000) * 1000)};
    futex(&self->doorbell, FUTEX_WAIT, seen, &ts);
  }
  self->waiters.fetch_sub(1, std::memory_order_seq_cst);
}

void ShmTransport::wake_self() { segs_[rank_]->ring(); }

Status ShmTransport::check_peer(int peer) {
  Segment* s = (peer >= 0 && peer < nranks_) ? segs_[peer] : nullptr;
  if (!s) return Status::ok();
  if (s->aborted.load(std::memory_order_acquire)) {
    std::string reason(s->abort_reason, strnlen(s->abort_reason, sizeof(s->abort_reason)));
    return remote_error("rank " + std::to_string(peer) + " failed: " + reason);
  }
  if (!process_alive(s->pid))
    return remote_error("rank " + std::to_string(peer) + " (pid " + std::to_string(s->pid) + " on " +
                        peer_hosts_[peer] + ") died");
  return Status::ok();
}

void ShmTransport::announce_abort(const std::string& reason) {
  Segment* self = segs_[rank_];
  if (self->aborted.load()) return;
  size_t len = std::min(reason.size(), sizeof(self->abort_reason) - 1);
  std::memcpy(self->abort_reason, reason.data(), len);
  self->abort_reason[len] = '\0';
  self->aborted.store(1, std::memory_order_release);
  for (int i = 0; i < nranks_; ++i)
    if (segs_[i]) segs_[i]->ring();
}

}  // namespace loom
