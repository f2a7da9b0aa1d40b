// The transport a communicator uses: shared memory between ranks of one host,
// TCP sockets between hosts (LOOM_TRANSPORT=auto), or one of them forced
// (LOOM_TRANSPORT=shm|socket).
//
// The shm transport always exists because its futex doorbell is the one the
// executor sleeps on; the socket transport's progress threads ring it when
// they deliver bytes or free space, so one wait covers both transports.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "transport/shm/shm_transport.h"
#include "transport/socket/socket_transport.h"
#include "transport/transport.h"

namespace loom {

enum class TransportMode { kAuto, kShm, kSocket };
Result<TransportMode> parse_transport_mode(const std::string& text);

class HybridTransport final : public Transport {
 public:
  // Collective over `boot`. Every rank must use the same mode.
  static Result<std::unique_ptr<HybridTransport>> create(Bootstrap& boot, TransportMode mode, size_t shm_fifo_bytes,
                                                         Deadline deadline, const std::atomic<bool>* abort);
  ~HybridTransport() override;

  const char* name() const override { return name_.c_str(); }
  Connection* connection(int peer) override;
  uint32_t events() override { return shm_->events(); }
  void wait_events(uint32_t seen, std::chrono::microseconds timeout) override { shm_->wait_events(seen, timeout); }
  void arm_wait() override { shm_->arm_wait(); }
  void disarm_wait() override { shm_->disarm_wait(); }
  void hold_doorbells() override { shm_->hold_doorbells(); }
  void ring_owed() override { shm_->ring_owed(); }
  void release_doorbells() override { shm_->release_doorbells(); }
  Status check_peer(int peer) override;
  void announce_abort(const std::string& reason) override;
  void wake_self() override { shm_->wake_self(); }

 private:
  HybridTransport() = default;
  std::string name_;
  std::unique_ptr<ShmTransport> shm_;
  std::unique_ptr<SocketTransport> socket_;  // null when no peer needs it
};

}  // namespace loom
