#include "diag/render.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "diag/fingerprint.h"

namespace loom::diag {
namespace {

std::string short_dtype(const std::string& name) {
  auto dt = parse_dtype(name);
  return dt ? short_dtype_name(*dt) : name;
}

double secs(int64_t ns) { return static_cast<double>(ns) / 1e9; }

}  // namespace

std::string render_op(const nlohmann::json& op) {
  const std::string coll = op.value("coll", "?");
  if (coll == "sendrecv") {
    std::string parts;
    for (const auto& p : op.value("p2p", nlohmann::json::array())) {
      if (!parts.empty()) parts += ", ";
      bool send = p.value("send", false);
      parts += fmt::format("{}({} x {} {} rank {})", send ? "send" : "recv", p.value("count", 0),
                           short_dtype(op.value("dtype", "?")), send ? "to" : "from", p.value("peer", -1));
    }
    if (op.value("p2p_total", 0) > 1) return "group{" + parts + "}";
    return parts.empty() ? "sendrecv()" : parts;
  }
  auto c = parse_collective(coll);
  auto dt = parse_dtype(op.value("dtype", ""));
  auto rop = parse_redop(op.value("op", "sum"));
  if (!c || !dt || !rop) return coll;
  return describe_call(*c, op.value("count", size_t{0}), *dt, *rop, op.value("root", 0));
}

std::string render_position(const nlohmann::json& comm, int64_t now_ns) {
  const auto& cur = comm.value("current", nlohmann::json());
  if (cur.is_object()) {
    std::string s = fmt::format("in op #{} {}", cur.value("seq", 0), render_op(cur.value("op", nlohmann::json::object())));
    int64_t started = cur.value("started_ns", int64_t{0});
    if (started) s += fmt::format(" for {:.1f} s", secs(now_ns - started));
    if (cur.value("nphases", 0) > 0)
      s += fmt::format(", phase {}/{}", cur.value("phase", 0) + 1, cur.value("nphases", 0));
    for (const auto& st : cur.value("steps", nlohmann::json::array())) {
      if (st.value("done", 0) >= st.value("total", 0)) continue;
      s += fmt::format(", waiting on rank {} ({} {}/{} B)", st.value("peer", -1), st.value("kind", "?"),
                       st.value("done", 0), st.value("total", 0));
      break;
    }
    return s;
  }
  const auto& ops = comm.value("ops", nlohmann::json::array());
  if (ops.empty()) return "idle, no operation yet";
  const auto& last = ops.back();
  int64_t ended = last.value("ended_ns", int64_t{0});
  return fmt::format("idle (in user code) since op #{} {} {} {:.1f} s ago", last.value("seq", 0), render_op(last),
                     last.value("state", "?"), ended ? secs(now_ns - ended) : 0.0);
}

std::string render_process(const nlohmann::json& proc) {
  const int64_t now = proc.value("time_ns", int64_t{0});
  std::string out = fmt::format("loom diag: host {} pid {} ({}), {} communicator(s)\n", proc.value("host", "?"),
                                proc.value("pid", 0), proc.value("reason", "?"),
                                proc.value("comms", nlohmann::json::array()).size());
  for (const auto& c : proc.value("comms", nlohmann::json::array())) {
    out += fmt::format("  comm '{}' rank {}/{}: {}\n", c.value("name", "?"), c.value("rank", -1), c.value("nranks", 0),
                       c.value("status", "ok") == "ok" ? std::string("ok") : "FAILED: " + c.value("error", ""));
    out += "    " + render_position(c, now) + "\n";
    const auto& ops = c.value("ops", nlohmann::json::array());
    size_t first = ops.size() > 5 ? ops.size() - 5 : 0;
    for (size_t i = first; i < ops.size(); ++i) {
      const auto& o = ops[i];
      int64_t enq = o.value("enqueued_ns", int64_t{0}), end = o.value("ended_ns", int64_t{0});
      out += fmt::format("    #{:<5} {:<40} {:<9} {:<6} enqueued {:.3f} s ago{}\n", o.value("seq", 0), render_op(o),
                         o.value("state", "?"), o.value("algo", ""), secs(now - enq),
                         end ? fmt::format(", took {:.1f} ms", static_cast<double>(end - o.value("started_ns", end)) / 1e6)
                             : "");
    }
  }
  return out;
}

}  // namespace loom::diag
