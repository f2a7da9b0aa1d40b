// The per-process diagnostics hub: a registry of this process's
// communicators, the watchdog thread, the dump writer (LOOM_DUMP_DIR, also on
// SIGUSR1) and the live query server (LOOM_DIAG_ADDR). Started with the first
// communicator; never destroyed (threads may outlive main's statics).
//
// State schema (one JSON object per process, "loom-diag" version 2) is
// documented in docs/troubleshooting.md; dumps and live answers use the same.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "bootstrap/socket.h"

namespace loom::diag {

// 2 added host_id / host_hash per process and host_hash / addr per peer; the
// doctor still reads version 1 dumps (without host grouping).
inline constexpr int kSchemaVersion = 2;
inline constexpr int kOldestSchemaVersion = 1;

// Implemented by CommImpl.
class DiagClient {
 public:
  virtual ~DiagClient() = default;
  // This communicator's state (see the schema); called from any thread.
  // `max_ops`: the newest flight-recorder entries rendered (all by default).
  virtual nlohmann::json diag_state(size_t max_ops = SIZE_MAX) = 0;
  // Watchdog tick (every ~100 ms): deadlines, peers that failed while this
  // communicator is idle. May fail the communicator.
  virtual void diag_tick() = 0;
};

class Hub {
 public:
  static Hub& get();
  // `bind_ip` is where the query server listens unless LOOM_DIAG_ADDR says
  // otherwise (the bootstrap's address, so peers on other hosts reach it).
  // Starts the watchdog and the query server once; returns the server's
  // address ("" when disabled).
  std::string start(const SockAddr& bind_ip);
  void add(DiagClient* c);
  void remove(DiagClient* c);  // waits for a running tick / snapshot of c
  // The query server's address ("" when disabled).
  std::string address();
  // One watchdog tick of every communicator (what the watchdog thread does
  // every 100 ms), serialized with it; for tests that tick faster.
  void tick();

  // Writes this process's state to LOOM_DUMP_DIR (no-op when unset).
  // `announce`: also ask every peer's diag server to dump (coordinated dump).
  void dump(const std::string& reason, bool announce);
  // This process's state as one JSON object ("loom-diag" schema).
  nlohmann::json state(const std::string& reason);
  std::string state_text();
  // Every rank's state, gathered through the peers' diag servers.
  nlohmann::json gather(double timeout_s);

  struct Impl;

 private:
  Hub();
  Impl* impl_;
};

// Sends one request line to a diag server and returns its whole answer.
Result<std::string> query(const std::string& addr, const std::string& request, double timeout_s);

}  // namespace loom::diag
