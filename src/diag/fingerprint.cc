#include "diag/fingerprint.h"

#include <fmt/format.h>

#include <cstddef>
#include <cstring>

namespace loom::diag {
namespace {

constexpr uint32_t kMagic = 0x50464d4cu;  // "LMFP"
constexpr uint8_t kVersion = 1;

// Wire layout (little endian, 32 bytes):
//   0 magic u32 | 4 version u8 | 5 coll u8 | 6 dtype u8 | 7 redop u8
//   8 collective sequence u64 | 16 count u64 | 24 root or destination i32
//  28 sender's op sequence (low 32 bits) u32
struct Wire {
  uint32_t magic;
  uint8_t version, coll, dt, op;
  uint64_t coll_seq;
  uint64_t count;
  int32_t root;
  uint32_t seq;
};
static_assert(sizeof(Wire) == kFingerprintBytes);
static_assert(offsetof(Wire, seq) == kFingerprintBytes - 4, "check() compares everything before the op sequence");

bool uses_op(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduce || c == Collective::kReduceScatter;
}
bool uses_root(Collective c) { return c == Collective::kBroadcast || c == Collective::kReduce; }

// A send/recv header's op byte: 1 when its group mixed types and its count is
// in bytes (CollArgs::p2p_bytes), 0 otherwise.
constexpr uint8_t kP2pInBytes = 1;
// A send/recv message's size in bytes, and its call as a message names it.
size_t p2p_bytes_of(size_t count, uint8_t dt, bool in_bytes) {
  return in_bytes ? count : count * dtype_size(static_cast<DataType>(dt));
}

}  // namespace

const char* short_dtype_name(DataType dt) {
  switch (dt) {
    case DataType::kFloat16: return "fp16";
    case DataType::kFloat32: return "fp32";
    case DataType::kFloat64: return "fp64";
    case DataType::kBfloat16: return "bf16";
    default: return dtype_name(dt);
  }
}

std::string describe_call(Collective coll, size_t count, DataType dt, RedOp op, int root) {
  std::string args;
  if (uses_op(coll)) args += fmt::format("{}, ", redop_name(op));
  if (uses_root(coll)) args += fmt::format("root={}, ", root);
  return fmt::format("{}({}{} x {})", collective_name(coll), args, count, short_dtype_name(dt));
}

void Fingerprint::set(const CollArgs* args, uint64_t seq, uint64_t coll_seq) {
  args_ = args;
  seq_ = seq;
  coll_seq_ = coll_seq;
  if (args->coll == Collective::kSendRecv) return;
  // Fields the collective ignores are sent as 0, so that matching calls
  // send identical headers (a broadcast's reduction op may differ by rank).
  Wire w{};
  w.magic = kMagic;
  w.version = kVersion;
  w.coll = static_cast<uint8_t>(args->coll);
  w.dt = static_cast<uint8_t>(args->dt);
  w.op = uses_op(args->coll) ? static_cast<uint8_t>(args->op) : 0;
  w.coll_seq = coll_seq;
  w.count = args->count;
  w.root = uses_root(args->coll) ? args->root : 0;
  w.seq = static_cast<uint32_t>(seq);
  std::memcpy(header_, &w, sizeof(w));
}

void Fingerprint::encode_p2p(int peer, size_t step_count, std::byte* out) const {
  const CollArgs& a = *args_;
  Wire w{};
  w.magic = kMagic;
  w.version = kVersion;
  w.coll = static_cast<uint8_t>(a.coll);
  w.dt = static_cast<uint8_t>(a.dt);
  w.op = a.p2p_bytes ? kP2pInBytes : 0;
  w.count = step_count;
  w.root = peer;
  w.seq = static_cast<uint32_t>(seq_);
  std::memcpy(out, &w, sizeof(w));
}

std::string Fingerprint::describe_mine(int peer, size_t step_count, bool as_sender) const {
  const CollArgs& a = *args_;
  if (a.coll == Collective::kSendRecv && a.p2p_bytes)
    return fmt::format("{}({} B {} rank {})", as_sender ? "send" : "recv", step_count, as_sender ? "to" : "from", peer);
  if (a.coll == Collective::kSendRecv)
    return fmt::format("{}({} x {} {} rank {})", as_sender ? "send" : "recv", step_count, short_dtype_name(a.dt),
                       as_sender ? "to" : "from", peer);
  return describe_call(a.coll, a.count, a.dt, a.op, a.root);
}

Status Fingerprint::check_slow(int peer, size_t step_count, const std::byte* in) const {
  const CollArgs& a = *args_;
  Wire w;
  std::memcpy(&w, in, sizeof(w));
  const int me = a.rank;
  // Send/recv whose group mixed types on either end: the same bytes will do
  // (the types are compared when neither end mixed).
  const bool p2p_in_bytes = a.coll == Collective::kSendRecv && (a.p2p_bytes || w.op == kP2pInBytes);
  const bool same_bytes = p2p_in_bytes && w.dt < kNumDataTypes &&
                          p2p_bytes_of(w.count, w.dt, w.op == kP2pInBytes) ==
                              p2p_bytes_of(step_count, static_cast<uint8_t>(a.dt), a.p2p_bytes);
  if (w.magic == kMagic && w.version == kVersion && w.coll == static_cast<uint8_t>(a.coll) && same_bytes &&
      w.root == me)
    return Status::ok();
  // Fast path first: no formatting unless the calls differ.
  if (w.magic == kMagic && w.version == kVersion && w.coll == static_cast<uint8_t>(a.coll) &&
      w.dt == static_cast<uint8_t>(a.dt) && !p2p_in_bytes) {
    if (a.coll == Collective::kSendRecv) {
      if (w.count == step_count && w.root == me) return Status::ok();
    } else if (w.count == a.count && w.coll_seq == coll_seq_ && (!uses_op(a.coll) || w.op == static_cast<uint8_t>(a.op)) &&
               (!uses_root(a.coll) || w.root == a.root)) {
      return Status::ok();
    }
  }
  const std::string mine = describe_mine(peer, step_count, false);
  if (w.magic != kMagic || w.version != kVersion || w.coll >= kNumCollectives || w.dt >= kNumDataTypes ||
      w.op >= kNumRedOps)
    return invalid_usage(fmt::format(
        "mismatched operations: the stream from rank {} is out of step at op #{} (expected an operation header, "
        "got data): rank {} exchanged a different number of messages with rank {} in an earlier or this op "
        "than rank {} called {} expects",
        peer, seq_, peer, me, me, mine));
  const auto coll = static_cast<Collective>(w.coll);
  const auto dt = static_cast<DataType>(w.dt);
  const auto op = static_cast<RedOp>(w.op);
  std::string theirs;
  if (coll == Collective::kSendRecv && w.op == kP2pInBytes)
    theirs = fmt::format("send({} B to rank {})", w.count, w.root);
  else if (coll == Collective::kSendRecv)
    theirs = fmt::format("send({} x {} to rank {})", w.count, short_dtype_name(dt), w.root);
  else
    theirs = describe_call(coll, w.count, dt, op, w.root);
  bool same = coll == a.coll && (dt == a.dt || p2p_in_bytes);
  if (same && coll == Collective::kSendRecv) {
    same = w.root == me && (p2p_in_bytes ? same_bytes : w.count == step_count);
  } else if (same) {
    same = w.count == a.count && w.coll_seq == coll_seq_ && (!uses_op(coll) || op == a.op) &&
           (!uses_root(coll) || w.root == a.root);
  }
  if (same) return Status::ok();
  std::string msg = fmt::format("mismatched operations: rank {} called {} as op #{} where rank {} called {}", peer,
                                theirs, w.seq, me, mine);
  if (coll != Collective::kSendRecv && a.coll != Collective::kSendRecv && w.coll_seq != coll_seq_)
    msg += fmt::format(" as op #{} (collective #{} vs #{}: a rank skipped or added a collective)", seq_, w.coll_seq,
                       coll_seq_);
  return invalid_usage(msg);
}

}  // namespace loom::diag
