// CommImpl's side of the diagnostics: registration with the process's hub,
// its state for dumps and live queries, and the watchdog tick.
#include <fmt/format.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "core/comm_impl.h"
#include "core/log.h"
#include "diag/params.h"

namespace loom {
namespace detail {
namespace {

const char* step_kind_name(int k) {
  switch (static_cast<StepKind>(k)) {
    case StepKind::kSend: return "send";
    case StepKind::kRecv: return "recv";
    case StepKind::kRecvReduce: return "recv_reduce";
    default: return "local";
  }
}

}  // namespace

Status CommImpl::diag_init(Deadline deadline) {
  recorder_ = std::make_unique<diag::FlightRecorder>(diag::params::trace_buffer_size());
  fingerprints_ = diag::params::fingerprints();
  // The id names the communicator in dumps (the secret itself stays private).
  uint64_t h = boot_->secret() * 0x9e3779b97f4a7c15ull;
  h ^= h >> 29;
  comm_id_ = fmt::format("{:016x}", h);
  const auto& me = boot_->peers()[rank_];
  std::string addr = diag::Hub::get().start(me.listen());
  // Every rank learns every rank's query address (for gathers and
  // coordinated dumps): one bootstrap allgather at creation.
  constexpr size_t kAddrBytes = 64;
  std::vector<char> table(static_cast<size_t>(nranks_) * kAddrBytes, 0);
  std::memcpy(&table[rank_ * kAddrBytes], addr.data(), std::min(addr.size(), kAddrBytes - 1));
  LOOM_RETURN_IF_ERROR(boot_->allgather(table.data(), kAddrBytes, deadline).with_context("diag address exchange"));
  for (int r = 0; r < nranks_; ++r) peer_diag_addrs_.emplace_back(&table[r * kAddrBytes], strnlen(&table[r * kAddrBytes], kAddrBytes));
  diag::Hub::get().add(this);
  diag_registered_.store(true);
  return Status::ok();
}

void CommImpl::diag_on_failure(const Status& st) {
  if (dumped_.exchange(true)) return;
  // Announce (ask peers to dump too) only when this rank saw the problem
  // itself; a rank that learned it from a peer leaves that to the peer.
  bool announce = st.code() != StatusCode::kRemoteError;
  diag::Hub::get().dump(fmt::format("comm '{}' rank {} failed: {}", name_, rank_, st.message().substr(0, 300)),
                        announce);
}

nlohmann::json CommImpl::diag_state(size_t max_ops) {
  nlohmann::json j;
  j["name"] = name_;
  j["id"] = comm_id_;
  j["rank"] = rank_;
  j["nranks"] = nranks_;
  j["timeout_s"] = timeout_s_;
  j["transport"] = transport_ ? transport_->name() : "";
  Status st = async_error();
  j["status"] = st.is_ok() ? "ok" : "failed";
  if (!st.is_ok()) j["error"] = st.to_string();
  size_t queued = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& op : queue_) queued += op.subs.size();
  }
  j["queued"] = queued;
  nlohmann::json peers = nlohmann::json::array();
  if (boot_)
    for (const auto& p : boot_->peers())
      peers.push_back({{"rank", p.rank},
                       {"pid", p.pid},
                       {"host", std::string(p.hostname, strnlen(p.hostname, sizeof(p.hostname)))},
                       {"host_hash", fmt::format("{:016x}", p.host_hash)},
                       {"addr", p.listen().to_string()},
                       {"diag", p.rank >= 0 && p.rank < static_cast<int>(peer_diag_addrs_.size())
                                    ? peer_diag_addrs_[p.rank]
                                    : ""}});
  j["peers"] = std::move(peers);
  nlohmann::json ops = recorder_ ? recorder_->to_json(max_ops) : nlohmann::json::array();
  // The running op, or the one that failed (its progress is still the
  // executor's last published position).
  uint64_t running = running_seq_.load(std::memory_order_acquire);
  uint64_t cur_seq = running ? running - 1 : 0;
  bool have_cur = running != 0;
  if (!have_cur && last_failed_.load() && last_seq_.load()) {
    cur_seq = last_seq_.load() - 1;
    have_cur = true;
  }
  if (have_cur && exec_) {
    nlohmann::json cur;
    cur["seq"] = cur_seq;
    cur["state"] = running ? "running" : "failed";
    // 0: an op run at issue that has not waited yet (run_sub) started just now.
    if (const int64_t since = running_since_ns_.load()) cur["started_ns"] = since;
    for (const auto& o : ops)
      if (o.value("seq", ~0ull) == cur_seq) cur["op"] = o;
    const ExecProgress& p = exec_->progress();
    cur["phase"] = p.phase.load(std::memory_order_relaxed);
    cur["nphases"] = p.nphases.load(std::memory_order_relaxed);
    cur["waiting_peer"] = p.waiting_peer.load(std::memory_order_relaxed);
    nlohmann::json steps = nlohmann::json::array();
    const int n = std::min(p.nslots.load(std::memory_order_acquire), ExecProgress::kMaxSlots);
    for (int i = 0; i < n; ++i) {
      const auto& s = p.slots[i];
      steps.push_back({{"peer", s.peer.load()}, {"kind", step_kind_name(s.kind.load())}, {"done", s.done.load()},
                       {"total", s.total.load()}});
    }
    cur["steps"] = std::move(steps);
    j["current"] = std::move(cur);
  }
  j["ops"] = std::move(ops);
  // seq + 1 of the last op the engine finished: progress that `loom-doctor
  // status` sees even when no op is recorded (LOOM_TRACE_BUFFER_SIZE=0).
  j["finished_seq"] = last_seq_.load(std::memory_order_relaxed);
  if (recorder_ && recorder_->unrecorded()) j["ops_not_recorded"] = recorder_->unrecorded();
  return j;
}

void CommImpl::diag_tick() {
  if (destroyed_.load() || !transport_) return;
  const int64_t now = diag::now_ns();
  const uint64_t running = running_seq_.load(std::memory_order_acquire);
  if (running) {
    // Backstop: the executor enforces the deadline itself; an op far past it
    // means the engine is stuck outside a wait (a bug or a wedged kernel).
    const int64_t since = running_since_ns_.load();
    if (since == 0) return;  // an op run at issue that has not waited yet: it started just now (run_sub)
    double secs = static_cast<double>(now - since) / 1e9;
    if (secs > timeout_s_ + 5 && !abort_.load())
      abort(fmt::format("watchdog: op #{} still running {:.0f} s after its start (LOOM_TIMEOUT {} s)", running - 1,
                        secs, timeout_s_));
    return;
  }
  if (!async_error().is_ok()) return;
  // Idle: nobody else looks at the peers now. A rank that sits in user code
  // must still learn that a peer failed (async error) and dump its state.
  if (now - last_idle_check_ns_ < 200'000'000) return;
  last_idle_check_ns_ = now;
  for (int p = 0; p < nranks_; ++p) {
    if (p == rank_) continue;
    Status st = transport_->check_peer(p);
    if (st.is_ok()) continue;
    uint64_t last = last_seq_.load();
    fail(Status(st.code(), fmt::format("{} rank {}: watchdog, while idle {}: {}", name_, rank_,
                                       last ? fmt::format("after op #{}", last - 1) : std::string("before any op"),
                                       st.message())));
    return;
  }
}

}  // namespace detail
}  // namespace loom
