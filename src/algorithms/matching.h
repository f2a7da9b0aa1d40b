// The message-matching rules of schedule.h, without data: what a send puts
// on the wire besides its bytes, and whether a receive may take a message.
//
// Shared by the in-memory interpreter (interpreter.cc, which also moves the
// data) and the simulator's structural check (tools/sim), so that a schedule
// the one accepts the other accepts too, with the same words for the same
// fault. The queue discipline itself (the k-th send from a to b pairs with
// the k-th receive at b from a) is each caller's: the interpreter keeps the
// data of every message, the simulator only these tags.
#pragma once

#include <cstddef>

#include "algorithms/schedule.h"

namespace loom {

// What the receiver learns of a message besides its bytes, and where it
// came from (for the error that names both ends).
struct MessageTag {
  size_t count = 0;
  size_t phase = 0;  // the sender's phase
  bool peer_reduces = false;
  bool announced = false;
};

inline MessageTag message_tag(const Step& send, size_t phase) {
  return MessageTag{send.count, phase, send.peer_reduces, send.announced};
}

// Ok when the transfer step `s` of `rank` (in its phase `phase`) names a
// peer in [0, nranks) other than itself; the error names the step.
Status check_peer(int rank, size_t phase, const Step& s, int nranks);

// Ok when the receive `recv` of `rank` (its phase `phase`) may take the
// message `m` sent by recv.peer: the same element count and, for messages
// with elements, the same class (peer_reduces against kRecvReduce) and the
// same Step::announced. The error names the receive and the sender's phase.
Status check_receive(int rank, size_t phase, const Step& recv, const MessageTag& m);

}  // namespace loom
