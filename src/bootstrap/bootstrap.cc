#include "bootstrap/bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include "core/config.h"
#include "core/log.h"

namespace loom {
namespace {

constexpr char kUidMagic[8] = {'L', 'O', 'O', 'M', 'U', 'I', 'D', '1'};
constexpr uint32_t kHelloMagic = 0x4c4f4f4d;  // "LOOM"
constexpr uint32_t kRingMagic = 0x4c4f5247;   // "LORG"

struct Hello {
  uint32_t magic;
  uint32_t version;
  uint64_t secret;
  PeerInfo info;
};

struct RingHello {
  uint32_t magic;
  int32_t rank;
  uint64_t secret;
};

struct Reply {
  uint32_t ok;   // 1 = table follows, 0 = error text follows
  uint32_t len;  // bytes that follow
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

void send_reply(int fd, bool ok, const void* data, uint32_t len) {
  Reply r{ok ? 1u : 0u, len};
  Deadline dl = deadline_after(5);
  if (send_all(fd, &r, sizeof(r), dl).is_ok() && len) (void)send_all(fd, data, len, dl);
}

void root_main(Fd listen_fd, uint64_t secret, double timeout_s) {
  Deadline deadline = deadline_after(timeout_s);
  std::vector<Fd> conns;
  std::vector<PeerInfo> infos;
  int nranks = -1;
  std::string error;
  while (error.empty() && (nranks < 0 || static_cast<int>(infos.size()) < nranks)) {
    SockAddr peer;
    auto fd = tcp_accept(listen_fd.get(), deadline, nullptr, &peer);
    if (!fd.is_ok()) {
      error = "rendezvous root: only " + std::to_string(infos.size()) + " of " +
              (nranks < 0 ? std::string("?") : std::to_string(nranks)) + " ranks arrived before the deadline";
      break;
    }
    Hello h{};
    // A foreign or silent client may not stall the rendezvous for long.
    Status st = recv_all(fd->get(), &h, sizeof(h), deadline_after(std::min(5.0, timeout_s)));
    if (!st.is_ok() || h.magic != kHelloMagic || h.secret != secret) {
      LOOM_WARN(kLogBoot, "rendezvous root: dropped a connection from {} ({})", peer.to_string(),
                !st.is_ok() ? st.message() : "wrong magic or secret");
      continue;
    }
    const PeerInfo& pi = h.info;
    if (nranks < 0) nranks = pi.nranks;
    if (pi.nranks != nranks) {
      error = "rank " + std::to_string(pi.rank) + " called init with nranks=" + std::to_string(pi.nranks) +
              " but rank " + std::to_string(infos.empty() ? -1 : infos[0].rank) + " with nranks=" +
              std::to_string(nranks);
    } else if (pi.rank < 0 || pi.rank >= nranks) {
      error = "a rank called init with rank=" + std::to_string(pi.rank) + " >= nranks=" + std::to_string(nranks);
    } else {
      for (const auto& o : infos)
        if (o.rank == pi.rank)
          error = "two processes called init with rank " + std::to_string(pi.rank) + " (pids " +
                  std::to_string(o.pid) + " and " + std::to_string(pi.pid) + ")";
    }
    conns.push_back(std::move(fd).value());
    infos.push_back(pi);
  }
  if (!error.empty()) {
    LOOM_WARN(kLogBoot, "rendezvous failed: {}", error);
    for (auto& c : conns) send_reply(c.get(), false, error.data(), static_cast<uint32_t>(error.size()));
    return;
  }
  std::vector<PeerInfo> table(nranks);
  for (const auto& pi : infos) table[pi.rank] = pi;
  for (auto& c : conns)
    send_reply(c.get(), true, table.data(), static_cast<uint32_t>(table.size() * sizeof(PeerInfo)));
}

}  // namespace

SockAddr PeerInfo::listen() const {
  SockAddr a;
  if (listen_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_addr, listen_addr, 4);
    a.len = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
    in6->sin6_family = AF_INET6;
    std::memcpy(&in6->sin6_addr, listen_addr, 16);
    a.len = sizeof(sockaddr_in6);
  }
  a.set_port(listen_port);
  return a;
}

void PeerInfo::set_listen(const SockAddr& a) {
  listen_family = static_cast<uint16_t>(a.family());
  listen_port = a.port();
  if (a.family() == AF_INET) std::memcpy(listen_addr, &reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr, 4);
  else std::memcpy(listen_addr, &reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr, 16);
}

UniqueId encode_uid(const UidContents& c) {
  UniqueId id;
  std::memcpy(id.bytes, kUidMagic, 8);
  std::memcpy(id.bytes + 8, &c.secret, 8);
  PeerInfo tmp;
  tmp.set_listen(c.root);
  std::memcpy(id.bytes + 16, &tmp.listen_family, 2);
  std::memcpy(id.bytes + 18, &tmp.listen_port, 2);
  std::memcpy(id.bytes + 20, tmp.listen_addr, 16);
  return id;
}

Result<UidContents> decode_uid(const UniqueId& id) {
  if (std::memcmp(id.bytes, kUidMagic, 8) != 0)
    return invalid_argument("unique id is not a Loom unique id (bad magic): was it created by get_unique_id?");
  UidContents c;
  std::memcpy(&c.secret, id.bytes + 8, 8);
  PeerInfo tmp;
  std::memcpy(&tmp.listen_family, id.bytes + 16, 2);
  std::memcpy(&tmp.listen_port, id.bytes + 18, 2);
  std::memcpy(tmp.listen_addr, id.bytes + 20, 16);
  if (tmp.listen_family != AF_INET && tmp.listen_family != AF_INET6)
    return invalid_argument("unique id holds no valid root address");
  c.root = tmp.listen();
  return c;
}

std::string host_name() {
  char h[256] = {};
  gethostname(h, sizeof(h) - 1);
  return h;
}

uint64_t host_hash() {
  std::string id = env_string("LOOM_HOST_ID", "");
  if (!id.empty()) return fnv1a("hostid:" + id);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return fnv1a(host_name() + "|" + boot);
}

uint64_t random_secret() {
  uint64_t s = 0;
  if (getrandom(&s, sizeof(s), 0) != sizeof(s)) s = static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^ getpid();
  return s;
}

Result<SockAddr> start_root(const SockAddr& bind, uint64_t secret, double timeout_s) {
  SockAddr bound;
  LOOM_ASSIGN_OR_RETURN(Fd fd, tcp_listen(bind, &bound));
  std::thread(root_main, std::move(fd), secret, timeout_s).detach();
  return bound;
}

Bootstrap::~Bootstrap() = default;

Result<std::unique_ptr<Bootstrap>> Bootstrap::connect(const UidContents& uid, int nranks, int rank, Deadline deadline,
                                                      const std::atomic<bool>* abort) {
  std::unique_ptr<Bootstrap> b(new Bootstrap());
  b->rank_ = rank;
  b->nranks_ = nranks;
  b->secret_ = uid.secret;
  b->abort_ = abort;
  // Listen where the root can be reached from: the same interface.
  SockAddr listen_on;
  if (uid.root.is_loopback()) {
    listen_on = uid.root;
    listen_on.set_port(0);
  } else {
    LOOM_ASSIGN_OR_RETURN(listen_on, local_addr_towards(uid.root));
  }
  SockAddr bound;
  LOOM_ASSIGN_OR_RETURN(b->listen_, tcp_listen(listen_on, &bound));

  Hello h{};
  h.magic = kHelloMagic;
  h.version = 1;
  h.secret = uid.secret;
  h.info.rank = rank;
  h.info.nranks = nranks;
  h.info.pid = getpid();
  h.info.host_hash = host_hash();
  h.info.set_listen(bound);
  std::strncpy(h.info.hostname, host_name().c_str(), sizeof(h.info.hostname) - 1);

  {
    LOOM_ASSIGN_OR_RETURN(Fd root, tcp_connect(uid.root, deadline, abort));
    LOOM_RETURN_IF_ERROR(send_all(root.get(), &h, sizeof(h), deadline, abort).with_context("rendezvous"));
    Reply rep{};
    Status st = recv_all(root.get(), &rep, sizeof(rep), deadline, abort);
    if (!st.is_ok()) return st.with_context("waiting for the other ranks at the rendezvous root " + uid.root.to_string());
    if (rep.len > (64u << 20)) return remote_error("rendezvous: absurd reply size from root");
    std::string payload(rep.len, '\0');
    LOOM_RETURN_IF_ERROR(recv_all(root.get(), payload.data(), rep.len, deadline, abort).with_context("rendezvous"));
    if (!rep.ok) return invalid_argument("init failed at rendezvous: " + payload);
    if (rep.len != nranks * sizeof(PeerInfo)) return remote_error("rendezvous: table of wrong size");
    b->peers_.resize(nranks);
    std::memcpy(b->peers_.data(), payload.data(), rep.len);
  }
  if (nranks == 1) return b;

  // Ring: connect to next, accept from prev (dropping strangers).
  const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  LOOM_ASSIGN_OR_RETURN(b->next_, tcp_connect(b->peers_[next].listen(), deadline, abort));
  RingHello rh{kRingMagic, rank, uid.secret};
  LOOM_RETURN_IF_ERROR(send_all(b->next_.get(), &rh, sizeof(rh), deadline, abort));
  for (;;) {
    SockAddr from;
    LOOM_ASSIGN_OR_RETURN(Fd c, tcp_accept(b->listen_.get(), deadline, abort, &from));
    RingHello in{};
    Status st = recv_all(c.get(), &in, sizeof(in), std::min(deadline, deadline_after(5)), abort);
    if (st.is_ok() && in.magic == kRingMagic && in.secret == uid.secret && in.rank == prev) {
      b->prev_ = std::move(c);
      break;
    }
    LOOM_WARN(kLogBoot, "rank {}: dropped a bootstrap connection from {} ({})", rank, from.to_string(),
              st.is_ok() ? "wrong magic, secret or rank" : st.message());
  }
  return b;
}

Status Bootstrap::allgather(void* data, size_t bytes, Deadline deadline) {
  if (nranks_ == 1 || bytes == 0) return Status::ok();
  char* d = static_cast<char*>(data);
  for (int s = 0; s < nranks_ - 1; ++s) {
    int sb = (rank_ - s + nranks_) % nranks_, rb = (rank_ - s - 1 + nranks_) % nranks_;
    // Small payloads: the kernel's socket buffer absorbs the send.
    Status st = send_all(next_.get(), d + sb * bytes, bytes, deadline, abort_);
    if (!st.is_ok()) return st.with_context("bootstrap allgather: sending to rank " + std::to_string((rank_ + 1) % nranks_));
    st = recv_all(prev_.get(), d + rb * bytes, bytes, deadline, abort_);
    if (!st.is_ok())
      return st.with_context("bootstrap allgather: receiving from rank " + std::to_string((rank_ + nranks_ - 1) % nranks_));
  }
  return Status::ok();
}

Status Bootstrap::barrier(Deadline deadline) {
  std::vector<char> tmp(nranks_);
  return allgather(tmp.data(), 1, deadline);
}

}  // namespace loom
