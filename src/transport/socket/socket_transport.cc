#include "transport/socket/socket_transport.h"

#include <fmt/format.h>
#include <linux/futex.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>

#include "core/config.h"
#include "core/log.h"

namespace loom {
namespace {

constexpr uint32_t kStreamMagic = 0x4c4f534b;  // "LOSK"
constexpr uint32_t kCtrlMagic = 0x4c4f4354;    // "LOCT"
constexpr uint32_t kCloseMagic = 0x4c4f434c;   // "LOCL"
constexpr uint16_t kVersion = 2;               // 2: orderly-close notices on the control stream
constexpr size_t kMaxReason = 4096;
constexpr int kMaxStreams = 64;

// First bytes on every stream; the data stream continues right after it.
struct StreamHello {
  uint32_t magic;
  uint16_t version;
  uint16_t stream;  // 0..nsocks-1 data, nsocks = control
  uint64_t secret;
  int32_t rank;
  int32_t nsocks;
  uint64_t slice_bytes;
};

// A control-stream message: an abort announcement with its reason
// (kCtrlMagic), or an orderly-close notice (kCloseMagic) whose 8-byte body is
// the number of stream bytes the sender handed to this connection in all.
struct CtrlHeader {
  uint32_t magic;
  uint32_t len;
};

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

void tune_data_socket(int fd, size_t sockbuf) {
  set_nonblocking(fd, true);
  set_nodelay(fd);
  if (sockbuf > 0) {
    // Fixed sizes turn the kernel's autotuning off; only on request.
    int b = static_cast<int>(std::min<size_t>(sockbuf, INT_MAX));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof(b));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof(b));
  }
  // A cut link shows up as an error instead of an endless retransmission;
  // the operation deadline (LOOM_TIMEOUT) still bounds every wait.
  int one = 1, idle = 10, intvl = 5, cnt = 3;
  unsigned user_timeout_ms = 30000;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
}

// A connection accepted during setup whose hello is still arriving.
struct Pending {
  Fd fd;
  SockAddr from;
  StreamHello hello{};
  size_t got = 0;
};

}  // namespace

struct SocketTransport::Peer {
  int rank = -1;
  std::string label;
  std::unique_ptr<SocketConnection> conn;
  Fd ctrl;
  int ctrl_worker = 0;
  // Control stream input (progress thread of ctrl_worker only).
  std::string ctrl_buf;
  bool ctrl_closed = false;
  bool close_noticed = false;  // the peer announced its orderly close
  // Abort reason announced by the peer (set once, then aborted = true).
  std::mutex mu;
  std::string abort_reason;
  std::atomic<bool> aborted{false};
};

struct SocketTransport::Worker {
  std::vector<std::pair<SocketConnection*, int>> streams;  // (connection, stream index)
  std::vector<Peer*> ctrl;                                 // control streams this thread reads
  Fd efd;
  std::atomic<int> sleeping{0};
  std::thread thread;
  void poke() {
    if (sleeping.load(std::memory_order_seq_cst)) {
      uint64_t one = 1;
      (void)!write(efd.get(), &one, sizeof(one));
    }
  }
};

namespace {
constexpr size_t kMaxSliceBytes = size_t{64} << 20;  // per stream slice; checked in each peer's hello
}  // namespace

SocketTransport::Options SocketTransport::Options::from_env() {
  Options o;
  o.nsocks = std::clamp(params::socket_nsocks(), 1, kMaxStreams - 1);
  o.nthreads = std::clamp(params::socket_nthreads(), 1, 64);
  o.slice_bytes = std::max<uint64_t>(4096, params::socket_slice_bytes());
  o.ring_bytes = params::socket_buf_bytes();
  o.sockbuf = params::socket_sockbuf();
  o.direct_bytes = params::socket_direct_bytes();
  return o;
}

Result<std::unique_ptr<SocketTransport>> SocketTransport::create(Bootstrap& boot, const std::vector<bool>& use,
                                                                 const Options& opt, Deadline deadline) {
  std::unique_ptr<SocketTransport> t(new SocketTransport());
  t->rank_ = boot.rank();
  t->nranks_ = boot.nranks();
  t->opt_ = opt;
  t->opt_.nsocks = std::clamp(opt.nsocks, 1, kMaxStreams - 1);
  t->opt_.nthreads = std::max(1, opt.nthreads);
  // At most kMaxSliceBytes: a peer drops connections announcing more (the
  // hello check below). Regression: LOOM_SOCKET_SLICE_BYTES=128M on every
  // rank made each rank drop its peers' streams and fail at the deadline
  // with "did not open their sockets" (SocketSetup.AHugeSliceSettingIsClamped).
  t->opt_.slice_bytes = std::clamp<size_t>((opt.slice_bytes + 7) & ~size_t{7}, 4096, kMaxSliceBytes);
  if (opt.slice_bytes > kMaxSliceBytes)
    LOOM_WARN(kLogNet, "LOOM_SOCKET_SLICE_BYTES {} is above the {} MiB limit: using {} MiB", opt.slice_bytes,
              kMaxSliceBytes >> 20, kMaxSliceBytes >> 20);
  // The lagging stream must always find room: at least two slices per stream.
  t->opt_.ring_bytes = std::max(opt.ring_bytes, 2 * t->opt_.nsocks * t->opt_.slice_bytes);
  t->peers_.resize(t->nranks_);
  t->conns_.assign(t->nranks_, nullptr);
  Status st = t->setup(boot, use, deadline);
  if (!st.is_ok()) return st.with_context("socket transport setup");
  t->start_workers();
  return t;
}

Status SocketTransport::setup(Bootstrap& boot, const std::vector<bool>& use, Deadline deadline) {
  const int n = nranks_, r = rank_;
  const auto& info = boot.peers();
  auto wanted = [&](int p) { return p != r && p >= 0 && p < n && use[p]; };

  // Listen on LOOM_SOCKET_IFNAME when given, else where the bootstrap
  // listens: the interface that routes to the rendezvous root.
  SockAddr addr;
  if (env_raw("LOOM_SOCKET_IFNAME")) {
    LOOM_ASSIGN_OR_RETURN(addr, default_listen_addr());
  } else {
    addr = info[r].listen();
    addr.set_port(0);
  }
  SockAddr bound;
  LOOM_ASSIGN_OR_RETURN(Fd listener, tcp_listen(addr, &bound, std::max(128, 2 * n * (opt_.nsocks + 1))));
  set_nonblocking(listener.get(), true);
  if (opt_.on_listen) opt_.on_listen(bound);

  std::vector<PeerInfo> table(n);
  table[r].set_listen(bound);
  LOOM_RETURN_IF_ERROR(boot.allgather(table.data(), sizeof(PeerInfo), deadline).with_context("exchanging listen addresses"));

  auto label = [&](int p) {
    return fmt::format("rank {} on host {} ({})", p, std::string(info[p].hostname, strnlen(info[p].hostname, sizeof(info[p].hostname))),
                       table[p].listen().to_string());
  };
  std::vector<std::vector<Fd>> data(n);
  std::vector<Fd> ctrl(n);
  std::vector<size_t> slice(n, opt_.slice_bytes);

  // The lower rank of each pair connects; the kernel completes the handshake
  // from the listen backlog, so connecting before accepting cannot deadlock.
  for (int p = r + 1; p < n; ++p) {
    if (!wanted(p)) continue;
    for (int s = 0; s <= opt_.nsocks; ++s) {
      auto fd = tcp_connect(table[p].listen(), deadline, opt_.abort);
      if (!fd.is_ok()) return fd.status().with_context("connecting to " + label(p));
      StreamHello h{kStreamMagic, kVersion, static_cast<uint16_t>(s), boot.secret(), r, opt_.nsocks, opt_.slice_bytes};
      LOOM_RETURN_IF_ERROR(send_all(fd->get(), &h, sizeof(h), deadline, opt_.abort).with_context("hello to " + label(p)));
      if (s < opt_.nsocks) data[p].push_back(std::move(fd).value());
      else ctrl[p] = std::move(fd).value();
    }
  }

  // Accept from the lower ranks, reading hellos of several clients at once so
  // a silent stranger cannot stall the others.
  struct Expect {
    int nsocks = -1;
    size_t slice = 0;
    std::vector<Fd> data;
    Fd ctrl;
    int have = 0;
  };
  std::map<int, Expect> expect;
  for (int p = 0; p < r; ++p)
    if (wanted(p)) expect[p];
  auto missing = [&] {
    std::string m;
    for (auto& [p, e] : expect)
      if (e.nsocks < 0 || e.have < e.nsocks + 1) m += (m.empty() ? "" : ", ") + label(p);
    return m;
  };
  std::vector<Pending> pending;
  while (!missing().empty()) {
    if (opt_.abort && opt_.abort->load()) return aborted_error("socket setup aborted");
    if (Clock::now() >= deadline)
      return timeout_error("these ranks did not open their sockets before the deadline: " + missing());
    std::vector<pollfd> pf{{listener.get(), POLLIN, 0}};
    for (auto& q : pending) pf.push_back({q.fd.get(), POLLIN, 0});
    int rc = poll(pf.data(), pf.size(), 100);
    if (rc < 0 && errno != EINTR) return system_error("poll", errno);
    if (pf[0].revents & POLLIN) {
      Pending q;
      q.from.len = sizeof(q.from.storage);
      int fd = accept4(listener.get(), reinterpret_cast<sockaddr*>(&q.from.storage), &q.from.len, SOCK_CLOEXEC);
      if (fd >= 0) {
        q.fd.reset(fd);
        set_nonblocking(fd, true);
        pending.push_back(std::move(q));
      }
    }
    for (size_t i = 0; i < pending.size();) {
      Pending& q = pending[i];
      auto* dst = reinterpret_cast<char*>(&q.hello) + q.got;
      // Exactly the hello: the data stream's first bytes may follow it.
      ssize_t got = ::recv(q.fd.get(), dst, sizeof(StreamHello) - q.got, MSG_DONTWAIT);
      std::string drop;
      if (got > 0) q.got += static_cast<size_t>(got);
      else if (got == 0) drop = "closed before its hello";
      else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) drop = std::strerror(errno);
      if (drop.empty() && q.got == sizeof(StreamHello)) {
        const StreamHello& h = q.hello;
        auto it = expect.find(h.rank);
        if (h.magic != kStreamMagic || h.version != kVersion || h.secret != boot.secret()) {
          drop = "wrong magic, version or secret";
        } else if (it == expect.end()) {
          drop = fmt::format("unexpected rank {}", h.rank);
        } else if (h.nsocks < 1 || h.nsocks >= kMaxStreams || h.stream > h.nsocks || h.slice_bytes < 8 ||
                   h.slice_bytes % 8 || h.slice_bytes > kMaxSliceBytes ||
                   (it->second.nsocks >= 0 && (it->second.nsocks != h.nsocks || it->second.slice != h.slice_bytes))) {
          drop = "inconsistent stream parameters";
        } else {
          Expect& e = it->second;
          if (e.nsocks < 0) {
            e.nsocks = h.nsocks;
            e.slice = h.slice_bytes;
            e.data.resize(h.nsocks);
          }
          Fd& slot = h.stream == h.nsocks ? e.ctrl : e.data[h.stream];
          if (slot.valid()) {
            drop = fmt::format("duplicate stream {} of rank {}", h.stream, h.rank);
          } else {
            slot = std::move(q.fd);
            ++e.have;
            pending.erase(pending.begin() + static_cast<ptrdiff_t>(i));
            continue;
          }
        }
      }
      if (!drop.empty()) {
        LOOM_WARN(kLogNet, "rank {}: dropped a connection from {} to the socket transport port ({})", r,
                  q.from.to_string(), drop);
        pending.erase(pending.begin() + static_cast<ptrdiff_t>(i));
        continue;
      }
      ++i;
    }
  }
  listener.reset();  // later strangers are refused by the kernel
  for (auto& [p, e] : expect) {
    data[p] = std::move(e.data);
    ctrl[p] = std::move(e.ctrl);
    slice[p] = e.slice;
  }

  for (int p = 0; p < n; ++p) {
    if (!wanted(p)) continue;
    auto peer = std::make_unique<Peer>();
    peer->rank = p;
    peer->label = label(p);
    for (auto& f : data[p]) tune_data_socket(f.get(), opt_.sockbuf);
    set_nonblocking(ctrl[p].get(), true);
    set_nodelay(ctrl[p].get());
    peer->ctrl = std::move(ctrl[p]);
    peer->conn =
        std::make_unique<SocketConnection>(std::move(data[p]), opt_.ring_bytes, slice[p], peer->label, opt_.direct_bytes);
    conns_[p] = peer->conn.get();
    peers_[p] = std::move(peer);
  }
  LOOM_INFO(kLogNet, "rank {}: socket transport up on {}, {} remote peers, {} streams each, slice {} KiB, ring {} KiB",
            r, bound.to_string(), std::count_if(conns_.begin(), conns_.end(), [](auto* c) { return c != nullptr; }),
            opt_.nsocks, opt_.slice_bytes >> 10, opt_.ring_bytes >> 10);
  return Status::ok();
}

void SocketTransport::start_workers() {
  int total = 0;
  for (auto& p : peers_)
    if (p) total += p->conn->nstreams();
  const int nw = std::max(1, std::min(opt_.nthreads, total));
  for (int i = 0; i < nw; ++i) {
    auto w = std::make_unique<Worker>();
    w->efd.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    workers_.push_back(std::move(w));
  }
  int next = 0;
  for (auto& p : peers_) {
    if (!p) continue;
    std::vector<Worker*> mine;
    for (int s = 0; s < p->conn->nstreams(); ++s) {
      Worker* w = workers_[next++ % nw].get();
      w->streams.push_back({p->conn.get(), s});
      if (s == 0) {
        w->ctrl.push_back(p.get());
      }
      if (std::find(mine.begin(), mine.end(), w) == mine.end()) mine.push_back(w);
    }
    // The owners are known only now; nothing uses the connection before.
    p->conn->set_poke([mine] {
      for (Worker* w : mine) w->poke();
    });
  }
  for (auto& w : workers_) {
    Worker* wp = w.get();
    wp->thread = std::thread([this, wp] { worker_main(*wp); });
  }
}

bool SocketTransport::pump(Worker& w, std::vector<short>& wants) {
  bool moved = false;
  for (size_t i = 0; i < w.streams.size(); ++i) {
    auto [conn, s] = w.streams[i];
    short a = 0, b = 0;
    moved |= conn->pump_recv(s, &a);
    moved |= conn->pump_send(s, &b);
    wants[i] = static_cast<short>(a | b);
  }
  return moved;
}

void SocketTransport::read_control(Peer& p) {
  char buf[1024];
  for (;;) {
    ssize_t n = ::recv(p.ctrl.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      p.ctrl_buf.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) p.ctrl_closed = true;
    break;
  }
  while (p.ctrl_buf.size() >= sizeof(CtrlHeader)) {
    CtrlHeader h;
    std::memcpy(&h, p.ctrl_buf.data(), sizeof(h));
    const bool close_notice = h.magic == kCloseMagic && h.len == sizeof(uint64_t);
    if ((h.magic != kCtrlMagic && !close_notice) || h.len > kMaxReason) {
      LOOM_WARN(kLogNet, "rank {}: garbage on the control stream of {}; ignoring it", rank_, p.label);
      p.ctrl_buf.clear();
      p.ctrl_closed = true;
      break;
    }
    if (p.ctrl_buf.size() < sizeof(h) + h.len) break;
    if (close_notice) {
      uint64_t sent;
      std::memcpy(&sent, p.ctrl_buf.data() + sizeof(h), sizeof(sent));
      p.conn->peer_closed(sent);
      p.close_noticed = true;
      p.ctrl_buf.erase(0, sizeof(h) + h.len);
      notify();
      continue;
    }
    {
      std::lock_guard<std::mutex> lk(p.mu);
      if (p.abort_reason.empty()) p.abort_reason = p.ctrl_buf.substr(sizeof(h), h.len);
    }
    p.aborted.store(true, std::memory_order_release);
    p.ctrl_buf.erase(0, sizeof(h) + h.len);
    notify();
  }
  if (p.ctrl_closed && !p.close_noticed) {
    p.conn->control_lost();  // ended without saying goodbye: a data stream's EOF is a crash
    notify();
  }
}

void SocketTransport::worker_main(Worker& w) {
  std::vector<short> wants(w.streams.size(), 0);
  std::vector<pollfd> pf;
  int idle = 0;
  constexpr int kSpin = 64;
  while (!stop_.load(std::memory_order_acquire)) {
    if (pump(w, wants)) {
      notify();
      idle = 0;
      continue;
    }
    if (++idle < kSpin) {
      if (idle % 16 == 0) sched_yield();
      continue;
    }
    // Announce sleep, then look once more: an executor that added work after
    // our pump sees the flag and writes the eventfd.
    w.sleeping.store(1, std::memory_order_seq_cst);
    if (pump(w, wants)) {
      w.sleeping.store(0, std::memory_order_relaxed);
      notify();
      idle = 0;
      continue;
    }
    pf.clear();
    pf.push_back({w.efd.get(), POLLIN, 0});
    for (size_t i = 0; i < w.streams.size(); ++i)
      if (wants[i]) pf.push_back({w.streams[i].first->fd(w.streams[i].second), wants[i], 0});
    const size_t first_ctrl = pf.size();
    for (Peer* p : w.ctrl)
      if (!p->ctrl_closed) pf.push_back({p->ctrl.get(), POLLIN, 0});
    int rc = poll(pf.data(), pf.size(), 100);
    w.sleeping.store(0, std::memory_order_relaxed);
    if (rc == 0) {
      // Nothing woke us for 100 ms. If bytes move now, a wake-up was lost:
      // the executor or the kernel had work for us and we slept through it.
      if (pump(w, wants)) {
        missed_wakeups_.fetch_add(1, std::memory_order_relaxed);
        LOOM_INFO(kLogNet, "rank {}: a progress thread found work after a full poll timeout", rank_);
        notify();
        idle = 0;
      }
      continue;
    }
    if (rc < 0) continue;
    if (pf[0].revents) {
      uint64_t v;
      (void)!read(w.efd.get(), &v, sizeof(v));
    }
    size_t k = first_ctrl;
    for (Peer* p : w.ctrl)
      if (!p->ctrl_closed && k < pf.size() && pf[k++].revents) read_control(*p);
    idle = kSpin / 2;
  }
}

void SocketTransport::notify() {
  bell_.fetch_add(1, std::memory_order_seq_cst);
  if (waiters_.load(std::memory_order_seq_cst)) futex(&bell_, FUTEX_WAKE, INT_MAX, nullptr);
  if (opt_.notify) opt_.notify();
}

SocketTransport::~SocketTransport() {
  // Everything the executor handed over must reach the kernel before the
  // sockets close (ops complete once their bytes are in the ring). A failed
  // communicator does not wait: its peers are failing too.
  bool failing;
  {
    std::lock_guard<std::mutex> lk(abort_mu_);
    failing = announced_;
  }
  Deadline flush_by = deadline_after(failing ? 0.0 : 10.0);
  for (;;) {
    bool all = true;
    for (auto* c : conns_)
      if (c && !c->flushed()) all = false;
    if (all || Clock::now() >= flush_by) break;
    for (auto& w : workers_) w->poke();
    usleep(1000);
  }
  stop_.store(true, std::memory_order_release);
  {
    // Orderly close: tell each peer how many bytes it gets from us in all,
    // so it drains them after we are gone instead of calling us dead. Only
    // where everything reached the kernel; a peer we could not flush to
    // sees a plain end-of-file (data was lost). No abort after this.
    std::lock_guard<std::mutex> lk(abort_mu_);
    if (!announced_) {
      announced_ = true;
      for (auto& p : peers_) {
        if (!p || !p->conn->flushed() || !p->conn->check().is_ok()) continue;
        struct {
          CtrlHeader h;
          uint64_t sent;
        } msg{{kCloseMagic, sizeof(uint64_t)}, p->conn->sent_bytes()};
        Status st = send_all(p->ctrl.get(), &msg, sizeof(msg), deadline_after(1.0));
        if (!st.is_ok()) LOOM_INFO(kLogNet, "could not tell {} about our orderly close: {}", p->label, st.message());
      }
    }
  }
  for (auto& w : workers_) {
    uint64_t one = 1;
    (void)!write(w->efd.get(), &one, sizeof(one));
  }
  for (auto& w : workers_)
    if (w->thread.joinable()) w->thread.join();
  // Read what is left (padding of a last message) so close() sends FIN, not
  // RST: a reset could discard data the peer has not read yet.
  char sink[4096];
  for (auto& p : peers_) {
    if (!p) continue;
    for (int s = 0; s < p->conn->nstreams(); ++s)
      while (::recv(p->conn->fd(s), sink, sizeof(sink), MSG_DONTWAIT) > 0) {
      }
  }
}

Connection* SocketTransport::connection(int peer) { return reaches(peer) ? conns_[peer] : nullptr; }

uint32_t SocketTransport::events() { return bell_.load(std::memory_order_seq_cst); }

void SocketTransport::wait_events(uint32_t seen, std::chrono::microseconds timeout) {
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  if (bell_.load(std::memory_order_seq_cst) == seen) {
    timespec ts{static_cast<time_t>(timeout.count() / 1000000), static_cast<long>((timeout.count() % 1000000) * 1000)};
    futex(&bell_, FUTEX_WAIT, seen, &ts);
  }
  waiters_.fetch_sub(1, std::memory_order_seq_cst);
}

void SocketTransport::wake_self() { notify(); }

Status SocketTransport::check_peer(int peer) {
  if (!reaches(peer)) return Status::ok();
  Peer& p = *peers_[peer];
  if (p.aborted.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lk(p.mu);
    return remote_error(p.label + " failed: " + p.abort_reason);
  }
  return p.conn->check();
}

void SocketTransport::announce_abort(const std::string& reason) {
  std::lock_guard<std::mutex> lk(abort_mu_);
  if (announced_) return;
  announced_ = true;
  // The failed op returns after this: its buffers go back to the user, so no
  // progress thread may touch them any more.
  for (auto* c : conns_)
    if (c) c->fence();
  std::string msg(sizeof(CtrlHeader), '\0');
  CtrlHeader h{kCtrlMagic, static_cast<uint32_t>(std::min(reason.size(), kMaxReason))};
  std::memcpy(msg.data(), &h, sizeof(h));
  msg.append(reason, 0, h.len);
  for (auto& p : peers_) {
    if (!p) continue;
    // Best effort and bounded: a dead peer must not delay our own failure.
    Status st = send_all(p->ctrl.get(), msg.data(), msg.size(), deadline_after(1.0));
    if (!st.is_ok()) LOOM_INFO(kLogNet, "could not tell {} about the abort: {}", p->label, st.message());
  }
  notify();
}

}  // namespace loom
