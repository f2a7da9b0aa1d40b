// Shared-memory transport for ranks of one host (processes or threads).
//
// Each rank creates one POSIX shm segment holding a header (pid, abort flag
// and reason, a futex doorbell) and one inbound FIFO per peer. Peers map each
// other's segments; once every rank has mapped all segments (a bootstrap
// barrier) each rank unlinks its own, so nothing is left in /dev/shm even if a
// process is killed later. Writers copy into the receiver's FIFO; receivers
// reduce or copy straight out of it. Idle engines sleep on the doorbell futex
// after a short spin, so oversubscribed ranks do not starve each other.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "transport/transport.h"

namespace loom {

// The name of rank `rank`'s shared-memory segment (shm_open) for the
// communicator of `secret`, created by process `pid`: "/loom-<secret in 16 hex
// digits>-<rank>-<pid>". Each rank unlinks its own once every local peer has
// mapped it; a rank killed before that leaves it in /dev/shm, and loomrun,
// which knows its ranks' pids, removes what ends in "-<pid>" of a rank that
// has exited (tools/loomrun.cc relies on this form).
std::string shm_segment_name(uint64_t secret, int rank, int pid);

class ShmTransport final : public Transport {
 public:
  // Collective over `boot`: every rank of the bootstrap must call it.
  // `local[r]` says whether rank r shares this host (only those are mapped).
  static Result<std::unique_ptr<ShmTransport>> create(Bootstrap& boot, const std::vector<bool>& local,
                                                      size_t fifo_bytes, Deadline deadline);
  ~ShmTransport() override;

  const char* name() const override { return "shm"; }
  Connection* connection(int peer) override;
  uint32_t events() override;
  void wait_events(uint32_t seen, std::chrono::microseconds timeout) override;
  void arm_wait() override;
  void disarm_wait() override;
  Status check_peer(int peer) override;
  void announce_abort(const std::string& reason) override;
  void wake_self() override;
  void hold_doorbells() override { batch_.hold = true; }
  void ring_owed() override {
    if (!batch_.owed.empty()) pay_owed();
  }
  void release_doorbells() override {
    ring_owed();
    batch_.hold = false;
  }

  // Bytes this process's senders wrote into receivers (shared single copy,
  // LOOM_SHM_SHARED_COPY), for tests and diagnostics.
  static uint64_t shared_copy_bytes();
  // Waits of this process that ended by their timeout rather than a doorbell
  // (a lost wake-up shows up here), for tests.
  static uint64_t wait_timeouts();
  // Of those, the ones that found the doorbell rung when they woke: an event
  // arrived during the wait and did not wake it (a lost wake-up), as opposed
  // to a peer that produced nothing for the whole timeout (a slow or
  // descheduled peer, as under a sanitizer on a loaded machine).
  static uint64_t missed_wakeups();
  // Small messages this process sent through cache-line slots
  // (LOOM_SHM_SLOTS), for tests; approximate when ranks are threads.
  static uint64_t slot_messages();
  // FIFO writes that published bytes (each at most LOOM_SHM_FIFO_STEP_BYTES), for tests.
  static uint64_t fifo_writes();
  // FIFO steps this process wrote (in part) by streaming stores, and the
  // times a connection's SharedStores changed mode (LOOM_SHM_STREAM_STORES),
  // for tests.
  static uint64_t streamed_steps();
  static uint64_t store_switches();
  // Messages this process sent from two pieces without staging them
  // (Connection::send_gather: fingerprint header + small payload), for tests.
  static uint64_t gathered_messages();
  // Small-message slots per pair and direction: a sender this many messages
  // ahead of its receiver waits (tests fill the ring).
  static size_t slot_ring_size();
  // Pages of FIFOs and their control blocks this process read once at setup
  // (prefault, shm_transport.cc), for tests.
  static uint64_t prefaulted_pages();
  // Messages this process received by single copy (tests).
  static uint64_t single_copy_messages();
  // Of those, the ones read through a mapping of the sender's buffer
  // (loom::mem_alloc memory, LOOM_SHM_MAP_SHARED) instead of by
  // process_vm_readv (tests).
  static uint64_t mapped_messages();
  // Tests: replaces the peer liveness check (kill(pid, 0) + /proc) of
  // check_peer; nullptr restores it. Lets a test make a peer fail and vanish
  // between check_peer's reads, which real processes do only by chance.
  static void set_liveness_probe_for_test(bool (*probe)(int pid));
  // Tests: called on the copying thread just before a rank enters a peer's
  // memory (writes: a pushed half into the receiver; else a single-copy read
  // from the sender), so a test can fail the peer's op at that moment.
  static void set_peer_memory_hook_for_test(void (*hook)(bool writes));

  struct Segment;  // the layout of a rank's segment: shm_layout.h
  // The doorbells this rank's connections owe while they are held: the
  // peers (ranks) written to since the last ring_owed, each once.
  struct DoorbellBatch {
    bool hold = false;
    std::vector<int> owed;
    std::vector<uint8_t> is_owed;  // per rank
  };

 private:
  ShmTransport() = default;
  int rank_ = 0, nranks_ = 0;
  size_t fifo_bytes_ = 0;
  size_t seg_bytes_ = 0;
  std::vector<Segment*> segs_;  // per rank; nullptr for ranks on other hosts
  std::vector<std::unique_ptr<Connection>> conns_;
  DoorbellBatch batch_;
  void pay_owed();
  std::string own_name_;
  bool unlinked_ = false;
  std::vector<int> peer_pids_;
  std::vector<std::string> peer_hosts_;
  std::mutex abort_mu_;  // announce_abort
  bool announced_ = false;
  // Our segment's descriptor, holding an exclusive flock while we live, and
  // ours on the segments of peers in another pid namespace (-1: none); see
  // rank_alive.
  int own_fd_ = -1;
  std::vector<int> peer_fds_;
  bool rank_alive(int peer) const;
  uint64_t cma_probe_ = 0x434d41444553431ull;  // peers read it to test single-copy permission
};

}  // namespace loom
