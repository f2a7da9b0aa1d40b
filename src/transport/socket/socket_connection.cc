#include "transport/socket/socket_connection.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/log.h"

namespace loom {
namespace {

size_t round8(size_t n) { return (n + 7) & ~size_t{7}; }

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

}  // namespace

SocketConnection::SocketConnection(std::vector<Fd> streams, size_t ring_bytes, size_t slice_bytes, std::string label)
    : streams_(streams.size()),
      cap_(round8(ring_bytes)),
      slice_(round8(slice_bytes)),
      label_(std::move(label)),
      out_(new std::byte[cap_]),
      in_(new std::byte[cap_]) {
  for (size_t s = 0; s < streams.size(); ++s) {
    streams_[s].fd = std::move(streams[s]);
    // Stream s starts with slice s of the byte stream.
    streams_[s].send_pos.store(s * slice_, std::memory_order_relaxed);
    streams_[s].recv_pos.store(s * slice_, std::memory_order_relaxed);
  }
}

SocketConnection::~SocketConnection() = default;

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
  const uint64_t head = out_head_.load(std::memory_order_acquire);
  const size_t free = cap_ - static_cast<size_t>(tail_ - head);
  const size_t pos = static_cast<size_t>(tail_ % cap_);
  const size_t contig = std::min(free, cap_ - pos);
  size_t n, adv;
  if (round8(msg_remaining) <= contig) {
    n = msg_remaining;
    adv = round8(n);
  } else {
    n = adv = contig & ~size_t{7};
  }
  if (n == 0) return 0;
  std::memcpy(out_.get() + pos, src, n);
  tail_ += adv;
  // seq_cst pairs with the progress thread's "sleeping" flag (no lost wake-up).
  out_tail_.store(tail_, std::memory_order_seq_cst);
  poke_();
  return n;
}

std::span<const std::byte> SocketConnection::recv_peek(size_t msg_remaining) {
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
    const uint64_t slice_end = (pos / slice_ + 1) * slice_;
    const uint64_t end = std::min(tail, slice_end);
    const size_t off = static_cast<size_t>(pos % cap_);
    const size_t len = std::min<size_t>({static_cast<size_t>(end - pos), cap_ - off, budget});
    ssize_t n = ::send(st.fd.get(), out_.get() + off, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      pos += static_cast<uint64_t>(n);
      budget -= static_cast<size_t>(n);
      if (pos == slice_end) pos = next_slice(pos, s);
      st.send_pos.store(pos, std::memory_order_release);
      moved = true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      *want_poll = POLLOUT;
      break;
    }
    set_error(fmt::format("sending to {} failed on stream {}: {}", label_, s, std::strerror(errno)));
    return true;
  }
  if (moved) store_max(out_head_, min_send_pos());
  return moved;
}

bool SocketConnection::pump_recv(int s, short* want_poll) {
  *want_poll = 0;
  Stream& st = streams_[s];
  if (failed_.load(std::memory_order_relaxed) || st.eof.load(std::memory_order_relaxed)) return false;
  uint64_t pos = st.recv_pos.load(std::memory_order_relaxed);
  bool moved = false;
  size_t budget = kPumpBudget;
  while (budget > 0) {
    const uint64_t limit = in_head_.load(std::memory_order_seq_cst) + cap_;
    if (pos >= limit) break;  // ring full: recv_consume will poke us
    const uint64_t slice_end = (pos / slice_ + 1) * slice_;
    const uint64_t end = std::min(limit, slice_end);
    const size_t off = static_cast<size_t>(pos % cap_);
    const size_t len = std::min<size_t>({static_cast<size_t>(end - pos), cap_ - off, budget});
    ssize_t n = ::recv(st.fd.get(), in_.get() + off, len, MSG_DONTWAIT);
    if (n > 0) {
      pos += static_cast<uint64_t>(n);
      budget -= static_cast<size_t>(n);
      if (pos == slice_end) pos = next_slice(pos, s);
      st.recv_pos.store(pos, std::memory_order_release);
      moved = true;
      continue;
    }
    if (n == 0) {
      st.eof.store(true, std::memory_order_release);
      LOOM_INFO(kLogNet, "{} closed stream {}", label_, s);
      moved = true;  // wake the executor so it looks at the peer
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      *want_poll = POLLIN;
      break;
    }
    set_error(fmt::format("receiving from {} failed on stream {}: {}", label_, s, std::strerror(errno)));
    return true;
  }
  if (moved) store_max(in_tail_, min_recv_pos());
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

Status SocketConnection::check() const {
  if (failed_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lk(err_mu_);
    return remote_error(error_);
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
  // The stream that carries the next bytes we need has ended: they can never come.
  if (all_eof || streams_[lagging].eof.load(std::memory_order_acquire))
    return remote_error(label_ + " closed the connection (the process exited, was killed, or destroyed its "
                                 "communicator while this rank still needed data from it)");
  return Status::ok();
}

bool SocketConnection::flushed() const {
  return failed_.load(std::memory_order_acquire) || out_head_.load(std::memory_order_acquire) >= out_tail_.load(std::memory_order_acquire);
}

}  // namespace loom
