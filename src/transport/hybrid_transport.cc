#include "transport/hybrid_transport.h"

#include <fmt/format.h>

#include "core/log.h"

namespace loom {

Result<TransportMode> parse_transport_mode(const std::string& text) {
  if (text.empty() || text == "auto") return TransportMode::kAuto;
  if (text == "shm") return TransportMode::kShm;
  if (text == "socket") return TransportMode::kSocket;
  return invalid_argument("LOOM_TRANSPORT='" + text + "': expected auto, shm or socket");
}

Result<std::unique_ptr<HybridTransport>> HybridTransport::create(Bootstrap& boot, TransportMode mode,
                                                                 size_t shm_fifo_bytes, Deadline deadline,
                                                                 const std::atomic<bool>* abort) {
  const int n = boot.nranks(), r = boot.rank();
  const auto& peers = boot.peers();
  auto host = [&](int i) { return std::string(peers[i].hostname, strnlen(peers[i].hostname, sizeof(peers[i].hostname))); };
  // Every rank sees the same table, so every rank reaches the same decisions
  // (whether the socket transport's collective setup runs at all).
  std::vector<bool> local(n), remote(n);
  bool any_remote_pair = false;
  for (int i = 0; i < n; ++i) {
    local[i] = peers[i].host_hash == peers[r].host_hash;
    for (int j = 0; j < n; ++j) any_remote_pair = any_remote_pair || peers[i].host_hash != peers[j].host_hash;
  }
  if (mode == TransportMode::kShm) {
    for (int i = 0; i < n; ++i)
      if (!local[i])
        return invalid_argument(fmt::format(
            "LOOM_TRANSPORT=shm but rank {} runs on host '{}' and rank {} on host '{}' (another host identity): "
            "shared memory cannot reach it; use LOOM_TRANSPORT=auto or socket",
            r, host(r), i, host(i)));
  }
  std::unique_ptr<HybridTransport> t(new HybridTransport());
  std::vector<bool> shm_peers = local, sock_peers(n, false);
  for (int i = 0; i < n; ++i) {
    sock_peers[i] = i != r && (mode == TransportMode::kSocket || !local[i]);
    if (i != r && sock_peers[i]) shm_peers[i] = false;
  }
  // The shm segment of this rank always exists: it holds the doorbell.
  LOOM_ASSIGN_OR_RETURN(t->shm_, ShmTransport::create(boot, shm_peers, shm_fifo_bytes, deadline));
  const bool need_socket = mode == TransportMode::kSocket ? n > 1 : any_remote_pair;
  if (need_socket) {
    SocketTransport::Options opt = SocketTransport::Options::from_env();
    ShmTransport* shm = t->shm_.get();
    opt.notify = [shm] { shm->wake_self(); };
    opt.abort = abort;
    LOOM_ASSIGN_OR_RETURN(t->socket_, SocketTransport::create(boot, sock_peers, opt, deadline));
  }
  int nshm = 0, nsock = 0;
  for (int i = 0; i < n; ++i) {
    if (i == r) continue;
    if (t->socket_ && t->socket_->reaches(i)) ++nsock;
    else if (local[i]) ++nshm;
  }
  t->name_ = nsock == 0 ? "shm" : nshm == 0 ? "socket" : "shm+socket";
  LOOM_INFO(kLogInit, "rank {}: transport {} ({} peers over shm, {} over sockets)", r, t->name_, nshm, nsock);
  return t;
}

HybridTransport::~HybridTransport() {
  // Socket threads ring the shm doorbell: stop them first.
  socket_.reset();
  shm_.reset();
}

Connection* HybridTransport::connection(int peer) {
  if (socket_ && socket_->reaches(peer)) return socket_->connection(peer);
  return shm_->connection(peer);
}

Status HybridTransport::check_peer(int peer) {
  if (socket_ && socket_->reaches(peer)) return socket_->check_peer(peer);
  return shm_->check_peer(peer);
}

void HybridTransport::announce_abort(const std::string& reason) {
  shm_->announce_abort(reason);
  if (socket_) socket_->announce_abort(reason);
}

}  // namespace loom
