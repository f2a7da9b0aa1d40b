// A Schedule is data: per rank, an ordered list of phases of steps.
//
// Semantics (shared by the executor, the in-memory interpreter and the
// flight recorder):
// - Phases of one rank run in order.
// - Within a phase, local steps (kCopy, kReduce, kDivide) run first, in list
//   order; then all communication steps (kSend, kRecv, kRecvReduce) progress
//   concurrently and the phase ends when all are done.
// - Messages between an ordered pair of ranks are matched in order: the k-th
//   send from a to b (over all phases) pairs with the k-th receive at b from a,
//   and both must have the same element count.
// - Within a phase, no send may read memory that a receive of the same phase
//   writes (the interpreter checks this on resolved addresses).
// Offsets and counts are in elements of the operation's data type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/status.h"
#include "loom/types.h"

namespace loom {

// Buffer ids: 0 = the op's send buffer, 1 = its recv buffer, 2 = executor
// scratch, 3 + i = the i-th user buffer of a point-to-point group.
using BufId = uint32_t;
inline constexpr BufId kBufSend = 0;
inline constexpr BufId kBufRecv = 1;
inline constexpr BufId kBufScratch = 2;
inline constexpr BufId kBufUser = 3;

struct BufRef {
  BufId buf = kBufSend;
  size_t offset = 0;  // elements
};

enum class StepKind : uint8_t {
  kSend,        // send count elements from src to peer
  kRecv,        // receive count elements from peer into dst
  kRecvReduce,  // dst = src (local) OP incoming from peer (incoming OP src: Step::incoming_first)
  kCopy,        // dst = src (local)
  kReduce,      // dst = src OP src2 (local)
  kDivide,      // dst = dst / nranks (the final step of RedOp::kAvg)
};

struct Step {
  StepKind kind = StepKind::kCopy;
  int peer = -1;
  BufRef src;
  BufRef src2;
  BufRef dst;
  size_t count = 0;
  // Copies only: the executor may run this copy after posting the phase's
  // transfers instead of before, overlapping it with them (e.g. a broadcast
  // root's own send -> recv copy while the peers read its input). The
  // interpreter rejects an overlapped copy that writes what a transfer of the
  // phase touches or reads what a receive of the phase writes.
  bool overlap = false;
  // Sends only: the matching receive is a kRecvReduce. Both ends know the
  // message's class before its first byte (the receiver from its own step),
  // so a transport may move the two classes differently (shm: reduced
  // messages go single-copy only from a higher size). The interpreter
  // rejects a send whose flag disagrees with its receive.
  bool peer_reduces = false;
  // Receive-reduces only: the incoming partial is the left operand (dst =
  // incoming OP src). Partners that each reduce the other's message keep one
  // operand order on both sides (lower rank's partial first), so both
  // compute the same expression bit for bit (NaN payloads, max/min ties).
  bool incoming_first = false;
  // Sends only: the message stays in the transport's FIFO even from a buffer
  // the receiver could map and read in place (Connection::set_send_mappable).
  // A mapped send ends only once its reader has read it; a sender with its
  // own work left (the next op, when ranks share cores) then waits for a
  // reader that may itself be waiting for its turn on a core.
  bool unmapped = false;
  // Transfers only: the message is announced by a header from a lower size
  // than the transport's default (shm: the receiver's announced_min_bytes,
  // LOOM_SHM_ANNOUNCED_MIN_BYTES, instead of its hdr_min_bytes), so a
  // sender's scratch (mem_alloc memory) is
  // read in place through a mapping from there. The two ends pick a
  // message's path from their own steps, so a send and its receive carry the
  // same value (the interpreter checks it). Set where a sender stages a block
  // once for many readers (direct_all_gather with ranks sharing cores).
  bool announced = false;
  // Transfers only (diag): the op's first send to, or first receive from,
  // this peer (every send/recv transfer: mark_first_contacts); it carries
  // the op's in-band fingerprint (diag/fingerprint.h).
  // Set by mark_first_contacts, once per schedule, so the executor needs no
  // per-op bookkeeping of which peers it has already spoken to.
  bool first_contact = false;
};

inline bool is_comm_step(StepKind k) {
  return k == StepKind::kSend || k == StepKind::kRecv || k == StepKind::kRecvReduce;
}

struct Phase {
  std::vector<Step> steps;
};

struct RankSchedule {
  std::vector<Phase> phases;
  size_t scratch_count = 0;  // elements of scratch the executor must provide
  std::string algorithm;     // "ring", "chain", "direct", ... (for logs and the recorder)
  // Every message of the op moves as a reduced one (Step::peer_reduces), the
  // stored ones too: set by make_schedule where core/message_class.h says so
  // (the reducing collectives; a broadcast of more than 2 ranks). A transport
  // then picks one threshold for the whole op (shm: LOOM_SHM_SINGLE_COPY_BYTES,
  // not ..._PLAIN_BYTES). Both ends build the same op, so they agree on every
  // message's class.
  bool reduced_class = false;
  // Step::first_contact is set (mark_first_contacts). The executor refuses
  // to run an unmarked schedule with fingerprints on: both ends must agree
  // on which messages carry one.
  bool contacts_marked = false;
  // The op's only communication is one exchange with one peer: its first
  // phase holds a send and then a receive (plain or reducing) of the same
  // count, both first contacts, and nothing else; later phases hold local
  // steps only (the 2-rank allreduce: in place, a copy out of scratch).
  // Set by mark_first_contacts; the executor runs such an op on a short
  // path (Executor::run_exchange).
  bool single_exchange = false;
  // Every transfer is the only one to (or from) its peer in its direction,
  // so each carries the op's fingerprint, no phase holds more than
  // kShortPathMaxTransfers of them, and the op is not a single exchange:
  // the executor may run it on its short path when its messages are small
  // (Executor::run_short). Set by mark_first_contacts, with
  // max_transfer_count (elements of its largest transfer).
  bool short_path = false;
  size_t max_transfer_count = 0;
  static constexpr size_t kShortPathMaxTransfers = 64;
};

// Sets Step::first_contact on the first send to and the first receive from
// each peer, in the order the executor runs the steps (phase by phase, step
// by step; transfers of no elements send nothing and are skipped),
// contacts_marked and single_exchange. make_schedule calls it; a schedule
// built by hand calls it before it runs.
// every_message (send/recv): every transfer carries a fingerprint. Two
// ranks may group the messages between them differently (several sends in
// one group, their receives in separate ops, or the reverse), so a header
// per op and peer would sit before a different message at each end.
void mark_first_contacts(RankSchedule& s, bool every_message = false);

// A point-to-point operation inside a group (Collective::kSendRecv); its
// buffer is kBufUser + its index in CollArgs::p2p.
struct P2pOp {
  bool is_send = false;
  int peer = 0;
  size_t count = 0;  // elements of the group's dtype (bytes with CollArgs::p2p_bytes)
  // A send whose buffer overlaps a receive of the same group (in place, like
  // MPI_Sendrecv_replace): it is copied to scratch first, so the receive
  // cannot overwrite data the peer has not read yet.
  bool stage = false;
};

// What a schedule generator needs to know about one collective call on one rank.
struct CollArgs {
  Collective coll = Collective::kAllReduce;
  size_t count = 0;  // NCCL convention: per-rank count (see comm.h)
  DataType dt = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  int root = 0;
  int nranks = 1;
  int rank = 0;
  bool in_place = false;
  size_t chunk_elems = 0;  // pipelining chunk for chain algorithms; 0 = default
  std::vector<P2pOp> p2p;  // kSendRecv only
  // kSendRecv: the group mixed data types, so it travels in bytes (dt is
  // kUint8 and every count a byte count). NCCL lets a group's sends and
  // receives have their own types; a peer's matching call may not mix.
  bool p2p_bytes = false;
  // Host index of every rank (hierarchical algorithms); empty = unknown,
  // treated as one host.
  std::vector<int> host_of_rank;
  // More ranks on this host than cores (params::oversubscribed): the ranks
  // take turns on the cores. Every rank of a host sees the same value.
  bool oversubscribed = false;
  // From this many bytes a message announced by its steps (Step::announced)
  // from the sender's scratch is read in place through a mapping by a peer
  // on this host (shm with LOOM_SHM_MAP_SHARED on the receiver;
  // LOOM_SHM_ANNOUNCED_MIN_BYTES): a block staged once in scratch for many
  // readers then saves the sender a copy per reader. 0 = no shm (sockets).
  // The same on every rank (settings agreed at init).
  size_t stage_min_bytes = 0;
  // The host's last-level cache where stage_min_bytes is set, over (ranks
  // per core)^2 (params::broadcast_cache_bytes): the direct broadcast
  // stages its root's buffer only once the op's data outgrows it
  // (stages_broadcast, message_class.h).
  size_t stage_cache_bytes = 0;
};

// Splits `count` elements into `parts` contiguous blocks whose sizes differ by
// at most one; returns the offset and size of block `i`.
inline size_t block_offset(size_t count, int parts, int i) {
  size_t base = count / parts, rem = count % parts;
  return base * i + (static_cast<size_t>(i) < rem ? i : rem);
}
inline size_t block_size(size_t count, int parts, int i) {
  return count / parts + (static_cast<size_t>(i) < count % parts ? 1 : 0);
}

std::string describe(const Step& s);  // "recv_reduce 1024 from 3 into recv+512", for logs and the recorder

}  // namespace loom
