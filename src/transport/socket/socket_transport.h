// TCP socket transport for ranks on different hosts (or every rank, with
// LOOM_TRANSPORT=socket).
//
// Per remote peer: a SocketConnection (staging rings + LOOM_SOCKET_NSOCKS data
// streams) and one control stream that carries abort announcements, so a
// failing rank makes its remote peers fail fast with its reason, and the
// orderly-close notice of a rank that destroys its communicator (how many
// bytes it sent; its peers keep draining them after it left). A few
// progress threads (LOOM_SOCKET_NTHREADS) move bytes between the rings and the
// non-blocking sockets; each stream belongs to exactly one thread. When a
// thread delivers bytes or frees outgoing space it rings this transport's
// doorbell and calls the `notify` hook (the hybrid transport passes the shm
// doorbell, which is the one the executor sleeps on).
//
// Setup (collective over the bootstrap): every rank listens, the listen
// addresses are allgathered, the lower rank of each pair connects and opens
// each stream with a hello (secret, rank, stream index, stream count, slice
// size). Connections without the secret, with garbage or with nothing are
// dropped with a warning and never trusted. The listener is closed once all
// expected streams arrived.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "transport/socket/socket_connection.h"
#include "transport/transport.h"

namespace loom {

class SocketTransport final : public Transport {
 public:
  struct Options {
    int nsocks = 2;
    int nthreads = 2;
    size_t slice_bytes = 64 << 10;
    size_t ring_bytes = 4 << 20;
    size_t sockbuf = 0;                                // 0: kernel autotuning
    size_t direct_bytes = 1 << 20;                     // messages this large bypass the rings; 0 = never
    std::function<void()> notify;                      // extra doorbell to ring on progress
    std::function<void(const SockAddr&)> on_listen;    // tests: learn the listen address
    const std::atomic<bool>* abort = nullptr;
    static Options from_env();                         // LOOM_SOCKET_*
  };

  // Collective over `boot` (every rank calls it with the same `use`): builds
  // connections to the peers p with use[p] (use[rank] is ignored).
  static Result<std::unique_ptr<SocketTransport>> create(Bootstrap& boot, const std::vector<bool>& use,
                                                         const Options& opt, Deadline deadline);
  ~SocketTransport() override;

  const char* name() const override { return "socket"; }
  Connection* connection(int peer) override;
  uint32_t events() override;
  void wait_events(uint32_t seen, std::chrono::microseconds timeout) override;
  Status check_peer(int peer) override;
  void announce_abort(const std::string& reason) override;
  void wake_self() override;

  bool reaches(int peer) const { return peer >= 0 && peer < nranks_ && conns_[peer] != nullptr; }
  // Times a progress thread slept a whole poll timeout although work was
  // waiting (a lost wake-up; tests expect 0).
  uint64_t missed_wakeups() const { return missed_wakeups_.load(std::memory_order_relaxed); }

  struct Worker;  // a progress thread (socket_transport.cc)
  struct Peer;    // connection + control stream of one remote rank

 private:
  SocketTransport() = default;
  Status setup(Bootstrap& boot, const std::vector<bool>& use, Deadline deadline);
  void start_workers();
  void worker_main(Worker& w);
  bool pump(Worker& w, std::vector<short>& wants);
  void read_control(Peer& p);
  void notify();

  int rank_ = 0, nranks_ = 0;
  Options opt_;
  std::vector<std::unique_ptr<Peer>> peers_;            // per rank; null when not ours
  std::vector<SocketConnection*> conns_;                // per rank; null when not ours
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<bool> stop_{false};
  alignas(64) std::atomic<uint32_t> bell_{0};
  alignas(64) std::atomic<uint32_t> waiters_{0};
  std::atomic<uint64_t> missed_wakeups_{0};
  std::mutex abort_mu_;
  bool announced_ = false;
};

}  // namespace loom
