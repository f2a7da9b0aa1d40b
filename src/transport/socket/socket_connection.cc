#include "transport/socket/socket_connection.h"

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/log.h"

namespace loom {
namespace {

// Several threads publish the minimum of their cursors; a stale (smaller)
// minimum must never overwrite a newer one.
void store_max(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_seq_cst, std::memory_order_relaxed)) {
  }
}

// One pump call moves at most this much per stream, so a thread that owns
// several streams serves them fairly.
constexpr size_t kPumpBudget = 4u << 20;
constexpr size_t kDirectCallBytes = 512u << 10;  // user buffer: bytes per sendmsg()/recvmsg() at most

}  // namespace

SocketConnection::SocketConnection(std::vector<Fd> streams, size_t ring_bytes, size_t slice_bytes, std::string label,
                                   size_t direct_bytes)
    : streams_(streams.size()),
      cap_(round8(ring_bytes)),
      slice_(round8(slice_bytes)),
      label_(std::move(label)),
      out_(new std::byte[cap_]),
      in_(new std::byte[cap_]),
      direct_min_(direct_bytes == 0 ? 0 : std::max<size_t>(direct_bytes, 8)) {
  // Touch every page now: otherwise the first pass through each ring takes a
  // page fault per 4 KiB in the middle of the first large operations.
  std::memset(out_.get(), 0, cap_);
  std::memset(in_.get(), 0, cap_);
  for (size_t s = 0; s < streams.size(); ++s) {
    streams_[s].fd = std::move(streams[s]);
    // Stream s starts with slice s of the byte stream.
    streams_[s].send_pos.store(s * slice_, std::memory_order_relaxed);
    streams_[s].recv_pos.store(s * slice_, std::memory_order_relaxed);
  }
}

SocketConnection::~SocketConnection() = default;

// The user's buffer (a direct window) from pos up to limit, as this stream
// carries it: its slices only (the other streams carry the ones between), at
// most kDirectCallBytes (and budget) and kMaxIov pieces, as the message of one
// sendmsg()/recvmsg(). Cutting every
// call at the slice's end multiplied system calls on a CPU-bound link.
// Measured between two namespaces, 1 stream, 256 MiB, GB/s: both ways at once
// 1.23-1.37 with 64 KiB calls, 1.41-1.49 with 512 KiB; one way no slower
// (2.4-3.0 -> 2.6-3.3); with unbounded calls one way fell to 2.0-2.2 (a
// multi-MiB copy from the socket outruns the cache). The ring path keeps
// one slice per call: a receiver that reduces from it starts on a slice as
// soon as it is in.
msghdr SocketConnection::window_msg(uint64_t pos, uint64_t limit, const WinView& w, int s, size_t budget,
                                   iovec* iov) const {
  const size_t max_bytes = std::min(budget, kDirectCallBytes);
  int k = 0;
  size_t total = 0;
  for (uint64_t p = pos; k < kMaxIov && p < limit && total < max_bytes;) {
    const uint64_t slice_end = (p / slice_ + 1) * slice_;
    const uint64_t e = std::min({slice_end, limit, p + (max_bytes - total)});
    iov[k].iov_base = w.ptr + (p - w.base);
    iov[k].iov_len = static_cast<size_t>(e - p);
    total += iov[k].iov_len;
    ++k;
    if (e != slice_end) break;
    p = next_slice(slice_end, s);
  }
  msghdr mh{};
  mh.msg_iov = iov;
  mh.msg_iovlen = static_cast<size_t>(k);
  return mh;
}

uint64_t SocketConnection::advance(uint64_t pos, uint64_t n, int s) const {
  while (n > 0) {
    const uint64_t slice_end = (pos / slice_ + 1) * slice_;
    const uint64_t step = std::min(n, slice_end - pos);
    pos += step;
    n -= step;
    if (pos == slice_end) pos = next_slice(pos, s);
  }
  return pos;
}

uint64_t SocketConnection::next_slice(uint64_t pos, int /*s*/) const {
  // pos has just reached the end of one of this stream's slices: skip the
  // slices of the other streams.
  return pos + (streams_.size() - 1) * slice_;
}

uint64_t SocketConnection::min_send_pos() const {
  uint64_t m = UINT64_MAX;
  for (const auto& s : streams_) m = std::min(m, s.send_pos.load(std::memory_order_acquire));
  return m;
}

uint64_t SocketConnection::min_recv_pos() const {
  uint64_t m = UINT64_MAX;
  for (const auto& s : streams_) m = std::min(m, s.recv_pos.load(std::memory_order_acquire));
  return m;
}

// ---- executor side ---------------------------------------------------------

size_t SocketConnection::send_some(const std::byte* src, size_t msg_remaining) {
  if (swin_active_) return send_window_progress();
  if (direct_min_ && msg_remaining >= direct_min_ && !fenced_.load(std::memory_order_relaxed)) {
    // Large message: the progress threads send straight from `src`. The
    // window covers the whole 8-byte multiples; a short tail and the padding
    // follow through the ring once the window is done. The window is
    // published before out_tail_ moves past it, so a thread that sees the new
    // tail sees the window.
    swin_ptr_ = const_cast<std::byte*>(src);
    swin_base_ = tail_;
    swin_end_ = tail_ + (msg_remaining & ~uint64_t{7});
    swin_done_ = 0;
    swin_active_ = true;
    post_window(swin_, swin_ptr_, swin_base_, swin_end_);
    tail_ = swin_end_;
    out_tail_.store(tail_, std::memory_order_seq_cst);
    poke_();
    return send_window_progress();
  }
  const uint64_t head = out_head_.load(std::memory_order_acquire);
  const size_t free = cap_ - static_cast<size_t>(tail_ - head);
  const size_t pos = static_cast<size_t>(tail_ % cap_);
  const size_t contig = std::min(free, cap_ - pos);
  const auto [n, adv] = ring_piece(msg_remaining, contig);
  if (n == 0) return 0;
  std::memcpy(out_.get() + pos, src, n);
  tail_ += adv;
  // seq_cst pairs with the progress thread's "sleeping" flag (no lost wake-up).
  out_tail_.store(tail_, std::memory_order_seq_cst);
  poke_();
  return n;
}

std::span<const std::byte> SocketConnection::recv_peek(size_t msg_remaining) {
  if (rwin_active_) return {};  // recv_into owns the current message
  note_need(head_ + skip_ + msg_remaining);
  uint64_t tail = in_tail_.load(std::memory_order_acquire);
  if (skip_ > 0) {
    // The previous message's padding: drop it as it arrives. head_ must never
    // pass what was received, or a fast stream could overwrite a slot that a
    // slow stream has yet to fill.
    if (tail <= head_) return {};
    uint64_t s = std::min<uint64_t>(skip_, tail - head_);
    head_ += s;
    skip_ -= s;
    in_head_.store(head_, std::memory_order_seq_cst);
    if (skip_ > 0) return {};
  }
  if (tail <= head_) return {};
  const size_t avail = static_cast<size_t>(tail - head_);
  const size_t pos = static_cast<size_t>(head_ % cap_);
  size_t n = std::min({avail, cap_ - pos, msg_remaining});
  // Streams deliver arbitrary byte counts; hand out whole elements only.
  if (n < msg_remaining) n &= ~size_t{7};
  if (n == 0) return {};
  return {in_.get() + pos, n};
}

void SocketConnection::recv_consume(size_t n, size_t msg_remaining) {
  head_ += n;
  if (n == msg_remaining) skip_ = round8(n) - n;
  in_head_.store(head_, std::memory_order_seq_cst);
  poke_();  // a stream may be waiting for ring space
}

size_t SocketConnection::recv_into(std::byte* dst, size_t msg_remaining) {
  if (rwin_active_) return recv_window_progress(dst);
  note_need(head_ + skip_ + msg_remaining);
  if (direct_min_ == 0 || msg_remaining < direct_min_ || fenced_.load(std::memory_order_relaxed))
    return Connection::recv_into(dst, msg_remaining);
  if (skip_ > 0) {
    (void)recv_peek(msg_remaining);  // drops the previous message's padding as far as it arrived
    if (skip_ > 0) return 0;
  }
  // Large message: the progress threads receive straight into `dst` from
  // the moment they see the window; recv_window_progress copies what they
  // put into the ring before.
  rwin_ptr_ = dst;
  rwin_base_ = head_;
  rwin_end_ = head_ + (msg_remaining & ~uint64_t{7});
  rwin_done_ = 0;
  rwin_copied_ = false;
  rwin_active_ = true;
  rwin_seq_ = post_window(rwin_, dst, rwin_base_, rwin_end_);
  // Orders the window's release before poke_'s load of `sleeping` (a worker
  // stores sleeping, then loads the window): without it both could read the
  // old value and the worker slept through the window for its 100 ms poll.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  poke_();  // sleeping threads must acknowledge the window
  return recv_window_progress(dst);
}

size_t SocketConnection::send_window_progress() {
  const uint64_t head = std::min(out_head_.load(std::memory_order_acquire), swin_end_);
  uint64_t sent = head > swin_base_ ? head - swin_base_ : 0;
  if (swin_base_ + sent < swin_end_) sent &= ~uint64_t{7};
  const size_t k = static_cast<size_t>(sent - swin_done_);
  swin_done_ = sent;
  // Every byte of the window is in the kernel: the user may reuse the buffer.
  if (swin_base_ + sent == swin_end_) swin_active_ = false;
  return k;
}

size_t SocketConnection::recv_window_progress(std::byte* /*dst*/) {
  if (!rwin_copied_) {
    for (const auto& st : streams_)
      if (st.adopted.load(std::memory_order_acquire) != rwin_seq_) return 0;
    // Each stream put its bytes below adopt_pos into the ring (they were
    // received before the thread saw the window): copy this message's share.
    const uint64_t n = streams_.size();
    for (uint64_t s = 0; s < n; ++s) {
      const uint64_t upto = std::clamp(streams_[s].adopt_pos.load(std::memory_order_acquire), rwin_base_, rwin_end_);
      for (uint64_t p = rwin_base_; p < upto;) {
        const uint64_t slice = p / slice_;
        const uint64_t slice_end = (slice + 1) * slice_;
        if (slice % n != s) {
          p = slice_end;
          continue;
        }
        const uint64_t e = std::min(upto, slice_end);
        while (p < e) {
          const size_t off = static_cast<size_t>(p % cap_);
          const size_t len = std::min<size_t>(static_cast<size_t>(e - p), cap_ - off);
          std::memcpy(rwin_ptr_ + (p - rwin_base_), in_.get() + off, len);
          p += len;
        }
      }
    }
    rwin_copied_ = true;
  }
  const uint64_t tail = std::min(in_tail_.load(std::memory_order_acquire), rwin_end_);
  uint64_t got = tail > rwin_base_ ? tail - rwin_base_ : 0;
  if (rwin_base_ + got < rwin_end_) got &= ~uint64_t{7};
  const size_t k = static_cast<size_t>(got - rwin_done_);
  rwin_done_ = got;
  if (rwin_base_ + got == rwin_end_) {
    rwin_active_ = false;
    head_ = rwin_end_;
    in_head_.store(head_, std::memory_order_seq_cst);
    poke_();  // streams past the window may wait for ring space
  }
  return k;
}

// ---- windows ---------------------------------------------------------------

uint32_t SocketConnection::post_window(Window& w, std::byte* ptr, uint64_t base, uint64_t end) {
  const uint32_t s = w.seq.load(std::memory_order_relaxed);
  w.seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  w.ptr.store(ptr, std::memory_order_relaxed);
  w.base.store(base, std::memory_order_relaxed);
  w.end.store(end, std::memory_order_relaxed);
  w.seq.store(s + 2, std::memory_order_release);
  return s + 2;
}

SocketConnection::WinView SocketConnection::load_window(const Window& w) {
  WinView v;
  for (;;) {
    v.seq = w.seq.load(std::memory_order_acquire);
    if (v.seq & 1) continue;  // the executor is writing it (a few stores)
    v.ptr = w.ptr.load(std::memory_order_relaxed);
    v.base = w.base.load(std::memory_order_relaxed);
    v.end = w.end.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (w.seq.load(std::memory_order_relaxed) == v.seq) return v;
  }
}

bool SocketConnection::direct_enter() {
  // Pairs with fence(): either fence sees us busy and waits, or we see it.
  direct_busy_.fetch_add(1, std::memory_order_seq_cst);
  if (fenced_.load(std::memory_order_seq_cst)) {
    direct_leave();
    return false;
  }
  return true;
}

void SocketConnection::fence() {
  fenced_.store(true, std::memory_order_seq_cst);
  while (direct_busy_.load(std::memory_order_seq_cst) != 0) sched_yield();
}

// ---- progress side ---------------------------------------------------------

bool SocketConnection::pump_send(int s, short* want_poll) {
  *want_poll = 0;
  if (failed_.load(std::memory_order_relaxed)) return false;
  Stream& st = streams_[s];
  uint64_t pos = st.send_pos.load(std::memory_order_relaxed);
  bool moved = false;
  size_t budget = kPumpBudget;
  while (budget > 0) {
    const uint64_t tail = out_tail_.load(std::memory_order_seq_cst);
    if (pos >= tail) break;
    // After the tail: a window below the tail is visible (posted first).
    const WinView w = load_window(swin_);
    ssize_t n;
    int err;
    if (w.holds(pos)) {
      iovec iov[kMaxIov];
      msghdr mh = window_msg(pos, std::min(tail, w.end), w, s, budget, iov);
      if (!direct_enter()) break;  // fenced: the user's buffer is no longer ours
      n = ::sendmsg(st.fd.get(), &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
      err = errno;
      direct_leave();
      if (n > 0) direct_sent_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    } else {
      uint64_t end = std::min(tail, (pos / slice_ + 1) * slice_);
      if (pos < w.base) end = std::min(end, w.base);
      const size_t off = static_cast<size_t>(pos % cap_);
      end = std::min<uint64_t>(end, pos + (cap_ - off));
      const size_t len = std::min<size_t>(static_cast<size_t>(end - pos), budget);
      n = ::send(st.fd.get(), out_.get() + off, len, MSG_DONTWAIT | MSG_NOSIGNAL);
      err = errno;
    }
    if (n > 0) {
      pos = advance(pos, static_cast<uint64_t>(n), s);
      budget -= std::min(budget, static_cast<size_t>(n));
      st.send_pos.store(pos, std::memory_order_release);
      moved = true;
      continue;
    }
    if (n < 0 && err == EINTR) continue;
    if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK)) {
      *want_poll = POLLOUT;
      break;
    }
    set_error(fmt::format("sending to {} failed on stream {}: {}", label_, s, std::strerror(err)));
    return true;
  }
  // The fence orders this thread's send_pos store before its loads of the
  // other streams' (a Dekker pair with theirs): release/acquire alone let two
  // threads that finished together each read the other's old position, so
  // both published a stale minimum and out_head_ stayed below the window's
  // end with every byte sent: the send hung until LOOM_TIMEOUT (2 streams,
  // 4 KiB slices, 64 KiB messages: within ~2000 ops).
  if (moved) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    store_max(out_head_, min_send_pos());
  }
  return moved;
}

bool SocketConnection::pump_recv(int s, short* want_poll) {
  *want_poll = 0;
  Stream& st = streams_[s];
  if (failed_.load(std::memory_order_relaxed)) return false;
  if (st.eof.load(std::memory_order_relaxed)) {
    // Nothing more arrives on this stream, but a receive window posted now
    // still waits for its acknowledgement: everything this stream carried
    // went to the ring (a peer that sent its last message and left).
    const WinView w = load_window(rwin_);
    if (w.seq == st.adopted.load(std::memory_order_relaxed)) return false;
    st.adopt_pos.store(st.recv_pos.load(std::memory_order_relaxed), std::memory_order_relaxed);
    st.adopted.store(w.seq, std::memory_order_release);
    return true;
  }
  uint64_t pos = st.recv_pos.load(std::memory_order_relaxed);
  bool moved = false;
  size_t budget = kPumpBudget;
  while (budget > 0) {
    const WinView w = load_window(rwin_);
    if (w.seq != st.adopted.load(std::memory_order_relaxed)) {
      // First look at a new window: what this stream received so far went
      // to the ring, from here on window bytes go to the user's buffer.
      st.adopt_pos.store(pos, std::memory_order_relaxed);
      st.adopted.store(w.seq, std::memory_order_release);
      moved = true;  // wake the executor: it waits for the acknowledgements
    }
    ssize_t n;
    int err;
    if (w.holds(pos)) {
      iovec iov[kMaxIov];
      msghdr mh = window_msg(pos, w.end, w, s, budget, iov);
      if (!direct_enter()) break;  // fenced: the user's buffer is no longer ours
      n = ::recvmsg(st.fd.get(), &mh, MSG_DONTWAIT);
      err = errno;
      direct_leave();
      if (n > 0) direct_received_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    } else {
      const uint64_t limit = in_head_.load(std::memory_order_seq_cst) + cap_;
      if (pos >= limit) break;  // ring full: recv_consume will poke us
      uint64_t end = std::min((pos / slice_ + 1) * slice_, limit);
      if (pos < w.base) end = std::min(end, w.base);
      const size_t off = static_cast<size_t>(pos % cap_);
      end = std::min<uint64_t>(end, pos + (cap_ - off));
      const size_t len = std::min<size_t>(static_cast<size_t>(end - pos), budget);
      n = ::recv(st.fd.get(), in_.get() + off, len, MSG_DONTWAIT);
      err = errno;
    }
    if (n > 0) {
      pos = advance(pos, static_cast<uint64_t>(n), s);
      budget -= std::min(budget, static_cast<size_t>(n));
      st.recv_pos.store(pos, std::memory_order_release);
      moved = true;
      continue;
    }
    if (n == 0) {
      int64_t none = 0;
      first_eof_ns_.compare_exchange_strong(none, Clock::now().time_since_epoch().count() | 1);
      st.eof.store(true, std::memory_order_release);
      LOOM_INFO(kLogNet, "{} closed stream {}", label_, s);
      moved = true;  // wake the executor so it looks at the peer
      break;
    }
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      *want_poll = POLLIN;
      break;
    }
    set_error(fmt::format("receiving from {} failed on stream {}: {}", label_, s, std::strerror(err)));
    return true;
  }
  if (moved) {
    std::atomic_thread_fence(std::memory_order_seq_cst);  // as in pump_send
    store_max(in_tail_, min_recv_pos());
  }
  return moved;
}

void SocketConnection::set_error(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(err_mu_);
    if (!error_.empty()) return;
    error_ = why;
  }
  failed_.store(true, std::memory_order_release);
  LOOM_WARN(kLogNet, "{}", why);
}

void SocketConnection::fail(const std::string& why) { set_error(why); }

void SocketConnection::peer_closed(uint64_t sent) {
  peer_closed_at_.store(sent, std::memory_order_release);
  LOOM_INFO(kLogNet, "{} destroyed its communicator after sending {} bytes on this connection", label_, sent);
}

Status SocketConnection::check() const {
  const uint64_t closed_at = peer_closed_at_.load(std::memory_order_acquire);
  const bool closed = closed_at != kNotClosed;
  if (failed_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lk(err_mu_);
    if (closed)
      return remote_error(label_ + " destroyed its communicator (orderly close) while this rank still exchanged data "
                                   "with it: " + error_);
    return remote_error(error_);
  }
  if (closed) {
    // Everything the peer will ever send lies below closed_at: a receive that
    // needs more can never finish. Below it, bytes may still be in flight.
    const uint64_t need = need_end_.load(std::memory_order_acquire);
    if (need > closed_at)
      return remote_error(fmt::format("{} destroyed its communicator (orderly close) before sending what this recv "
                                      "expects (it sent {} bytes on this connection, the recv needs {})",
                                      label_, closed_at, need));
    // recv_pos is the stream's next own byte: below `need` means a byte the
    // peer sent never arrived (its stream ended early).
    for (size_t s = 0; s < streams_.size(); ++s) {
      const uint64_t p = streams_[s].recv_pos.load(std::memory_order_acquire);
      if (streams_[s].eof.load(std::memory_order_acquire) && p < need)
        return remote_error(fmt::format("{} closed stream {} at byte {} although it announced an orderly close after "
                                        "byte {}", label_, s, p, closed_at));
    }
    return Status::ok();
  }
  bool all_eof = true;
  size_t lagging = 0;
  uint64_t lag_pos = UINT64_MAX;
  for (size_t s = 0; s < streams_.size(); ++s) {
    all_eof = all_eof && streams_[s].eof.load(std::memory_order_acquire);
    uint64_t p = streams_[s].recv_pos.load(std::memory_order_acquire);
    if (p < lag_pos) {
      lag_pos = p;
      lagging = s;
    }
  }
  // The stream that carries the next bytes we need has ended: they can never
  // come, unless this is an orderly close whose notice (on the control
  // stream, another TCP connection) is still on its way. A crash closes the
  // control stream too, so it is named at once; the grace only covers a
  // control stream that stays open.
  if (all_eof || streams_[lagging].eof.load(std::memory_order_acquire)) {
    const auto since = std::chrono::nanoseconds(Clock::now().time_since_epoch().count() -
                                                first_eof_ns_.load(std::memory_order_acquire));
    if (!ctrl_lost_.load(std::memory_order_acquire) && since < std::chrono::seconds(1)) return Status::ok();
    return remote_error(label_ + " closed the connection (the process exited, was killed, or destroyed its "
                                 "communicator while this rank still needed data from it)");
  }
  return Status::ok();
}

bool SocketConnection::flushed() const {
  return failed_.load(std::memory_order_acquire) || out_head_.load(std::memory_order_acquire) >= out_tail_.load(std::memory_order_acquire);
}

}  // namespace loom
