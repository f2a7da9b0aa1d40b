// In-band operation fingerprints.
//
// The first message of every operation from one rank to a given peer (every
// message of a send/recv operation) is
// preceded by a 32-byte header describing the operation (collective, count,
// dtype, op, root, collective sequence number; for send/recv the element count
// and the destination). The receiver consumes it before its own first receive
// from that peer in the same operation and compares it with its own call, so
// mismatched calls fail at once with a precise message instead of hanging or
// mixing data. No extra round trip: the header travels in the same stream,
// right before the data (32 bytes keep the stream 8-byte aligned).
//
// Both sides agree on where a header is because the rule depends only on the
// rank's own schedule: "first send to p in this op" pairs with "first receive
// from p in this op" whenever the two ranks run matching operations. Send/recv
// messages each carry one: the two ends of a message may group their calls
// differently (a group of sends met by receives in separate ops, or the
// reverse), so "first in this op" would not be the same message at both ends
// (Groups.SenderGroupsTwoMessagesReceiverDoesNot). When they
// do not, the receiver reads either a header of a different op (precise
// message) or data where a header should be (the magic check fails: "stream
// out of step"). A header sent to a peer whose op does not receive from us at
// all is read by that peer's next receive from us and reported then.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "algorithms/schedule.h"
#include "loom/status.h"

namespace loom::diag {

inline constexpr size_t kFingerprintBytes = 32;

// Short names used in mismatch messages: fp32, bf16, int8, ...
const char* short_dtype_name(DataType dt);

// "allreduce(sum, 4096 x fp32)", "broadcast(root=1, 4096 x fp32)",
// "send(1024 x fp32 to rank 3)".
std::string describe_call(Collective coll, size_t count, DataType dt, RedOp op, int root);

class Fingerprint {
 public:
  // `args` must outlive the op; rank = this rank. Also prepares this op's
  // collective header, so that encode and check cost a copy and a compare.
  void set(const CollArgs* args, uint64_t seq, uint64_t coll_seq);
  // Whether the header depends on the peer and message (send/recv); if
  // not, header() is every peer's.
  bool per_peer() const { return args_->coll == Collective::kSendRecv; }
  // This op's collective header (prepared by set; not for send/recv).
  const std::byte* header() const { return header_; }
  // Header for the first message of this op to `peer`; step_count = that
  // message's element count (compared for send/recv).
  void encode(int peer, size_t step_count, std::byte* out) const {
    if (args_->coll == Collective::kSendRecv) return encode_p2p(peer, step_count, out);
    std::memcpy(out, header_, kFingerprintBytes);
  }
  // Validates the header received from `peer` before the first receive of
  // step_count elements from it. Non-ok status names both calls.
  Status check(int peer, size_t step_count, const std::byte* in) const {
    // Matching collectives send the same header up to the sender's op
    // sequence (the last 4 bytes, informational): one compare.
    if (args_->coll != Collective::kSendRecv && std::memcmp(in, header_, kCompareBytes) == 0) return Status::ok();
    return check_slow(peer, step_count, in);
  }

 private:
  static constexpr size_t kCompareBytes = kFingerprintBytes - 4;
  void encode_p2p(int peer, size_t step_count, std::byte* out) const;
  Status check_slow(int peer, size_t step_count, const std::byte* in) const;
  std::string describe_mine(int peer, size_t step_count, bool as_sender) const;
  const CollArgs* args_ = nullptr;
  uint64_t seq_ = 0, coll_seq_ = 0;
  alignas(8) std::byte header_[kFingerprintBytes] = {};  // this op's collective header
};

}  // namespace loom::diag
