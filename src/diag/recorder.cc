#include "diag/recorder.h"

#include <time.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

namespace loom::diag {

const char* op_state_name(OpState s) {
  switch (s) {
    case OpState::kEnqueued: return "enqueued";
    case OpState::kStarted: return "started";
    case OpState::kCompleted: return "completed";
    case OpState::kFailed: return "failed";
  }
  return "unknown";
}

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

FlightRecorder::FlightRecorder(size_t capacity)
    : cap_(capacity), entries_(capacity ? new Entry[capacity] : nullptr) {}

int64_t FlightRecorder::on_enqueue(uint64_t seq, uint64_t coll_seq, const CollArgs& a) {
  const int64_t now = now_ns();
  if (!cap_) return now;
  constexpr auto r = std::memory_order_relaxed;
  Entry& e = slot(seq);
  e.seq.store(~0ull, r);  // readers skip the slot while it is rewritten
  e.coll_seq.store(coll_seq, r);
  e.coll.store(static_cast<int>(a.coll), r);
  e.dt.store(static_cast<int>(a.dt), r);
  e.op.store(static_cast<int>(a.op), r);
  e.root.store(a.root, r);
  e.count.store(a.count, r);
  const int np = static_cast<int>(std::min<size_t>(a.p2p.size(), kMaxP2p));
  for (int i = 0; i < np; ++i) {
    const P2pOp& p = a.p2p[i];
    int64_t c = static_cast<int64_t>(std::min<size_t>(p.count, 0x7fffffff));
    e.p2p[i].store((static_cast<int64_t>(p.peer) << 1 | (p.is_send ? 1 : 0)) << 32 | c, r);
  }
  e.np2p.store(a.coll == Collective::kSendRecv ? static_cast<int>(a.p2p.size()) : 0, r);
  e.state.store(static_cast<int>(OpState::kEnqueued), r);
  e.nphases.store(0, r);
  e.algo.store(0, r);
  e.t_enq.store(now, r);
  e.t_start.store(0, r);
  e.t_end.store(0, r);
  e.seq.store(seq, std::memory_order_release);
  next_.store(seq + 1, std::memory_order_release);
  return now;
}

int64_t FlightRecorder::on_start(uint64_t seq, const std::string& algorithm, int nphases, int64_t at) {
  const int64_t now = at ? at : now_ns();
  if (!cap_) return now;
  Entry& e = slot(seq);
  uint64_t name = 0;
  std::memcpy(&name, algorithm.data(), std::min<size_t>(algorithm.size(), 8));
  e.algo.store(name, std::memory_order_relaxed);
  e.nphases.store(nphases, std::memory_order_relaxed);
  e.t_start.store(now, std::memory_order_relaxed);
  e.state.store(static_cast<int>(OpState::kStarted), std::memory_order_release);
  return now;
}

void FlightRecorder::on_end(uint64_t seq, bool ok) {
  if (!cap_) return;
  Entry& e = slot(seq);
  e.t_end.store(now_ns(), std::memory_order_relaxed);
  e.state.store(static_cast<int>(ok ? OpState::kCompleted : OpState::kFailed), std::memory_order_release);
}

nlohmann::json FlightRecorder::to_json() const {
  nlohmann::json out = nlohmann::json::array();
  if (!cap_) return out;
  const uint64_t end = next_.load(std::memory_order_acquire);
  const uint64_t begin = end > cap_ ? end - cap_ : 0;
  for (uint64_t s = begin; s < end; ++s) {
    const Entry& e = slot(s);
    if (e.seq.load(std::memory_order_acquire) != s) continue;
    const auto coll = static_cast<Collective>(e.coll.load());
    nlohmann::json j;
    j["seq"] = s;
    j["coll"] = collective_name(coll);
    j["count"] = e.count.load();
    j["dtype"] = dtype_name(static_cast<DataType>(e.dt.load()));
    if (coll == Collective::kSendRecv) {
      nlohmann::json p2p = nlohmann::json::array();
      const int np = std::min(e.np2p.load(), kMaxP2p);
      for (int i = 0; i < np; ++i) {
        int64_t v = e.p2p[i].load();
        p2p.push_back({{"send", ((v >> 32) & 1) != 0}, {"peer", static_cast<int>(v >> 33)}, {"count", v & 0x7fffffff}});
      }
      j["p2p"] = std::move(p2p);
      j["p2p_total"] = e.np2p.load();
    } else {
      j["coll_seq"] = e.coll_seq.load();
      j["op"] = redop_name(static_cast<RedOp>(e.op.load()));
      j["root"] = e.root.load();
    }
    uint64_t a = e.algo.load();
    char name[9] = {};
    std::memcpy(name, &a, 8);
    j["algo"] = name;
    j["state"] = op_state_name(static_cast<OpState>(e.state.load()));
    j["nphases"] = e.nphases.load();
    j["enqueued_ns"] = e.t_enq.load();
    j["started_ns"] = e.t_start.load();
    j["ended_ns"] = e.t_end.load();
    if (e.seq.load(std::memory_order_acquire) != s) continue;  // rewritten while we read
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace loom::diag
