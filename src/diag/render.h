// Human-readable rendering of the "loom-diag" state (live query "text" and
// loom-doctor's evidence lines).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

namespace loom::diag {

// "allreduce(sum, 4096 x fp32)" / "send(1024 x fp32 to rank 3)" from a recorder entry.
std::string render_op(const nlohmann::json& op);
// One comm's position: "in op #57 allreduce(...) for 2.1 s, phase 2/6, waiting on rank 3 (recv 0/16384 B)"
// or "idle since op #56 ... completed 3.0 s ago". `now_ns` is the snapshot time.
std::string render_position(const nlohmann::json& comm, int64_t now_ns);
std::string render_process(const nlohmann::json& proc);

}  // namespace loom::diag
