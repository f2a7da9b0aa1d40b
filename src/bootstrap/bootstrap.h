// Out-of-band bootstrap: rendezvous through a root, then a TCP ring among the
// ranks for small allgathers and barriers (topology, shm names, split).
//
// Rendezvous: every rank connects to the root named by the unique id and
// presents the id's secret, its rank, nranks, pid, host hash and the address it
// listens on. The root checks that all ranks agree on nranks and that each rank
// appears once, then sends every rank the full table (or the one precise error
// to everyone) and exits. Connections with a wrong secret or garbage are dropped
// with a warning and never trusted.
//
// Shrink: after init each rank keeps its listening socket. shrink_rendezvous
// lets the survivors of a communicator (those not excluded; excluded ranks may
// be dead and take no part) agree on a fresh unique id without the ring: the
// lowest survivor accepts one hello from every other survivor on its listen
// socket and answers each with the id it created, or with the one precise
// error (exclude lists that differ, a survivor that never came) to everyone.
// The same star carries star_allgather (split of a revoked communicator).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/socket.h"
#include "loom/comm.h"

namespace loom {

// Decoded form of UniqueId.
struct UidContents {
  uint64_t secret = 0;
  SockAddr root;
};
UniqueId encode_uid(const UidContents& c);
Result<UidContents> decode_uid(const UniqueId& id);

struct PeerInfo {
  int32_t rank = -1;
  int32_t nranks = 0;
  int32_t pid = 0;
  uint64_t host_hash = 0;
  uint16_t listen_family = 0;
  uint16_t listen_port = 0;
  uint8_t listen_addr[16] = {};
  char hostname[64] = {};

  SockAddr listen() const;
  void set_listen(const SockAddr& a);
};

// Hash of hostname + boot id, or of LOOM_HOST_ID when set (tests fake hosts).
uint64_t host_hash();
std::string host_name();

// Starts the rendezvous root on `bind` in a detached thread that lives until
// all nranks ranks have met or `timeout_s` passed. Returns the bound address.
Result<SockAddr> start_root(const SockAddr& bind, uint64_t secret, double timeout_s);
uint64_t random_secret();
// A fresh unique id (random secret) whose root listens on `bind`.
Result<UniqueId> make_unique_id(const SockAddr& bind, double timeout_s);

class Bootstrap {
 public:
  ~Bootstrap();
  // Meets the other ranks through the root and builds the ring.
  static Result<std::unique_ptr<Bootstrap>> connect(const UidContents& uid, int nranks, int rank, Deadline deadline,
                                                    const std::atomic<bool>* abort = nullptr);

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  const std::vector<PeerInfo>& peers() const { return peers_; }
  uint64_t secret() const { return secret_; }

  // data holds nranks * bytes; this rank's block (at rank*bytes) is sent to all.
  Status allgather(void* data, size_t bytes, Deadline deadline);
  Status barrier(Deadline deadline);
  void set_abort_flag(const std::atomic<bool>* abort) { abort_ = abort; }

  // Survivors-only rendezvous for Comm::shrink. `excluded` must be sorted,
  // unique, in range and not hold this rank. Every survivor calls it with the
  // same list; the result is the unique id of the shrunk communicator. Does
  // not use the ring (a dead rank breaks it) and ignores the abort flag (the
  // parent is usually aborted first). Each call advances this rank's
  // generation counter; the coordinator drops a hello whose generation it has
  // already answered (left over from an earlier, failed round), lets a newer
  // hello of the same rank replace an older one, and keeps hellos of ranks it
  // excludes for a later round (a rank left out of one shrink may take part
  // in the next one, one generation behind the others).
  // The new communicator's rendezvous root lives root_timeout_s (its init's
  // timeout).
  Result<UniqueId> shrink_rendezvous(const std::vector<int>& excluded, Deadline deadline, double root_timeout_s);
  // Allgather (same layout as allgather) through the same star rendezvous,
  // every rank taking part: for a communicator whose ring cannot be trusted
  // any more (Comm::split after revoke). Ignores the abort flag.
  Status star_allgather(void* data, size_t bytes, Deadline deadline);

  // A unique id for a communicator made of some of these ranks (split,
  // shrink): its root listens on this rank's bootstrap address, which every
  // peer has already reached, so it works across hosts whatever
  // LOOM_SOCKET_IFNAME says. The root lives timeout_s.
  Result<UniqueId> new_unique_id(double timeout_s) const;

 private:
  Bootstrap() = default;
  int rank_ = 0, nranks_ = 0;
  uint64_t secret_ = 0;
  std::vector<PeerInfo> peers_;
  Fd listen_, next_, prev_;
  const std::atomic<bool>* abort_ = nullptr;
  uint32_t shrink_gen_ = 0;
  // One star round (shrink_rendezvous, star_allgather): the lowest rank not
  // excluded collects a hello (kind, exclude list, payload) from every other
  // one and answers all with the same bytes or the same error.
  Result<std::string> star_round(uint32_t kind, const std::vector<int>& excluded, const std::string& payload,
                                 Deadline deadline, double root_timeout_s = 0);
  // Coordinator side of shrink_rendezvous.
  struct ShrinkArrival {
    Fd fd;
    int32_t rank = -1;
    uint32_t generation = 0;
    std::vector<int> excluded;
    uint32_t kind = 0;
    std::string payload;
  };
  std::vector<uint32_t> shrink_answered_;      // per rank: highest generation answered
  std::vector<ShrinkArrival> shrink_pending_;  // hellos kept for a later round
};

}  // namespace loom
