#include "algorithms/matching.h"

#include <fmt/format.h>

namespace loom {

Status check_peer(int rank, size_t phase, const Step& s, int nranks) {
  if (s.peer < 0 || s.peer >= nranks || s.peer == rank)
    return internal_error(fmt::format("rank {} phase {}: bad peer in '{}'", rank, phase, describe(s)));
  return Status::ok();
}

Status check_receive(int rank, size_t phase, const Step& s, const MessageTag& m) {
  if (m.count != s.count)
    return internal_error(fmt::format("rank {} phase {}: '{}' matched a message of {} elements sent by rank {} in its phase {}",
                                      rank, phase, describe(s), m.count, s.peer, m.phase));
  // The transport picks the message's path from this flag on the send
  // side and from the step kind on the receive side: they must agree.
  if (m.peer_reduces != (s.kind == StepKind::kRecvReduce) && s.count > 0)
    return internal_error(fmt::format("rank {} phase {}: '{}' matched a send of rank {} (its phase {}) {} marked peer_reduces",
                                      rank, phase, describe(s), s.peer, m.phase, m.peer_reduces ? "wrongly" : "not"));
  // The same for Step::announced (shm: the header threshold).
  if (m.announced != s.announced && s.count > 0)
    return internal_error(fmt::format(
        "rank {} phase {}: '{}' matched a send of rank {} (its phase {}) {}", rank, phase, describe(s), s.peer, m.phase,
        m.announced ? "marked announced, the receive not" : "not marked announced, the receive is"));
  return Status::ok();
}

}  // namespace loom
