// loom-doctor's analysis: from every rank's "loom-diag" state (dump files or
// a live gather) to a one-line verdict and its evidence.
//
// Verdict classes (docs/troubleshooting.md shows each):
//   MISSING_RANK, COLLECTIVE_MISMATCH, ARGUMENT_MISMATCH, SENDRECV_MISMATCH,
//   RANK_DIED, LINK_DOWN, STRAGGLER, STUCK_IN_USER_CODE, P2P_DEADLOCK,
//   CROSS_COMM_DEADLOCK, plus HANG (stuck, cause not classified),
//   PROGRESSING (live: moving, no straggler), FAILED (an error of another
//   kind), NO_DATA, NO_VERDICT (the dumps contradict one another).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::diag {

struct Verdict {
  std::string cls;
  std::vector<int> ranks;  // the rank(s) named, in the communicator the verdict is about
  std::string summary;     // one line
  std::vector<std::string> evidence;
  std::string line() const { return cls + ": " + summary; }
  std::string to_text() const;
};

struct Snapshot {
  std::vector<nlohmann::json> processes;  // "loom-diag" objects
  std::vector<std::string> problems;      // unreadable dumps, unreachable ranks, ...
};

// Reads every *.json file of dir; corrupt, truncated, foreign or missing
// dumps become problems (and the rest is still analysed).
Snapshot load_dumps(const std::string& dir);
// From a "loom-diag-gather" answer.
Snapshot from_gather(const nlohmann::json& gather);

// `earlier` (optional, may be empty) is a snapshot taken a few seconds before
// `now` (live status): it tells stuck from slow.
Verdict analyze(const Snapshot& now, const Snapshot* earlier = nullptr);

}  // namespace loom::diag
