#include "diag/analyze.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "diag/hub.h"
#include "diag/render.h"

namespace loom::diag {
namespace {

using nlohmann::json;

struct Member {
  int rank = -1;
  const json* proc = nullptr;
  const json* comm = nullptr;
};

struct CommView {
  std::string id, name;
  int nranks = 0;
  std::map<int, Member> members;
  json peers = json::array();  // rank -> {pid, host, diag}
};

std::string proc_key(const json& p) { return p.value("host", "?") + ":" + std::to_string(p.value("pid", 0)); }
std::string peer_key(const json& peer) { return peer.value("host", "?") + ":" + std::to_string(peer.value("pid", 0)); }

std::string join_ranks(const std::vector<int>& r) {
  std::string s;
  for (size_t i = 0; i < r.size(); ++i) s += (i ? (i + 1 == r.size() ? " and " : ", ") : "") + std::to_string(r[i]);
  return s;
}
std::string ranks_word(const std::vector<int>& r) { return (r.size() == 1 ? "rank " : "ranks ") + join_ranks(r); }

bool in_op(const Member& m) { return m.comm->contains("current") && (*m.comm)["current"].is_object(); }
const json& cur(const Member& m) { return (*m.comm)["current"]; }
json cur_op(const Member& m) { return in_op(m) ? cur(m).value("op", json::object()) : json::object(); }

// The step the rank is blocked on: first unfinished one.
json blocked_step(const Member& m) {
  if (!in_op(m)) return json();
  for (const auto& s : cur(m).value("steps", json::array()))
    if (s.value("done", 0) < s.value("total", 0)) return s;
  int wp = cur(m).value("waiting_peer", -1);
  if (wp >= 0) return json{{"peer", wp}, {"kind", "?"}, {"done", 0}, {"total", 0}};
  return json();
}

const json* last_op(const Member& m) {
  const auto& ops = (*m.comm)["ops"];
  return (ops.is_array() && !ops.empty()) ? &ops.back() : nullptr;
}

std::map<std::string, CommView> build_views(const Snapshot& s) {
  std::map<std::string, CommView> views;
  for (const auto& p : s.processes) {
    if (!p.contains("comms") || !p["comms"].is_array()) continue;
    for (const auto& c : p["comms"]) {  // by reference: members point into s
      if (!c.is_object()) continue;
      CommView& v = views[c.value("id", "?")];
      v.id = c.value("id", "?");
      v.name = c.value("name", "?");
      v.nranks = c.value("nranks", 0);
      if (v.peers.empty()) v.peers = c.value("peers", json::array());
      int r = c.value("rank", -1);
      v.members[r] = Member{r, &p, &c};
    }
  }
  return views;
}

std::string who(const CommView& v, int rank) {
  for (const auto& p : v.peers)
    if (p.value("rank", -1) == rank)
      return fmt::format("rank {} (pid {} on {})", rank, p.value("pid", 0), p.value("host", "?"));
  return fmt::format("rank {}", rank);
}

void add_positions(Verdict& v, const Snapshot& s) {
  for (const auto& [id, view] : build_views(s)) {
    for (const auto& [r, m] : view.members)
      v.evidence.push_back(fmt::format("'{}' rank {}/{}: {}{}", view.name, r, view.nranks,
                                       render_position(*m.comm, m.proc->value("time_ns", int64_t{0})),
                                       m.comm->value("status", "ok") == "ok" ? "" : " [failed]"));
    for (int r = 0; r < view.nranks; ++r)
      if (!view.members.count(r)) v.evidence.push_back(fmt::format("'{}' {}: no state (no dump / unreachable)", view.name, who(view, r)));
  }
  for (const auto& p : s.problems) v.evidence.push_back("problem: " + p);
}

// ---- classification from errors -------------------------------------------

std::vector<std::pair<std::string, int>> all_errors(const Snapshot& s) {  // (message, rank)
  std::vector<std::pair<std::string, int>> out;
  for (const auto& p : s.processes)
    for (const auto& c : p.value("comms", json::array()))
      if (c.is_object() && c.contains("error")) out.emplace_back(c.value("error", ""), c.value("rank", -1));
  return out;
}

bool from_positions(const Snapshot& s, Verdict* v);

bool from_mismatch(const Snapshot& s, Verdict* v) {
  static const std::regex called(R"(rank (\d+) called ([a-z_]+)\((.*?)\) as op #(\d+) where rank (\d+) called ([a-z_]+)\()");
  static const std::regex out_of_step(R"(stream from rank (\d+) is out of step at op #(\d+).*rank (\d+) called)");
  for (const auto& [msg, rank] : all_errors(s)) {
    size_t pos = msg.rfind("mismatched operations: ");
    if (pos == std::string::npos) continue;
    std::string text = msg.substr(pos + 23);
    std::smatch m;
    if (std::regex_search(text, m, called)) {
      int a = std::stoi(m[1]), b = std::stoi(m[5]);
      std::string ca = m[2], cb = m[6];
      bool p2p = ca == "send" || ca == "recv" || cb == "send" || cb == "recv";
      v->cls = p2p ? "SENDRECV_MISMATCH" : (ca != cb ? "COLLECTIVE_MISMATCH" : "ARGUMENT_MISMATCH");
      v->ranks = {std::min(a, b), std::max(a, b)};
      v->summary = text;
    } else if (std::regex_search(text, m, out_of_step)) {
      // The stream went out of step: the two ranks' ops exchange messages
      // differently, e.g. the same allreduce with other counts, for which
      // the tuner chose other algorithms. The ranks' recorded calls say
      // what differs, when the dumps have them (regression: an argument
      // mismatch was called a collective mismatch whenever the counts led
      // to different algorithms; DoctorCases.DifferentArguments, now and
      // then under CI).
      Verdict calls;
      if (from_positions(s, &calls) && calls.cls.find("_MISMATCH") != std::string::npos) {
        v->cls = calls.cls;
        v->ranks = calls.ranks;
        v->summary = calls.summary + " (" + text + ")";
      } else {
        v->cls = "COLLECTIVE_MISMATCH";
        v->ranks = {std::min(std::stoi(m[1]), std::stoi(m[3])), std::max(std::stoi(m[1]), std::stoi(m[3]))};
        v->summary = text;
      }
    } else {
      continue;
    }
    v->evidence.push_back(fmt::format("reported by rank {}: {}", rank, msg));
    return true;
  }
  return false;
}

// The peer an error names: the last "rank N" before `pos` (where errno's
// text starts), other than the reporting rank; -1 if none.
int peer_named_before(const std::string& msg, size_t pos, int self) {
  static const std::regex rank_re(R"(rank (\d+))");
  int peer = -1;
  const std::string head = msg.substr(0, pos);
  for (auto it = std::sregex_iterator(head.begin(), head.end(), rank_re); it != std::sregex_iterator(); ++it)
    if (std::stoi((*it)[1]) != self) peer = std::stoi((*it)[1]);
  return peer;
}

bool from_death(const Snapshot& s, Verdict* v) {
  static const std::regex died(R"(rank (\d+) \(pid (\d+) on ([^)]+)\) died)");
  for (const auto& [id, view] : build_views(s))
    for (const auto& [r, m] : view.members) {
      std::string msg = m.comm->value("error", "");
      std::smatch mm;
      if (!std::regex_search(msg, mm, died)) continue;
      int dead = std::stoi(mm[1]);
      // A rank with state of its own exited after writing it (its program
      // gave up after another failure): not the cause.
      if (view.members.count(dead)) continue;
      std::string last = "unknown";
      if (in_op(m)) last = fmt::format("op #{} {}", cur(m).value("seq", 0), render_op(cur_op(m)));
      v->cls = "RANK_DIED";
      v->ranks = {dead};
      v->summary = fmt::format("rank {} (pid {} on {}) of '{}' died; its last op: {} (the op its peers were in)", dead,
                               mm[2].str(), mm[3].str(), view.name, last);
      v->evidence.push_back(fmt::format("reported by rank {}: {}", r, msg));
      if (!view.members.count(dead)) v->evidence.push_back(fmt::format("no state from rank {}: its process is gone", dead));
      return true;
    }
  // The socket transport does not see a death, only a connection the peer's
  // kernel closed or reset: a peer named so that left no state of its own
  // is gone too. Regression: this was a HANG naming a rank still alive.
  static const std::regex lost(R"(closed the connection|connection reset|broken pipe)", std::regex::icase);
  for (const auto& [id, view] : build_views(s))
    for (const auto& [r, m] : view.members) {
      std::string msg = m.comm->value("error", "");
      std::smatch mm;
      if (!std::regex_search(msg, mm, lost)) continue;
      const int peer = peer_named_before(msg, static_cast<size_t>(mm.position(0)), r);
      if (peer < 0 || peer >= view.nranks || view.members.count(peer)) continue;
      std::string last = "unknown";
      if (in_op(m)) last = fmt::format("op #{} {}", cur(m).value("seq", 0), render_op(cur_op(m)));
      v->cls = "RANK_DIED";
      v->ranks = {peer};
      v->summary = fmt::format("{} of '{}' is gone: its connection to rank {} closed and it left no state (killed, "
                               "crashed or exited); the op its peers were in: {}", who(view, peer), view.name, r, last);
      v->evidence.push_back(fmt::format("reported by rank {}: {}", r, msg));
      v->evidence.push_back(fmt::format("no state from rank {}: its process is gone (or its host unreachable)", peer));
      return true;
    }
  return false;
}

// ---- hosts and cut links ----------------------------------------------------

// The bootstrap address without its port.
std::string ip_of(const std::string& addr) {
  size_t colon = addr.rfind(':');
  std::string ip = colon == std::string::npos ? addr : addr.substr(0, colon);
  if (ip.size() > 2 && ip.front() == '[' && ip.back() == ']') ip = ip.substr(1, ip.size() - 2);
  return ip;
}

// Which host each rank of the view is on: the host hash the bootstrap
// exchanged (schema 2), else the hostname (schema 1: ranks in network
// namespaces of one machine then look like one host).
std::map<int, std::string> host_keys(const CommView& v) {
  std::map<int, std::string> out;
  for (const auto& p : v.peers) {
    std::string h = p.value("host_hash", "");
    out[p.value("rank", -1)] = h.empty() ? "name:" + p.value("host", "?") : h;
  }
  return out;
}

// A host's name for people: the host id its processes report (LOOM_HOST_ID
// or the hostname), else the hostname and address from the peer table.
std::string host_label(const CommView& v, const std::map<int, std::string>& keys, const std::string& key) {
  for (const auto& [r, m] : v.members)
    if (keys.count(r) && keys.at(r) == key) return m.proc->value("host_id", m.proc->value("host", "?"));
  for (const auto& p : v.peers)
    if (keys.count(p.value("rank", -1)) && keys.at(p.value("rank", -1)) == key)
      return fmt::format("{} [{}]", p.value("host", "?"), ip_of(p.value("addr", "?")));
  return key;
}

std::vector<int> ranks_on(const std::map<int, std::string>& keys, const std::string& key) {
  std::vector<int> out;
  for (const auto& [r, k] : keys)
    if (k == key) out.push_back(r);
  return out;
}

std::string host_desc(const CommView& v, const std::map<int, std::string>& keys, const std::string& key) {
  return fmt::format("host {} ({})", host_label(v, keys, key), ranks_word(ranks_on(keys, key)));
}

bool from_link(const Snapshot& s, Verdict* v) {
  // A connection error (the socket transport names the peer, then errno's
  // text) between ranks that both still have state (both alive, unlike
  // RANK_DIED) on different hosts.
  static const std::regex conn_err(R"(connection (reset|refused|closed|lost|timed out)|broken pipe|no route to host|unreachable)",
                                   std::regex::icase);
  for (const auto& [id, view] : build_views(s)) {
    const auto keys = host_keys(view);
    for (const auto& [r, m] : view.members) {
      std::string msg = m.comm->value("error", "");
      std::smatch mm;
      if (msg.find("died") != std::string::npos || !std::regex_search(msg, mm, conn_err)) continue;
      const int peer = peer_named_before(msg, static_cast<size_t>(mm.position(0)), r);
      if (peer < 0 || !view.members.count(peer)) continue;
      if (keys.count(r) && keys.count(peer) && keys.at(r) == keys.at(peer)) continue;  // not a network link
      const std::string ha = keys.count(r) ? host_label(view, keys, keys.at(r)) : m.proc->value("host", "?");
      const std::string hb = keys.count(peer) ? host_label(view, keys, keys.at(peer))
                                              : view.members.at(peer).proc->value("host", "?");
      v->cls = "LINK_DOWN";
      v->ranks = {std::min(r, peer), std::max(r, peer)};
      v->summary = fmt::format("the network link between host {} (rank {}) and host {} (rank {}) of '{}' is down: "
                               "the connection failed while both processes are alive", ha, r, hb, peer, view.name);
      v->evidence.push_back(fmt::format("reported by rank {}: {}", r, msg));
      return true;
    }
  }
  return false;
}

// A cut link that shows only as deadlines: every process of the communicator
// is alive (each wrote its state), all are in the same call, and the ranks of
// host A wait on ranks of host B while B's wait on A; inside a host, a rank
// waits only on a rank that (in the end) waits across hosts.
bool from_partition(const Snapshot& s, Verdict* v) {
  for (const auto& [id, c] : build_views(s)) {
    if (c.nranks < 2 || static_cast<int>(c.members.size()) != c.nranks) continue;
    const auto keys = host_keys(c);
    std::set<std::string> hosts;
    for (const auto& [r, k] : keys) hosts.insert(k);
    if (hosts.size() < 2 || static_cast<int>(keys.size()) != c.nranks) continue;
    // Same call everywhere (ranks on the far side of a cut may be one op
    // further: the sequence number may differ, the call may not).
    std::string call;
    bool agree = true;
    for (const auto& [r, m] : c.members) {
      if (!in_op(m)) agree = false;
      else if (call.empty()) call = render_op(cur_op(m));
      else agree = agree && render_op(cur_op(m)) == call;
    }
    if (!agree) continue;
    std::map<int, int> waits;
    std::map<int, json> steps;
    for (const auto& [r, m] : c.members) {
      json st = blocked_step(m);
      int p = st.is_object() ? st.value("peer", -1) : -1;
      if (p >= 0 && p < c.nranks && p != r) waits[r] = p, steps[r] = st;
    }
    // Each rank's chain of waits inside its host must leave the host.
    std::map<int, int> exit_of;
    bool chains = true;
    for (int r = 0; r < c.nranks && chains; ++r) {
      int x = r;
      for (int hops = 0; waits.count(x) && keys.at(waits[x]) == keys.at(x) && hops <= c.nranks; ++hops) x = waits[x];
      chains = waits.count(x) && keys.at(waits[x]) != keys.at(x);
      exit_of[r] = x;
    }
    if (!chains) continue;
    // Host pairs that wait on each other.
    std::map<std::pair<std::string, std::string>, std::vector<int>> cross;  // (from, to) -> waiting ranks
    for (auto [r, p] : waits)
      if (keys.at(r) != keys.at(p)) cross[{keys.at(r), keys.at(p)}].push_back(r);
    std::vector<std::pair<std::string, std::string>> cut;
    for (const auto& [k, rs] : cross)
      if (k.first < k.second && cross.count({k.second, k.first})) cut.push_back(k);
    if (cut.empty()) continue;

    uint64_t lo = UINT64_MAX, hi = 0;
    for (const auto& [r, m] : c.members) {
      lo = std::min<uint64_t>(lo, cur(m).value("seq", uint64_t{0}));
      hi = std::max<uint64_t>(hi, cur(m).value("seq", uint64_t{0}));
    }
    const std::string where = lo == hi ? fmt::format("op #{} {}", lo, call) : fmt::format("ops #{}-#{} {}", lo, hi, call);
    std::set<std::string> named;
    for (const auto& [a, b] : cut) named.insert(a), named.insert(b);
    // One host in every pair: that host is cut off from the others.
    std::string hub_host;
    if (cut.size() > 1)
      for (const auto& h : named) {
        bool in_all = true;
        for (const auto& [a, b] : cut) in_all = in_all && (a == h || b == h);
        if (in_all) hub_host = h;
      }
    v->cls = "LINK_DOWN";
    v->ranks.clear();
    for (const auto& h : named)
      for (int r : ranks_on(keys, h)) v->ranks.push_back(r);
    std::sort(v->ranks.begin(), v->ranks.end());
    std::string between;
    if (!hub_host.empty()) {
      std::vector<std::string> others;
      for (const auto& h : named)
        if (h != hub_host) others.push_back(host_desc(c, keys, h));
      std::string list;
      for (size_t i = 0; i < others.size(); ++i) list += (i ? (i + 1 == others.size() ? " and " : ", ") : "") + others[i];
      between = fmt::format("{} is cut off from {}", host_desc(c, keys, hub_host), list);
    } else {
      for (size_t i = 0; i < cut.size(); ++i)
        between += (i ? "; " : "") + fmt::format("the network link between {} and {} is cut", host_desc(c, keys, cut[i].first),
                                                 host_desc(c, keys, cut[i].second));
    }
    v->summary = fmt::format("in '{}', {}: in {} the ranks of each side wait on the other side, every process is "
                             "alive and the ranks within each host agree", c.name, between, where);
    // Evidence: who waits on whom across the cut, with bytes done.
    for (const auto& [k, rs] : cross)
      for (int r : rs) {
        const json& st = steps.at(r);
        int p = waits.at(r);
        std::string sent;
        // What the peer itself sent towards r (the socket took it; r got none of what it waits for).
        const json& pc = cur(c.members.at(p));
        for (const auto& ps : pc.value("steps", json::array()))
          if (ps.value("peer", -1) == r && ps.value("kind", "") == "send")
            sent = fmt::format("; rank {}, in op #{} phase {}/{}, sent {}/{} B to rank {}", p, pc.value("seq", 0),
                               pc.value("phase", 0) + 1, pc.value("nphases", 0), ps.value("done", 0),
                               ps.value("total", 0), r);
        v->evidence.push_back(fmt::format("across the cut: rank {} on {} waits on rank {} on {} ({} {}/{} B){}", r,
                                          host_label(c, keys, keys.at(r)), p, host_label(c, keys, keys.at(p)),
                                          st.value("kind", "?"), st.value("done", 0), st.value("total", 0), sent));
      }
    for (auto [r, p] : waits)
      if (keys.at(r) == keys.at(p))
        v->evidence.push_back(fmt::format("within host {}: rank {} waits on rank {} ({} {}/{} B), which waits across "
                                          "the cut through rank {}", host_label(c, keys, keys.at(r)), r, p,
                                          steps.at(r).value("kind", "?"), steps.at(r).value("done", 0),
                                          steps.at(r).value("total", 0), exit_of.at(r)));
    for (const auto& h : named) {
      std::string pids;
      for (int r : ranks_on(keys, h)) {
        const json& proc = *c.members.at(r).proc;
        const std::string reason = proc.value("reason", "?");
        const std::string why = reason.rfind("comm ", 0) == 0 ? "dumped on its own failure"
                                : reason.rfind("requested", 0) == 0 ? "dumped when a peer asked"
                                                                   : reason;
        pids += fmt::format("{}rank {} (pid {}, {})", pids.empty() ? "" : ", ", r, proc.value("pid", 0), why);
      }
      v->evidence.push_back(fmt::format("alive on host {} (state written by every process): {}", host_label(c, keys, h), pids));
    }
    for (const auto& [r, m] : c.members)
      if (m.comm->contains("error")) {
        v->evidence.push_back(fmt::format("first error (rank {}): {}", r, m.comm->value("error", "")));
        break;
      }
    return true;
  }
  return false;
}

// ---- classification from positions ----------------------------------------

std::string op_key(const json& op) {
  if (op.value("coll", "") == "sendrecv") return "sendrecv";
  return render_op(op) + "#" + std::to_string(op.value("coll_seq", 0));
}

bool p2p_has(const json& op, bool send, int peer) {
  for (const auto& p : op.value("p2p", json::array()))
    if (p.value("send", false) == send && p.value("peer", -1) == peer) return true;
  return false;
}

bool from_positions(const Snapshot& s, Verdict* v) {
  auto views = build_views(s);
  // Index processes -> (comm view, member) for cross-communicator questions.
  std::map<std::string, std::vector<std::pair<const CommView*, const Member*>>> by_proc;
  for (const auto& [id, view] : views)
    for (const auto& [r, m] : view.members) by_proc[proc_key(*m.proc)].push_back({&view, &m});

  const CommView* primary = nullptr;
  size_t best = 0;
  for (const auto& [id, view] : views) {
    size_t n = 0;
    for (const auto& [r, m] : view.members) n += in_op(m);
    if (n > best || (n == best && primary && n > 0 && view.nranks > primary->nranks)) {
      best = n;
      primary = &view;
    }
  }
  if (!primary) return false;
  const CommView& c = *primary;
  std::vector<int> inop, idle;
  for (const auto& [r, m] : c.members) (in_op(m) ? inop : idle).push_back(r);
  // Ranks may be one op (or more) apart: those that finished their part of
  // op #lo wait in the next one for the others. The hang is in op #lo;
  // ranks further on are compared by the op #lo they recorded.
  uint64_t lo = UINT64_MAX;
  for (int r : inop) lo = std::min<uint64_t>(lo, cur(c.members.at(r)).value("seq", uint64_t{0}));
  std::vector<int> behind, ahead;
  for (int r : inop) (cur(c.members.at(r)).value("seq", uint64_t{0}) == lo ? behind : ahead).push_back(r);
  const Member& first = c.members.at(behind.front());
  const std::string their_op = fmt::format("op #{} {}", lo, render_op(cur_op(first)));
  // Each rank's op #lo: the current one, or from the history of a rank
  // further on (absent when its ring no longer holds it).
  std::map<int, json> op_at_lo;
  for (int r : behind) op_at_lo[r] = cur_op(c.members.at(r));
  for (int r : ahead)
    for (const auto& o : c.members.at(r).comm->value("ops", json::array()))
      if (o.is_object() && o.value("seq", ~uint64_t{0}) == lo) op_at_lo[r] = o;

  // 1. Ops differ among the ranks (nobody's fingerprint got read).
  // Regression: ranks one op apart were called an argument mismatch.
  std::map<std::string, std::vector<int>> by_op;
  for (const auto& [r, op] : op_at_lo) by_op[op_key(op)].push_back(r);
  if (by_op.size() > 1) {
    std::vector<std::string> parts;
    bool same_coll = true, any_p2p = false;
    std::string coll0 = cur_op(first).value("coll", "");
    for (const auto& [k, rs] : by_op) {
      const json& op = op_at_lo.at(rs.front());
      same_coll = same_coll && op.value("coll", "") == coll0;
      any_p2p = any_p2p || op.value("coll", "") == "sendrecv";
      parts.push_back(fmt::format("{} called {} as op #{}", ranks_word(rs), render_op(op), op.value("seq", 0)));
    }
    v->cls = any_p2p ? "SENDRECV_MISMATCH" : (same_coll ? "ARGUMENT_MISMATCH" : "COLLECTIVE_MISMATCH");
    std::vector<int> minority = by_op.begin()->second;
    for (const auto& [k, rs] : by_op) if (rs.size() < minority.size()) minority = rs;
    v->ranks = minority;
    v->summary = fmt::format("ranks of '{}' called different operations: ", c.name);
    for (size_t i = 0; i < parts.size(); ++i) v->summary += (i ? "; " : "") + parts[i];
    return true;
  }

  // 2. Point-to-point: mismatched peers, then blocking cycles.
  if (cur_op(first).value("coll", "") == "sendrecv" && idle.empty()) {
    for (int r : inop) {
      json st = blocked_step(c.members.at(r));
      if (!st.is_object() || st.value("kind", "") != "send") continue;
      int p = st.value("peer", -1);
      if (!c.members.count(p) || !in_op(c.members.at(p))) continue;
      const Member& pm = c.members.at(p);
      if (p2p_has(cur_op(pm), false, r)) continue;  // p will receive it: just slow
      json pst = blocked_step(pm);
      if (pst.is_object() && pst.value("kind", "") != "send" && pst.value("peer", -1) != r) {
        v->cls = "SENDRECV_MISMATCH";
        v->ranks = {r, p};
        v->summary = fmt::format("rank {} sends {} B to rank {}, but rank {} receives from rank {} (op #{} on rank {}: {}; "
                                 "on rank {}: {})", r, st.value("total", 0), p, p, pst.value("peer", -1),
                                 cur(c.members.at(r)).value("seq", 0), r, render_op(cur_op(c.members.at(r))), p,
                                 render_op(cur_op(pm)));
        return true;
      }
    }
    for (int r : inop) {
      json st = blocked_step(c.members.at(r));
      if (!st.is_object()) continue;
      int p = st.value("peer", -1);
      if (!c.members.count(p) || !in_op(c.members.at(p)) || p <= r) continue;
      json pst = blocked_step(c.members.at(p));
      if (!pst.is_object() || pst.value("peer", -1) != r || pst.value("kind", "") != st.value("kind", "")) continue;
      const std::string kind = st.value("kind", "");
      v->cls = "P2P_DEADLOCK";
      v->ranks = {r, p};
      v->summary = fmt::format("ranks {} and {} of '{}' both block in {} {} each other: blocking send/recv in opposite "
                               "order without group_start/group_end", r, p, c.name, kind,
                               kind == "send" ? "to" : "from");
      v->evidence.push_back(fmt::format("rank {}: op #{} {}; rank {}: op #{} {}", r, cur(c.members.at(r)).value("seq", 0),
                                        render_op(cur_op(c.members.at(r))), p, cur(c.members.at(p)).value("seq", 0),
                                        render_op(cur_op(c.members.at(p)))));
      return true;
    }
  }

  // 3. Some ranks are not in the op the others wait in.
  for (int x : idle) {
    const Member& xm = c.members.at(x);
    // Elsewhere in Loom? (another communicator of the same process)
    for (const auto& [ov, om] : by_proc[proc_key(*xm.proc)]) {
      if (ov == &c || !in_op(*om)) continue;
      json st = blocked_step(*om);
      int q = st.is_object() ? st.value("peer", -1) : -1;
      std::string there = fmt::format("op #{} {} on '{}'{}", cur(*om).value("seq", 0), render_op(cur_op(*om)), ov->name,
                                      q >= 0 ? fmt::format(" waiting on its rank {}", q) : "");
      // Does that wait lead back to a rank blocked in this communicator?
      if (q >= 0)
        for (const auto& peer : ov->peers)
          if (peer.value("rank", -1) == q)
            for (int r : inop)
              if (c.members.at(r).proc && proc_key(*c.members.at(r).proc) == peer_key(peer)) {
                v->cls = "CROSS_COMM_DEADLOCK";
                v->ranks = {std::min(x, r), std::max(x, r)};
                v->summary = fmt::format("ranks {} and {} of '{}' wait on each other across communicators: rank {} is in "
                                         "{} on '{}', while rank {} is in {}", std::min(x, r), std::max(x, r), c.name, r,
                                         fmt::format("op #{} {}", cur(c.members.at(r)).value("seq", 0),
                                                     render_op(cur_op(c.members.at(r)))),
                                         c.name, x, there);
                return true;
              }
      v->cls = "MISSING_RANK";
      v->ranks = {x};
      v->summary = fmt::format("rank {} never called {} on '{}' (ranks {} wait in it); instead it is in {}", x, their_op,
                               c.name, join_ranks(inop), there);
      return true;
    }
  }
  if (!idle.empty()) {
    int x = idle.front();
    const Member& xm = c.members.at(x);
    const json* last = last_op(xm);
    int64_t t = xm.proc->value("time_ns", int64_t{0});
    std::string lastdesc = last ? fmt::format("op #{} {} ({}, {:.1f} s before this snapshot)", last->value("seq", 0),
                                              render_op(*last), last->value("state", "?"),
                                              (t - last->value("ended_ns", t)) / 1e9)
                                : std::string("no op at all");
    v->cls = "STUCK_IN_USER_CODE";
    v->ranks = idle;
    v->summary = fmt::format("{} of '{}' never entered {}: {} finished {} and is not in any Loom call (busy or "
                             "blocked in user code); {} wait", ranks_word(idle), c.name, their_op,
                             idle.size() == 1 ? "it" : "rank " + std::to_string(x), lastdesc, ranks_word(inop));
    return true;
  }

  // 4. Everyone is in the op (or past it): name the rank(s) most waited on
  // by the ranks still in it.
  std::map<int, int> waited;
  for (int r : behind) {
    json st = blocked_step(c.members.at(r));
    if (st.is_object() && st.value("peer", -1) >= 0) ++waited[st.value("peer", -1)];
  }
  int most = -1, n = 0;
  for (auto [p, k] : waited)
    if (k > n) most = p, n = k;
  v->cls = "HANG";
  v->ranks = most >= 0 ? std::vector<int>{most} : std::vector<int>{};
  v->summary = ahead.empty()
                   ? fmt::format("all ranks of '{}' are in {} and none moves", c.name, their_op)
                   : fmt::format("{} of '{}' are in {} and none moves; {} finished their part of it and wait in the "
                                 "next op", ranks_word(behind), c.name, their_op, ranks_word(ahead));
  if (most >= 0) v->summary += fmt::format("; most wait on rank {}", most);
  return true;
}

// ---- live: progress and stragglers -----------------------------------------

uint64_t progress_mark(const Snapshot& s, const std::string& key) {
  uint64_t best = 0;
  for (const auto& p : s.processes)
    for (const auto& c : p.value("comms", json::array()))
      if (c.is_object() && proc_key(p) + "/" + c.value("id", "") == key)
      {
        for (const auto& o : c.value("ops", json::array()))
          if (o.value("state", "") == "completed") best = std::max<uint64_t>(best, o.value("seq", uint64_t{0}) + 1);
        // The engine's own count, there even when no op is recorded
        // (LOOM_TRACE_BUFFER_SIZE=0). Regression: such a job, busy and
        // healthy, was called stuck.
        if (c.value("status", "ok") == "ok") best = std::max<uint64_t>(best, c.value("finished_seq", uint64_t{0}));
      }
  return best;
}

bool progressed(const Snapshot& now, const Snapshot& before) {
  for (const auto& p : now.processes)
    for (const auto& c : p.value("comms", json::array())) {
      std::string key = proc_key(p) + "/" + c.value("id", "");
      if (progress_mark(now, key) > progress_mark(before, key)) return true;
    }
  return false;
}

bool straggler(const Snapshot& s, Verdict* v) {
  for (const auto& [id, c] : build_views(s)) {
    if (c.members.size() < 2) continue;
    // coll_seq -> rank -> enqueue time, over completed collectives.
    std::map<uint64_t, std::map<int, int64_t>> joins;
    for (const auto& [r, m] : c.members)
      for (const auto& o : m.comm->value("ops", json::array()))
        if (o.value("coll", "") != "sendrecv" && o.value("state", "") == "completed")
          joins[o.value("coll_seq", uint64_t{0})][r] = o.value("enqueued_ns", int64_t{0});
    std::map<int, int> last_count;
    std::map<int, double> lag_sum;
    int ops = 0;
    for (const auto& [seq, t] : joins) {
      if (t.size() != c.members.size()) continue;
      ++ops;
      auto latest = std::max_element(t.begin(), t.end(), [](auto& a, auto& b) { return a.second < b.second; });
      std::vector<int64_t> others;
      for (const auto& [r, ts] : t) if (r != latest->first) others.push_back(ts);
      std::sort(others.begin(), others.end());
      ++last_count[latest->first];
      lag_sum[latest->first] += (latest->second - others[others.size() / 2]) / 1e6;
    }
    if (ops < 3) continue;
    for (auto [r, k] : last_count) {
      double mean = lag_sum[r] / k;
      if (k * 2 >= ops && mean >= 10.0) {
        v->cls = "STRAGGLER";
        v->ranks = {r};
        v->summary = fmt::format("rank {} of '{}' joins collectives {:.0f} ms after the others on average (last to "
                                 "join in {} of the last {} ops); the job progresses, the others wait for it",
                                 r, c.name, mean, k, ops);
        return true;
      }
    }
  }
  return false;
}

// Dumps of two runs in one directory (a job relaunched with the same
// LOOM_DIAG_DIR, the communicator id the same when the env secret is): the
// same rank of the same communicator appears in two processes. Only the
// newer process is kept, and the older one named. Regression: they were
// mixed silently, one overwriting the other's rank.
void drop_older_runs(Snapshot& s, const std::vector<std::string>& names) {
  std::map<std::pair<std::string, int>, size_t> owner;  // (comm id, rank) -> newest process
  std::set<size_t> dropped;
  for (size_t i = 0; i < s.processes.size(); ++i)
    for (const auto& c : s.processes[i].value("comms", json::array())) {
      if (!c.is_object()) continue;
      auto key = std::make_pair(c.value("id", std::string("?")), c.value("rank", -1));
      auto [it, fresh] = owner.emplace(key, i);
      if (fresh || it->second == i) continue;
      const json& a = s.processes[it->second];
      const json& b = s.processes[i];
      const bool b_newer = b.value("time_ns", int64_t{0}) > a.value("time_ns", int64_t{0});
      const size_t old_i = b_newer ? it->second : i, new_i = b_newer ? i : it->second;
      if (dropped.insert(old_i).second)
        s.problems.push_back(fmt::format(
            "{} and {} both hold '{}' rank {} (pids {} and {}): dumps of two runs in one directory? the older one, "
            "{}, is left out", names[old_i], names[new_i], c.value("name", "?"), key.second,
            s.processes[old_i].value("pid", 0), s.processes[new_i].value("pid", 0), names[old_i]));
      it->second = new_i;
    }
  if (dropped.empty()) return;
  std::vector<json> kept;
  for (size_t i = 0; i < s.processes.size(); ++i)
    if (!dropped.count(i)) kept.push_back(std::move(s.processes[i]));
  s.processes = std::move(kept);
}

}  // namespace

std::string Verdict::to_text() const {
  std::string out = line() + "\n";
  for (const auto& e : evidence) out += "  " + e + "\n";
  return out;
}

namespace {
Verdict analyze_or_throw(const Snapshot& now, const Snapshot* earlier);
}  // namespace

Snapshot load_dumps(const std::string& dir) {
  Snapshot s;
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".json" && e.is_regular_file()) files.push_back(e.path());
  if (ec) s.problems.push_back(fmt::format("cannot read directory {}: {}", dir, ec.message()));
  std::sort(files.begin(), files.end());
  std::vector<std::string> names;  // file of each process
  for (const auto& f : files) {
    std::ifstream in(f);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    const std::string name = f.filename().string();
    if (text.empty()) {
      s.problems.push_back(name + ": empty file (the rank died while writing?)");
      continue;
    }
    try {
      json j = json::parse(text);
      if (!j.is_object() || j.value("schema", "") != "loom-diag") {
        s.problems.push_back(name + ": not a loom-diag dump (ignored)");
        continue;
      }
      if (j.value("version", 0) < kOldestSchemaVersion || j.value("version", 0) > kSchemaVersion) {
        s.problems.push_back(fmt::format("{}: schema version {} (this doctor reads {} to {}; ignored)", name,
                                         j.value("version", 0), kOldestSchemaVersion, kSchemaVersion));
        continue;
      }
      if (!j.contains("comms") || !j["comms"].is_array()) {
        s.problems.push_back(name + ": no 'comms' array (ignored)");
        continue;
      }
      // Fields of the wrong type (a hand-edited or foreign file) throw
      // where the analysis reads them: try this file alone first, so it is
      // named as corrupt and the others are still analysed. Regression: the
      // doctor died with std::terminate on `"pid": "1000"`.
      {
        Snapshot alone;
        alone.processes.push_back(j);
        (void)analyze_or_throw(alone, nullptr);
      }
      s.processes.push_back(std::move(j));
      names.push_back(name);
    } catch (const json::exception& e) {
      bool truncated = std::string(e.what()).find("unexpected end of input") != std::string::npos;
      s.problems.push_back(fmt::format("{}: {} ({})", name, truncated ? "truncated" : "corrupt", e.what()));
    } catch (const std::exception& e) {
      // Well-formed JSON whose values the analysis cannot use (a rank
      // number beyond int in an error's text: std::stoi threw out_of_range).
      s.problems.push_back(fmt::format("{}: corrupt ({})", name, e.what()));
    }
  }
  drop_older_runs(s, names);
  // Ranks every communicator expects but no file covers.
  for (const auto& [id, view] : build_views(s))
    for (int r = 0; r < view.nranks; ++r)
      if (!view.members.count(r)) s.problems.push_back(fmt::format("no dump from '{}' {}", view.name, who(view, r)));
  if (files.empty()) s.problems.push_back("no *.json dump in " + dir);
  return s;
}

Snapshot from_gather(const json& g) {
  Snapshot s;
  for (const auto& p : g.value("processes", json::array()))
    if (p.is_object() && p.value("schema", "") == "loom-diag") s.processes.push_back(p);
  for (const auto& u : g.value("unreachable", json::array()))
    s.problems.push_back(fmt::format("'{}' rank {} at {} unreachable: {}", u.value("comm", "?"), u.value("rank", -1),
                                     u.value("addr", "?"), u.value("error", "?")));
  return s;
}

namespace {
Verdict analyze_or_throw(const Snapshot& now, const Snapshot* earlier) {
  Verdict v;
  if (now.processes.empty()) {
    v.cls = "NO_DATA";
    v.summary = "no readable rank state";
    add_positions(v, now);
    return v;
  }
  bool done = false;
  if (earlier && !earlier->processes.empty() && progressed(now, *earlier)) {
    done = straggler(now, &v);
    if (!done) {
      v.cls = "PROGRESSING";
      v.summary = "operations complete between the two snapshots: slow or busy, not stuck; no straggler stands out";
      done = true;
    }
  }
  if (!done) done = from_mismatch(now, &v) || from_death(now, &v) || from_link(now, &v) || from_partition(now, &v) ||
                from_positions(now, &v);
  if (!done) done = straggler(now, &v);
  if (!done) {
    auto errs = all_errors(now);
    v.cls = errs.empty() ? "IDLE" : "FAILED";
    v.summary = errs.empty() ? "no rank is inside an operation" : errs.front().first;
  }
  add_positions(v, now);
  return v;
}
}  // namespace

Verdict analyze(const Snapshot& now, const Snapshot* earlier) {
  try {
    return analyze_or_throw(now, earlier);
  } catch (const std::exception& e) {
    // Files that each read well but contradict one another (a communicator
    // of 2 ranks whose files name rank 5, ranks out of range in an error's
    // text): no verdict rather than a crash of the tool a user runs at 3 a.m.
    // Regression: std::terminate (map::at, stoi) and exit 134.
    Verdict v;
    v.cls = "NO_VERDICT";
    v.summary = std::string("the dumps contradict one another, no verdict (") + e.what() +
                "); the problems and files are listed below";
    for (const auto& p : now.problems) v.evidence.push_back(p);
    for (const auto& p : now.processes)
      if (p.is_object())
        v.evidence.push_back(fmt::format("process {} on {}", p.value("pid", nlohmann::json(-1)).dump(),
                                         p.value("host", nlohmann::json("?")).dump()));
    return v;
  }
}

}  // namespace loom::diag
