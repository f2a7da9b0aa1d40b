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
// Threads: the executor thread calls send_some / recv_peek / recv_consume;
// progress threads call pump_send / pump_recv for the streams they own (one
// thread per stream); check() runs on the executor thread.
#pragma once

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
  SocketConnection(std::vector<Fd> streams, size_t ring_bytes, size_t slice_bytes, std::string label);
  // `poke` wakes the progress threads when the executor adds data to send or
  // frees incoming space. Set once, before the connection is used.
  void set_poke(std::function<void()> poke) { poke_ = std::move(poke); }
  ~SocketConnection() override;

  // Connection (executor thread).
  size_t send_some(const std::byte* src, size_t msg_remaining) override;
  std::span<const std::byte> recv_peek(size_t msg_remaining) override;
  void recv_consume(size_t n, size_t msg_remaining) override;

  // Progress (the thread that owns stream s). Each returns true when bytes
  // moved; *want_poll receives POLLIN / POLLOUT when the stream waits on the
  // kernel (0 when it waits on the executor or has failed).
  bool pump_send(int s, short* want_poll);
  bool pump_recv(int s, short* want_poll);

  int nstreams() const { return static_cast<int>(streams_.size()); }
  int fd(int s) const { return streams_[s].fd.get(); }
  const std::string& label() const { return label_; }

  // Non-ok once the peer can no longer deliver what we wait for or accept
  // what we send: a socket error, or end-of-file on the stream that carries
  // the next needed bytes (the peer closed or died).
  Status check() const;
  // True when every byte handed to send_some has reached the kernel (or the
  // connection failed, so nothing more will).
  bool flushed() const;
  // Records a failure seen elsewhere (the control stream).
  void fail(const std::string& why);

 private:
  struct Stream {
    Fd fd;
    std::atomic<uint64_t> send_pos{0};  // next stream offset to send on this stream
    std::atomic<uint64_t> recv_pos{0};  // next stream offset to receive on this stream
    std::atomic<bool> eof{false};       // the peer closed its side
  };
  uint64_t next_slice(uint64_t pos, int s) const;
  void set_error(const std::string& why);
  uint64_t min_send_pos() const;
  uint64_t min_recv_pos() const;

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

  std::atomic<bool> failed_{false};
  mutable std::mutex err_mu_;
  std::string error_;  // first failure, set once before failed_
};

}  // namespace loom
