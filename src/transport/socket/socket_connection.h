// One peer of the socket transport: two local staging rings (outgoing and
// incoming) between the executor and several TCP streams.
//
// The executor sees the same byte-stream contract as the shm FIFO (messages
// padded to 8 bytes, partial pushes and reads in multiples of 8). Progress
// threads move the ring's bytes over the streams: the byte at stream offset b
// travels on stream (b / slice) % nstreams, so both sides agree on the split
// without any framing. Each stream's cursor only moves forward; the ring's
// shared cursor (bytes sent, bytes received) is the minimum over streams, so
// the stream that lags decides what is freed or delivered.
//
// Large messages (>= direct_bytes) skip the rings: the executor posts a
// window (user pointer + stream offsets) and the progress threads send() from
// the source / recv() into the destination; send_some / recv_into report the
// window's bytes only once the kernel took / delivered them. Receive windows
// need each stream's acknowledgement: bytes a stream put into the ring before
// it saw the window are copied out by the executor.
//
// Threads: the executor thread calls send_some / recv_peek / recv_consume /
// recv_into; progress threads call pump_send / pump_recv for the streams they
// own (one thread per stream); check() runs on the executor thread, fence()
// on the thread that announces a failure.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bootstrap/socket.h"
#include "transport/transport.h"

namespace loom {

class SocketConnection final : public Connection {
 public:
  // `label` names the peer in errors ("rank 3 on host b (10.0.0.2:41000)").
  // `direct_bytes`: messages at least this large bypass the rings (0 = never).
  SocketConnection(std::vector<Fd> streams, size_t ring_bytes, size_t slice_bytes, std::string label,
                   size_t direct_bytes = 0);
  // `poke` wakes the progress threads when the executor adds data to send or
  // frees incoming space. Set once, before the connection is used.
  void set_poke(std::function<void()> poke) { poke_ = std::move(poke); }
  ~SocketConnection() override;

  // Connection (executor thread).
  size_t send_some(const std::byte* src, size_t msg_remaining) override;
  std::span<const std::byte> recv_peek(size_t msg_remaining) override;
  void recv_consume(size_t n, size_t msg_remaining) override;
  size_t recv_into(std::byte* dst, size_t msg_remaining) override;

  // Progress (the thread that owns stream s). Each returns true when bytes
  // moved; *want_poll receives POLLIN / POLLOUT when the stream waits on the
  // kernel (0 when it waits on the executor or has failed).
  bool pump_send(int s, short* want_poll);
  bool pump_recv(int s, short* want_poll);

  int nstreams() const { return static_cast<int>(streams_.size()); }
  int fd(int s) const { return streams_[s].fd.get(); }
  const std::string& label() const { return label_; }

  // Non-ok once the peer can no longer deliver what we wait for or accept
  // what we send: a socket error, a receive that wants bytes past the peer's
  // orderly close, or end-of-file without a close notice on the stream that
  // carries the next needed bytes (the peer died). Any thread.
  Status check() const;
  // True when every byte handed to send_some has reached the kernel (or the
  // connection failed, so nothing more will).
  bool flushed() const;
  // Records a failure seen elsewhere (the control stream).
  void fail(const std::string& why);
  // The peer destroyed its communicator after handing us `sent` stream bytes
  // (its orderly-close notice, control stream). From then on check() fails
  // only when this rank needs more than that, or a stream ended short of it.
  void peer_closed(uint64_t sent);
  // The control stream ended without such a notice: end-of-file on a data
  // stream is a crash, reported at once instead of after a grace period.
  void control_lost() { ctrl_lost_.store(true, std::memory_order_release); }
  // Stream bytes handed to send_some so far (all in the kernel once flushed()).
  uint64_t sent_bytes() const { return out_tail_.load(std::memory_order_acquire); }
  // The communicator failed: its op returns an error and the user may free
  // the buffers of a posted window. Stops all direct I/O and waits until no
  // progress thread is inside a send()/recv() on a user buffer.
  void fence();

  // Bytes that went straight between user buffers and sockets (tests).
  uint64_t direct_sent() const { return direct_sent_.load(std::memory_order_relaxed); }
  uint64_t direct_received() const { return direct_received_.load(std::memory_order_relaxed); }

 private:
  struct Stream {
    Fd fd;
    std::atomic<uint64_t> send_pos{0};  // next stream offset to send on this stream
    std::atomic<uint64_t> recv_pos{0};  // next stream offset to receive on this stream
    std::atomic<bool> eof{false};       // the peer closed its side
    // Receive window seen by this stream's thread, and its recv_pos then
    // (what lies below went to the ring).
    std::atomic<uint32_t> adopted{0};
    std::atomic<uint64_t> adopt_pos{0};
  };
  // A user buffer that stands for stream offsets [base, end). Written by
  // the executor under a sequence lock (odd while being written), read by
  // the progress threads.
  struct Window {
    std::atomic<uint32_t> seq{0};
    std::atomic<std::byte*> ptr{nullptr};
    std::atomic<uint64_t> base{0};
    std::atomic<uint64_t> end{0};
  };
  struct WinView {
    uint32_t seq = 0;
    std::byte* ptr = nullptr;
    uint64_t base = 0, end = 0;
    bool holds(uint64_t pos) const { return pos >= base && pos < end; }
  };
  static WinView load_window(const Window& w);
  msghdr window_msg(uint64_t pos, uint64_t limit, const WinView& w, int s, size_t budget, iovec* iov) const;
  static uint32_t post_window(Window& w, std::byte* ptr, uint64_t base, uint64_t end);
  // A send()/recv() on a user buffer; false (nothing done) once fenced.
  bool direct_enter();
  void direct_leave() { direct_busy_.fetch_sub(1, std::memory_order_release); }
  size_t send_window_progress();
  size_t recv_window_progress(std::byte* dst);
  static constexpr int kMaxIov = 32;
  uint64_t advance(uint64_t pos, uint64_t n, int s) const;
  uint64_t next_slice(uint64_t pos, int s) const;
  void set_error(const std::string& why);
  uint64_t min_send_pos() const;
  uint64_t min_recv_pos() const;
  // Stream offset up to which the executor waits for bytes (for check()).
  void note_need(uint64_t end) {
    if (need_end_.load(std::memory_order_relaxed) != end) need_end_.store(end, std::memory_order_release);
  }

  std::vector<Stream> streams_;
  const size_t cap_;
  const size_t slice_;
  const std::string label_;
  std::function<void()> poke_;

  std::unique_ptr<std::byte[]> out_;
  std::unique_ptr<std::byte[]> in_;
  alignas(64) std::atomic<uint64_t> out_tail_{0};  // bytes handed to us by the executor
  alignas(64) std::atomic<uint64_t> out_head_{0};  // bytes handed to the kernel (min over streams)
  alignas(64) std::atomic<uint64_t> in_tail_{0};   // bytes received (min over streams)
  alignas(64) std::atomic<uint64_t> in_head_{0};   // bytes consumed by the executor
  uint64_t tail_ = 0;      // executor's copy of out_tail_
  uint64_t head_ = 0;      // executor's copy of in_head_
  uint64_t skip_ = 0;      // padding of a finished message not yet received

  const size_t direct_min_;
  Window swin_, rwin_;
  // Executor's view of its posted windows.
  bool swin_active_ = false, rwin_active_ = false, rwin_copied_ = false;
  std::byte* swin_ptr_ = nullptr;
  std::byte* rwin_ptr_ = nullptr;
  uint64_t swin_base_ = 0, swin_end_ = 0, swin_done_ = 0;
  uint64_t rwin_base_ = 0, rwin_end_ = 0, rwin_done_ = 0;
  uint32_t rwin_seq_ = 0;
  std::atomic<bool> fenced_{false};
  std::atomic<int> direct_busy_{0};
  std::atomic<uint64_t> direct_sent_{0}, direct_received_{0};

  // Orderly close of the peer (see peer_closed) and how a crash is told apart.
  static constexpr uint64_t kNotClosed = UINT64_MAX;
  std::atomic<uint64_t> need_end_{0};
  std::atomic<uint64_t> peer_closed_at_{kNotClosed};
  std::atomic<bool> ctrl_lost_{false};
  std::atomic<int64_t> first_eof_ns_{0};  // steady clock; 0 = no stream ended yet

  std::atomic<bool> failed_{false};
  mutable std::mutex err_mu_;
  std::string error_;  // first failure, set once before failed_
};

}  // namespace loom
