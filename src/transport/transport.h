// Transports move byte streams between ranks. Every transport (shm, socket,
// ib, cuda_ipc) implements the same two classes, so the executor and the
// algorithms never know which one they run on.
//
// Stream contract: messages are delimited by the schedule (both sides know
// each message's size). Inside a message, partial pushes and partial reads are
// multiples of 8 bytes, so a reducer never sees a split element (element sizes
// divide 8); the transport pads each message to 8 bytes internally.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "kernels/host_reduce.h"
#include "loom/status.h"

namespace loom {

// Rings whose messages are padded to 8 bytes (the shm FIFO, the socket
// connection's send ring): positions and free space stay multiples of 8, so
// a message's next piece is the whole rest when its padded size fits in the
// `contig` bytes free before the wrap, else as many whole words as fit.
inline size_t round8(size_t n) { return (n + 7) & ~size_t{7}; }
struct RingPiece {
  size_t n = 0;    // bytes of the message to copy
  size_t adv = 0;  // bytes the ring's tail moves
};
inline RingPiece ring_piece(size_t msg_remaining, size_t contig) {
  if (round8(msg_remaining) <= contig) return {msg_remaining, round8(msg_remaining)};
  const size_t n = contig & ~size_t{7};
  return {n, n};
}

class Connection {
 public:
  virtual ~Connection() = default;
  // Pushes up to msg_remaining bytes of the current outgoing message; returns
  // how many were accepted (0 when the channel is full). Never blocks.
  virtual size_t send_some(const std::byte* src, size_t msg_remaining) = 0;
  // Starts and ends a message of head_len + body_len bytes made of two
  // pieces (the executor's fingerprint header and a small payload), whole or
  // not at all: returns head_len + body_len, or 0 when the channel cannot
  // take it whole now (try again). kNoGather: this transport does not do it
  // for such a message (then: copy the pieces into one buffer, send_some).
  // Saves the sender that copy. Called only between messages.
  static constexpr size_t kNoGather = SIZE_MAX;
  virtual size_t send_gather(const std::byte* /*head*/, size_t /*head_len*/, const std::byte* /*body*/,
                             size_t /*body_len*/) {
    return kNoGather;
  }
  // Contiguous received bytes of the current incoming message (at most
  // msg_remaining); empty when nothing has arrived. Never blocks.
  virtual std::span<const std::byte> recv_peek(size_t msg_remaining) = 0;
  // Releases the first n bytes returned by recv_peek.
  virtual void recv_consume(size_t n, size_t msg_remaining) = 0;
  // After a recv_peek that found nothing: a word in memory that reaches
  // `at_least` when bytes of the current incoming message arrive, so that an
  // idle executor can wait on one load instead of repeated whole polls.
  // {nullptr}: none (poll). Only a hint: a ready word means "poll now".
  struct Watch {
    const std::atomic<uint64_t>* word = nullptr;
    uint64_t at_least = 0;
  };
  virtual Watch recv_watch() const { return {}; }
  // The executor's hint before a send: true when this rank's current phase
  // only sends, so its thread is idle while the peer copies. A transport
  // may then let the receiver hand part of a single-copy message back for
  // the sender to write (shm: two cores copy one message). Default: unused.
  virtual void set_sender_idle(bool) {}
  // The class of the next message to start in each direction: whether its
  // receiver reduces it (Step::peer_reduces on the send side, a recv_reduce
  // on the receive side). Both ends set it before every attempt, so the two
  // agree; a transport may move the classes differently (shm: single copy
  // from a lower size for plain messages). Read only when a message starts.
  void set_send_reduced(bool reduced) { send_reduced_ = reduced; }
  void set_recv_reduced(bool reduced) { recv_reduced_ = reduced; }
  // Whether the next message to start may be read by its receiver in place
  // through a mapping of the sender's shared buffer (shm: Loom's scratch past
  // LOOM_SHM_MAP_MIN_BYTES); false keeps it in the FIFO. The sender alone
  // decides (the receiver learns it from the message's header), so the two
  // ends need not agree. Read only when a message starts.
  void set_send_mappable(bool mappable) { send_mappable_ = mappable; }
  // Step::announced of the next message to start in each direction (both
  // ends set it from their own steps, so they agree). Read only when a
  // message starts; transports without headers ignore it.
  void set_send_announced(bool announced) { send_announced_ = announced; }
  void set_recv_announced(bool announced) { recv_announced_ = announced; }
  // The executor's hint before a plain receive into host memory: the whole
  // message is large enough (LOOM_COPY_STREAM_BYTES) that recv_into's copies
  // out of the transport take streaming stores (kernels::stream_copy).
  void set_recv_stream(bool stream) { recv_stream_ = stream; }
  // Receives up to msg_remaining bytes of the current incoming message
  // straight into dst and returns how many; 0 when nothing has arrived.
  // Transports with a single-copy path (shm + CMA) override it; the default
  // copies out of recv_peek.
  virtual size_t recv_into(std::byte* dst, size_t msg_remaining) {
    size_t done = 0;
    while (done < msg_remaining) {
      auto span = recv_peek(msg_remaining - done);
      if (span.empty()) break;
      if (recv_stream_) kernels::stream_copy(dst + done, span.data(), span.size());
      else std::memcpy(dst + done, span.data(), span.size());
      recv_consume(span.size(), msg_remaining - done);
      done += span.size();
    }
    return done;
  }

 protected:
  bool send_reduced_ = false;
  bool send_mappable_ = true;
  bool send_announced_ = false;
  bool recv_announced_ = false;
  bool recv_reduced_ = false;
  bool recv_stream_ = false;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // The connection to peer, or nullptr when this transport does not reach it.
  virtual Connection* connection(int peer) = 0;
  // A counter bumped whenever a peer pushes data to us or frees space we wait
  // for, while we are armed. To sleep: arm_wait(), then read events(), poll
  // everything once more, and only if nothing moved wait_events(seen);
  // disarm_wait() after waking (or when the poll moved something). Unarmed,
  // a transport may skip the bump for data events (shm does: an atomic
  // increment per message costs a cache-line round trip).
  virtual uint32_t events() = 0;
  virtual void wait_events(uint32_t seen, std::chrono::microseconds timeout) = 0;
  virtual void arm_wait() {}
  virtual void disarm_wait() {}
  // Held doorbells: from hold_doorbells() on, the wake-ups that sends and
  // receives owe to sleeping peers (wait_events) wait for ring_owed() or
  // release_doorbells(), which pay them all at once. A write then does not
  // stall until its cache line has reached this core (the doorbell check
  // needs a full fence after it): the line moves while the rank goes on.
  // The holder must call ring_owed() before it waits or works long, so a
  // sleeping peer's wake-up is late by no more than that (the executor:
  // from a phase's second idle poll on, before overlapped copies, and at
  // the end of every phase).
  virtual void hold_doorbells() {}
  virtual void ring_owed() {}
  virtual void release_doorbells() {}
  // Non-ok if the peer's process died or it announced an abort. A peer that
  // destroyed its communicator (orderly close, announced by every transport's
  // destructor after its last send) is ok as long as this rank waits for
  // nothing beyond what it sent; any thread may call it.
  virtual Status check_peer(int peer) = 0;
  // Tells every peer this rank failed, with the reason (they fail fast).
  virtual void announce_abort(const std::string& reason) = 0;
  // Wakes this rank's own waiting engine (used by abort()).
  virtual void wake_self() = 0;
};

}  // namespace loom
