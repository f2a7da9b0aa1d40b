// LOOM_ALGO: the user's algorithm override.
//
// Grammar (whitespace around tokens is ignored, names are case-insensitive):
//   spec  := entry (';' entry)* [';']
//   entry := collective ':' item (',' item)*
//   item  := [range ':'] algorithm
//   range := [size] '-' [size]          half-open [lo, hi); missing lo = 0, missing hi = no limit
//   size  := digits [K|M|G|T] [B|iB]   binary units: 64K = 65536 bytes
// Example: "allreduce:0-64K:hypercube,64K-:ring;broadcast:tree".
// Errors name the column (1-based) and the offending token; algorithms must
// be known to the cost model for that collective (see cost_model.h), and the
// ranges of one collective must not overlap.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/status.h"
#include "loom/types.h"
#include "topology/cost_model.h"

namespace loom::topo {

struct AlgoRule {
  Collective coll = Collective::kAllReduce;
  uint64_t lo = 0;
  uint64_t hi = UINT64_MAX;  // exclusive; UINT64_MAX = no upper limit
  AlgoKind algo = AlgoKind::kRing;
};

struct AlgoOverride {
  std::vector<AlgoRule> rules;
  bool empty() const { return rules.empty(); }
  // The forced algorithm for this call, if a rule covers it.
  std::optional<AlgoKind> lookup(Collective coll, uint64_t bytes) const;
  // Canonical text, e.g. "allreduce:0-64K:hypercube,64K-:ring;broadcast:tree".
  std::string to_string() const;
};

Result<AlgoOverride> parse_algo_override(std::string_view spec);
// "64K" / "1M" / "65536" -> bytes.
Result<uint64_t> parse_size(std::string_view s);
std::string format_size(uint64_t bytes);  // 65536 -> "64K", 1000 -> "1000"

}  // namespace loom::topo
