#include "diag/hub.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "core/config.h"
#include "core/log.h"
#include "core/threads.h"
#include "diag/params.h"
#include "diag/recorder.h"
#include "diag/render.h"

namespace loom::diag {
namespace {

// Ops a healthy destroyed communicator leaves in later dumps: "where this
// process was", e.g. for a peer that still waits on it.
constexpr size_t kRetiredOps = 16;

// A state as text. Reasons, comm names and peers' messages may hold bytes
// that are not UTF-8 (a request line, a cut multi-byte character): those are
// replaced, never thrown about (nlohmann's dump throws type_error.316).
// Regression: "dump \xff" sent to the diag server killed the rank.
std::string json_text(const nlohmann::json& j) {
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::atomic<int> g_sigusr1{0};
void on_sigusr1(int) { g_sigusr1.store(1, std::memory_order_relaxed); }

std::string read_line(int fd, Deadline deadline) {
  std::string line;
  char c;
  while (line.size() < 256) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) break;
    if (::recv(fd, &c, 1, 0) != 1 || c == '\n') break;
    line.push_back(c);
  }
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

}  // namespace

struct Hub::Impl {
  std::recursive_mutex mu;  // guards clients; held while calling into them
  std::vector<DiagClient*> clients;
  std::vector<nlohmann::json> retired;  // last state of destroyed, failed communicators
  std::string addr;
  Fd listen_fd;
  bool started = false;
  std::atomic<int> handlers{0};
  int64_t last_dump_ns = 0;

  void start(const SockAddr& bind_ip);
  void watchdog_main();
  void server_main();
  void handle(Fd conn);
};

Hub::Hub() : impl_(new Impl()) {}

Hub& Hub::get() {
  static Hub* hub = new Hub();  // leaked on purpose: threads outlive statics
  return *hub;
}

std::string Hub::start(const SockAddr& bind_ip) {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  if (!impl_->started) impl_->start(bind_ip);
  return impl_->addr;
}

void Hub::add(DiagClient* c) {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  impl_->clients.push_back(c);
}

void Hub::remove(DiagClient* c) {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  if (std::find(impl_->clients.begin(), impl_->clients.end(), c) == impl_->clients.end()) return;
  // A failed communicator's last state stays in later dumps and answers:
  // programs often destroy it before a peer asks for the coordinated dump.
  // A healthy one keeps only its last kRetiredOps, and only those are
  // rendered (the whole ring, 1024 entries by default, cost ~400 page faults
  // per destroy); a failed one is rendered again, in full.
  nlohmann::json last = c->diag_state(kRetiredOps);
  if (last.value("status", "ok") != "ok") last = c->diag_state();
  last["destroyed"] = true;
  impl_->retired.push_back(std::move(last));
  if (impl_->retired.size() > 16) impl_->retired.erase(impl_->retired.begin());
  std::erase(impl_->clients, c);
}

std::string Hub::address() {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->addr;
}

void Hub::Impl::start(const SockAddr& bind_ip) {
  started = true;
  std::string spec = params::diag_addr();
  if (spec != "off") {
    SockAddr want = bind_ip;
    want.set_port(28950);
    if (!spec.empty()) {
      auto parsed = parse_sockaddr(spec);
      if (parsed.is_ok()) want = *parsed;
      else LOOM_WARN(kLogDiag, "LOOM_DIAG_ADDR '{}': {}; using {}", spec, parsed.status().message(), want.to_string());
    }
    SockAddr bound;
    auto fd = tcp_listen(want, &bound, 16);
    if (!fd.is_ok()) {
      // Another rank of this host serves the well-known port: any process can
      // answer a gather, so an ephemeral port is enough for this one.
      want.set_port(0);
      fd = tcp_listen(want, &bound, 16);
    }
    if (fd.is_ok()) {
      listen_fd = std::move(fd).value();
      addr = bound.to_string();
      // Started asleep (core/threads.h), as the watchdog below: created with
      // a rank's first communicator, they would otherwise first run inside
      // its first operations.
      start_thread_asleep([this] { server_main(); }).detach();
      LOOM_INFO(kLogDiag, "diag server on {} (query with: loom-doctor status {})", addr, addr);
    } else {
      LOOM_WARN(kLogDiag, "diag server disabled: {}", fd.status().message());
    }
  }
  if (params::dump_on_sigusr1()) {
    struct sigaction old {};
    if (sigaction(SIGUSR1, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
      struct sigaction sa {};
      sa.sa_handler = on_sigusr1;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART;
      sigaction(SIGUSR1, &sa, nullptr);
    }
  }
  start_thread_asleep([this] { watchdog_main(); }).detach();
}

void Hub::Impl::watchdog_main() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (g_sigusr1.exchange(0)) Hub::get().dump("SIGUSR1", false);
    Hub::get().tick();
  }
}

void Hub::tick() {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  for (DiagClient* c : impl_->clients) c->diag_tick();
}

void Hub::Impl::server_main() {
  for (;;) {
    pollfd p{listen_fd.get(), POLLIN, 0};
    if (poll(&p, 1, 1000) <= 0) continue;
    int fd = accept4(listen_fd.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    // A gather asks other processes, which may be gathering from us at the
    // same time: answer each request on its own short-lived thread.
    if (handlers.load() >= 8) {
      close(fd);
      continue;
    }
    handlers.fetch_add(1);
    std::thread([this, fd] {
      handle(Fd(fd));
      handlers.fetch_sub(1);
    }).detach();
  }
}

void Hub::Impl::handle(Fd conn) {
  std::string req = read_line(conn.get(), deadline_after(2.0));
  Hub& hub = Hub::get();
  std::string out;
  // This runs on a detached thread of the user's process: nothing a client
  // sends may end it (an uncaught exception is std::terminate: the rank dies).
  try {
    if (req == "json") out = json_text(hub.state("live")) + "\n";
    else if (req == "text" || req.empty()) out = hub.state_text();
    else if (req == "gather") out = json_text(hub.gather(2.0)) + "\n";
    else if (req.rfind("dump", 0) == 0) {
      hub.dump(req.size() > 5 ? "requested: " + req.substr(5) : "requested by a peer", false);
      out = "ok\n";
    } else {
      LOOM_WARN(kLogDiag, "diag server: unknown request '{}' dropped", req.substr(0, 64));
      out = "unknown request (use: text, json, gather, dump)\n";
    }
  } catch (const std::exception& e) {
    LOOM_WARN(kLogDiag, "diag server: request failed: {}", e.what());
    out = std::string("error: ") + e.what() + "\n";
  }
  (void)send_all(conn.get(), out.data(), out.size(), deadline_after(5.0));
}

nlohmann::json Hub::state(const std::string& reason) {
  nlohmann::json j;
  j["schema"] = "loom-diag";
  j["version"] = kSchemaVersion;
  j["reason"] = reason;
  j["host"] = host_name();
  // The host identity Loom uses to group ranks (LOOM_HOST_ID overrides the
  // hostname, e.g. one namespace per "host"); peers carry only its hash.
  j["host_id"] = env_string("LOOM_HOST_ID", host_name());
  j["host_hash"] = fmt::format("{:016x}", host_hash());
  j["pid"] = static_cast<int>(getpid());
  j["time_ns"] = now_ns();
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  j["diag_addr"] = impl_->addr;
  nlohmann::json comms = nlohmann::json::array();
  for (DiagClient* c : impl_->clients) comms.push_back(c->diag_state());
  for (const auto& r : impl_->retired) comms.push_back(r);
  j["comms"] = std::move(comms);
  return j;
}

std::string Hub::state_text() { return render_process(state("live")); }

void Hub::dump(const std::string& reason, bool announce) {
  nlohmann::json j = state(reason);
  std::string dir = params::dump_dir();
  if (j["comms"].empty()) return;  // nothing to tell (no communicator left)
  if (dir.empty()) {
    LOOM_WARN(kLogDiag, "no diagnostic dump written ({}): set LOOM_DUMP_DIR to keep one for loom-doctor", reason);
  } else {
    int rank = -1;
    if (!j["comms"].empty()) rank = j["comms"][0].value("rank", -1);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    std::string name = fmt::format("{}/loom-rank{}-{}-{}.json", dir, rank, j["host"].get<std::string>(),
                                   j["pid"].get<int>());
    // A temporary file of its own per write, renamed into place: two dumps
    // at once (this rank's failure and a peer's coordinated request) must not
    // share one, or they interleave in it and the file renamed into place is
    // neither (regression: netns/test_netns_doctor read a corrupt dump).
    static std::atomic<uint64_t> writes{0};
    std::string tmp = fmt::format("{}.tmp.{}", name, writes.fetch_add(1, std::memory_order_relaxed));
    bool written = false;
    {
      std::ofstream f(tmp);
      f << json_text(j) << "\n";
      f.close();
      written = static_cast<bool>(f);
    }
    // A dump that could not be written whole (disk full, quota) must not
    // replace an earlier good one: the doctor would call it truncated.
    if (!written) {
      LOOM_WARN(kLogDiag, "cannot write dump {} ({}): the previous one, if any, is kept", tmp, std::strerror(errno));
      std::remove(tmp.c_str());
    } else if (std::rename(tmp.c_str(), name.c_str()) == 0) {
      LOOM_WARN(kLogDiag, "diagnostic dump ({}) written to {}", reason, name);
    } else {
      LOOM_WARN(kLogDiag, "cannot move dump {} to {}: {}", tmp, name, std::strerror(errno));
      std::remove(tmp.c_str());
    }
  }
  if (!announce) return;
  // Coordinated dump: ask every peer's diag server too (best effort; peers
  // whose transport already told them about the failure dump on their own).
  std::set<std::string> addrs;
  const std::string self = address();
  for (const auto& c : j["comms"])
    for (const auto& p : c["peers"]) {
      std::string a = p.value("diag", "");
      if (!a.empty() && a != self) addrs.insert(a);
    }
  // Off the caller's thread: a dead peer's address costs a connect timeout.
  std::string req = "dump " + reason.substr(0, 120);
  std::thread([addrs = std::move(addrs), req] {
    for (const auto& a : addrs) (void)query(a, req, 0.5);
  }).detach();
}

nlohmann::json Hub::gather(double timeout_s) {
  nlohmann::json self = state("live");
  nlohmann::json out;
  out["schema"] = "loom-diag-gather";
  out["version"] = kSchemaVersion;
  out["processes"] = nlohmann::json::array({self});
  out["unreachable"] = nlohmann::json::array();
  std::set<std::string> seen{self.value("diag_addr", "")};
  // Ask in parallel: an unreachable rank costs one timeout, not one per rank.
  struct Ask {
    std::string addr, comm;
    int rank;
    Result<std::string> answer = internal_error("not asked");
  };
  std::vector<Ask> asks;
  for (const auto& c : self["comms"])
    for (const auto& p : c["peers"]) {
      std::string a = p.value("diag", "");
      if (a.empty() || !seen.insert(a).second) continue;
      asks.push_back({a, c.value("name", ""), p.value("rank", -1)});
    }
  std::vector<std::thread> threads;
  for (auto& ask : asks) threads.emplace_back([&ask, timeout_s] { ask.answer = query(ask.addr, "json", timeout_s); });
  for (auto& t : threads) t.join();
  for (auto& ask : asks) {
    nlohmann::json parsed;
    std::string err;
    if (ask.answer.is_ok()) {
      parsed = nlohmann::json::parse(*ask.answer, nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object()) err = "malformed answer";
    } else {
      err = ask.answer.status().message();
    }
    if (err.empty()) out["processes"].push_back(std::move(parsed));
    else out["unreachable"].push_back({{"addr", ask.addr}, {"comm", ask.comm}, {"rank", ask.rank}, {"error", err}});
  }
  return out;
}

Result<std::string> query(const std::string& addr, const std::string& request, double timeout_s) {
  LOOM_ASSIGN_OR_RETURN(SockAddr sa, parse_sockaddr(addr));
  Deadline dl = deadline_after(timeout_s);
  auto fd = tcp_connect(sa, dl);
  if (!fd.is_ok()) return fd.status();
  std::string line = request + "\n";
  LOOM_RETURN_IF_ERROR(send_all(fd->get(), line.data(), line.size(), dl));
  std::string out;
  char buf[65536];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(dl - Clock::now()).count();
    if (left <= 0) return timeout_error("diag query to " + addr + ": no complete answer in time");
    pollfd p{fd->get(), POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    ssize_t n = ::recv(fd->get(), buf, sizeof(buf), 0);
    if (n < 0) return system_error("diag query recv from " + addr, errno);
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace loom::diag
