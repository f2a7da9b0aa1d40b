#include "bootstrap/bootstrap.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include "core/hash.h"
#include "core/config.h"
#include "core/log.h"

namespace loom {
namespace {

constexpr char kUidMagic[8] = {'L', 'O', 'O', 'M', 'U', 'I', 'D', '1'};
constexpr uint32_t kHelloMagic = 0x4c4f4f4d;  // "LOOM"
constexpr uint32_t kRingMagic = 0x4c4f5247;   // "LORG"
constexpr uint32_t kShrinkMagic = 0x4c4f5348;  // "LOSH": never taken for a ring hello
constexpr int32_t kMaxShrinkList = 1 << 20;
constexpr uint32_t kMaxRoundPayload = 1u << 20;
// What a star round is for (in every hello: mismatched calls get a precise error).
constexpr uint32_t kRoundShrink = 1;  // the coordinator answers with a new unique id
constexpr uint32_t kRoundGather = 2;  // the coordinator answers with every payload, in rank order

const char* round_name(uint32_t kind) {
  switch (kind) {
    case kRoundShrink: return "shrink";
    case kRoundGather: return "star allgather";
    default: return "an unknown star round";
  }
}

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

// Followed by nexcluded int32 ranks, then payload_bytes bytes.
struct ShrinkHello {
  uint32_t magic;
  uint32_t generation;
  uint64_t secret;
  int32_t rank;
  int32_t nexcluded;
  uint32_t kind;           // kRoundShrink or kRoundGather
  uint32_t payload_bytes;  // follow the exclude list
};

struct Reply {
  uint32_t ok;   // 1 = table follows, 0 = error text follows
  uint32_t len;  // bytes that follow
};


void send_reply(int fd, bool ok, const void* data, uint32_t len) {
  Reply r{ok ? 1u : 0u, len};
  Deadline dl = deadline_after(5);
  if (send_all(fd, &r, sizeof(r), dl).is_ok() && len) (void)send_all(fd, data, len, dl);
}

std::string rank_list(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
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
  if (!error.empty() && infos.empty() && nranks < 0) {
    // Nobody came: an id that was made and never used (ncclCommInitRank
    // Scalable leaves all roots but the first one unused; NCCL's root of an
    // unused id waits silently). Not a failure anybody sees; the ranks that
    // did use it, if any, fail on their own. Regression: a WARN 300 s into
    // the job (NcclCompat.AnUnusedUniqueIdWarnsNobody).
    LOOM_INFO(kLogBoot, "rendezvous root closes unused after its deadline: no rank came");
    return;
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

Result<UniqueId> make_unique_id(const SockAddr& bind, double timeout_s) {
  UidContents c;
  c.secret = random_secret();
  LOOM_ASSIGN_OR_RETURN(c.root, start_root(bind, c.secret, timeout_s > 0 ? timeout_s : params::timeout_s()));
  return encode_uid(c);
}

Result<UniqueId> Bootstrap::new_unique_id(double timeout_s) const {
  SockAddr bind = peers_[rank_].listen();
  bind.set_port(0);
  return make_unique_id(bind, timeout_s);
}

Result<UniqueId> Bootstrap::shrink_rendezvous(const std::vector<int>& excluded, Deadline deadline,
                                              double root_timeout_s) {
  LOOM_ASSIGN_OR_RETURN(std::string reply,
                        star_round(kRoundShrink, excluded, std::string(), deadline, root_timeout_s));
  if (reply.size() != sizeof(UniqueId)) return remote_error("shrink: reply of wrong size from the coordinator");
  UniqueId id;
  std::memcpy(id.bytes, reply.data(), sizeof(id.bytes));
  return id;
}

Status Bootstrap::star_allgather(void* data, size_t bytes, Deadline deadline) {
  if (nranks_ == 1 || bytes == 0) return Status::ok();
  char* d = static_cast<char*>(data);
  auto reply = star_round(kRoundGather, {}, std::string(d + rank_ * bytes, bytes), deadline);
  if (!reply.is_ok()) return reply.status();
  if (reply->size() != nranks_ * bytes) return remote_error("star allgather: reply of wrong size from the coordinator");
  std::memcpy(d, reply->data(), reply->size());
  return Status::ok();
}

Result<std::string> Bootstrap::star_round(uint32_t kind, const std::vector<int>& excluded, const std::string& payload,
                                          Deadline deadline, double root_timeout_s) {
  const char* what = round_name(kind);
  const uint32_t gen = ++shrink_gen_;
  std::vector<bool> gone(nranks_, false);
  for (int r : excluded) {
    if (r < 0 || r >= nranks_ || r == rank_)
      return invalid_argument(std::string(what) + " rendezvous: bad exclude list " + rank_list(excluded));
    gone[r] = true;
  }
  if (payload.size() > kMaxRoundPayload) return invalid_argument(std::string(what) + " rendezvous: payload too large");
  std::vector<int> survivors;
  for (int r = 0; r < nranks_; ++r)
    if (!gone[r]) survivors.push_back(r);
  const int coord = survivors.front();

  if (coord != rank_) {
    // The abort flag is ignored on purpose: the parent is often aborted or revoked.
    SockAddr to = peers_[coord].listen();
    auto fd = tcp_connect(to, deadline, nullptr);
    if (!fd.is_ok())
      return fd.status().with_context(fmt::format("{}: cannot reach the coordinator, rank {} at {}", what, coord,
                                                  to.to_string()));
    ShrinkHello h{kShrinkMagic, gen, secret_, rank_, static_cast<int32_t>(excluded.size()), kind,
                  static_cast<uint32_t>(payload.size())};
    std::vector<int32_t> list(excluded.begin(), excluded.end());
    Status st = send_all(fd->get(), &h, sizeof(h), deadline, nullptr);
    if (st.is_ok() && !list.empty()) st = send_all(fd->get(), list.data(), list.size() * sizeof(int32_t), deadline, nullptr);
    if (st.is_ok() && !payload.empty()) st = send_all(fd->get(), payload.data(), payload.size(), deadline, nullptr);
    Reply rep{};
    if (st.is_ok()) st = recv_all(fd->get(), &rep, sizeof(rep), deadline, nullptr);
    if (!st.is_ok())
      return st.with_context(fmt::format("{}: waiting for the coordinator, rank {} (the lowest rank not excluded)", what,
                                         coord));
    if (rep.len > (64u << 20)) return remote_error(std::string(what) + ": absurd reply size from the coordinator");
    std::string answer(rep.len, '\0');
    LOOM_RETURN_IF_ERROR(recv_all(fd->get(), answer.data(), rep.len, deadline, nullptr).with_context(what));
    if (!rep.ok) return invalid_usage(std::string(what) + " failed: " + answer);
    return answer;
  }

  // Coordinator: one hello from every other survivor (by this rank's list).
  // Answer a little before the survivors give up, so that they receive the
  // precise error (who did not come) rather than a timeout of their own.
  Deadline accept_dl = deadline;
  if (deadline - Clock::now() > std::chrono::seconds(4)) accept_dl = deadline - std::chrono::seconds(2);
  if (shrink_answered_.empty()) shrink_answered_.assign(nranks_, 0);
  std::vector<ShrinkArrival> here;  // at most one per rank
  std::vector<int> arrived(nranks_, 0);
  size_t count = 0;
  std::string error;
  // Takes one hello into this round, keeps it for a later one, or drops it.
  auto take = [&](ShrinkArrival a) {
    const int r = a.rank;
    if (r < 0 || r >= nranks_) {
      if (error.empty())
        error = fmt::format("a process called {} as rank {} of {}", round_name(a.kind), r, nranks_);
      here.push_back(std::move(a));
      return;
    }
    if (a.generation <= shrink_answered_[r]) {
      LOOM_WARN(kLogBoot, "rank {}: {} dropped a stale hello of rank {} (generation {}, answered up to {})", rank_, what,
                r, a.generation, shrink_answered_[r]);
      return;
    }
    if (gone[r]) {
      shrink_pending_.push_back(std::move(a));  // left out of this round: maybe in the next one
      return;
    }
    for (auto& h : here) {
      if (h.rank != r) continue;
      if (h.generation == a.generation) {
        if (error.empty()) error = fmt::format("rank {} called {} twice", r, what);
        here.push_back(std::move(a));
      } else if (h.generation < a.generation) {
        LOOM_WARN(kLogBoot, "rank {}: {} replaced a stale hello of rank {} (generation {} by {})", rank_, what, r,
                  h.generation, a.generation);
        h = std::move(a);
      }
      return;
    }
    if (error.empty() && a.kind != kind)
      error = fmt::format("rank {} called {} while rank {} called {}", r, round_name(a.kind), rank_, what);
    if (error.empty() && a.excluded != excluded)
      error = "exclude lists differ: rank " + std::to_string(r) + " excludes " + rank_list(a.excluded) + ", rank " +
              std::to_string(rank_) + " excludes " + rank_list(excluded);
    if (error.empty() && a.payload.size() != payload.size())
      error = fmt::format("{}: rank {} sent {} bytes, rank {} {}", what, r, a.payload.size(), rank_, payload.size());
    arrived[r] = 1;
    ++count;
    here.push_back(std::move(a));
  };
  {
    std::vector<ShrinkArrival> kept;
    kept.swap(shrink_pending_);
    for (auto& a : kept) take(std::move(a));
  }
  for (;;) {
    while (count + 1 < survivors.size()) {
      SockAddr from;
      auto fd = tcp_accept(listen_.get(), accept_dl, nullptr, &from);
      if (!fd.is_ok()) break;
      ShrinkHello h{};
      Deadline short_dl = std::min(deadline, deadline_after(5));
      Status st = recv_all(fd->get(), &h, sizeof(h), short_dl, nullptr);
      if (!st.is_ok() || h.magic != kShrinkMagic || h.secret != secret_ || h.nexcluded < 0 ||
          h.nexcluded > kMaxShrinkList || h.payload_bytes > kMaxRoundPayload) {
        // Strangers, a late ring hello (other magic), garbage.
        LOOM_WARN(kLogBoot, "rank {}: {} dropped a connection from {} ({})", rank_, what, from.to_string(),
                  !st.is_ok() ? st.message() : std::string("wrong magic, secret or sizes"));
        continue;
      }
      ShrinkArrival a;
      a.rank = h.rank;
      a.generation = h.generation;
      a.kind = h.kind;
      if (h.nexcluded > 0) {
        std::vector<int32_t> list(static_cast<size_t>(h.nexcluded));
        st = recv_all(fd->get(), list.data(), list.size() * sizeof(int32_t), short_dl, nullptr);
        a.excluded.assign(list.begin(), list.end());
      }
      if (st.is_ok() && h.payload_bytes > 0) {
        a.payload.assign(h.payload_bytes, '\0');
        st = recv_all(fd->get(), a.payload.data(), a.payload.size(), short_dl, nullptr);
      }
      if (!st.is_ok()) {
        LOOM_WARN(kLogBoot, "rank {}: {} dropped a hello from {} ({})", rank_, what, from.to_string(), st.message());
        continue;
      }
      a.fd = std::move(fd).value();
      take(std::move(a));
    }
    if (count + 1 < survivors.size()) {
      std::vector<int> missing;
      for (int r : survivors)
        if (r != rank_ && !arrived[r]) missing.push_back(r);
      if (error.empty())
        error = fmt::format("survivor rank(s) {} did not call {} before the deadline (exclude list {}; dead ranks must "
                            "be excluded)", rank_list(missing), what, rank_list(excluded));
      break;
    }
    // A survivor that gave up (closed) was not really here: wait for its retry.
    bool lost = false;
    for (auto it = here.begin(); it != here.end();) {
      char c;
      if (it->rank >= 0 && it->rank < nranks_ && recv(it->fd.get(), &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0) {
        LOOM_WARN(kLogBoot, "rank {}: {}: rank {} closed its connection before the answer", rank_, what, it->rank);
        arrived[it->rank] = 0;
        --count;
        lost = true;
        it = here.erase(it);
      } else {
        ++it;
      }
    }
    if (!lost || !error.empty()) break;
  }
  for (const auto& a : here)
    if (a.rank >= 0 && a.rank < nranks_) shrink_answered_[a.rank] = std::max(shrink_answered_[a.rank], a.generation);
  std::string answer;
  if (error.empty() && kind == kRoundShrink) {
    auto made = new_unique_id(root_timeout_s);
    if (made.is_ok()) answer.assign(made->bytes, sizeof(made->bytes));
    else error = "the coordinator could not create a unique id: " + made.status().message();
  } else if (error.empty()) {
    // Gather: every survivor's payload, in rank order.
    answer.resize(survivors.size() * payload.size());
    for (size_t i = 0; i < survivors.size(); ++i) {
      const std::string* p = &payload;
      for (const auto& a : here)
        if (a.rank == survivors[i]) p = &a.payload;
      std::memcpy(answer.data() + i * payload.size(), p->data(), payload.size());
    }
  }
  if (!error.empty()) {
    LOOM_WARN(kLogBoot, "rank {}: {} failed: {}", rank_, what, error);
    for (auto& a : here) send_reply(a.fd.get(), false, error.data(), static_cast<uint32_t>(error.size()));
    return invalid_usage(std::string(what) + " failed: " + error);
  }
  for (auto& a : here) send_reply(a.fd.get(), true, answer.data(), static_cast<uint32_t>(answer.size()));
  return answer;
}

}  // namespace loom
