// One shared-memory connection (a peer of this host): small messages in
// cache-line slots, the rest through the FIFO, single copy by
// process_vm_readv / a mapping of the sender's mem_alloc buffer, the shared
// copy (the sender pushes half). The class lives in shm_connection.cc; the
// transport (shm_transport.cc) makes connections and asks them these few
// things through the functions below.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/shared_stores.h"
#include "transport/shm/shm_transport.h"

// The shm internals (this header's and shm_layout.h's) stay inside libloom:
// not exported, as when they were file-local (the test counters in
// shm_layout.h are bumped on the message path).
#define LOOM_SHM_HIDDEN __attribute__((visibility("hidden")))

namespace loom {
namespace shm LOOM_SHM_HIDDEN {

// The connection from `rank` (segment `self`) to `peer_rank` (segment
// `peer`) among `nranks` of this host; FIFOs of `cap` bytes written in steps
// of `step`. `batch`: the transport's held doorbells.
std::unique_ptr<Connection> make_connection(ShmTransport::Segment* self, ShmTransport::Segment* peer, int rank,
                                            int peer_rank, int nranks, size_t cap, size_t step,
                                            SharedStores::Policy stores, bool can_push, bool map_peers,
                                            ShmTransport::DoorbellBatch* batch);
// What a peer that closed in order left this connection waiting for ("":
// nothing; check_peer).
std::string closed_problem(Connection* c, int peer);
// Copies len bytes from (cma_read) or to (cma_write) addr in process pid
// with process_vm_readv / process_vm_writev; between threads of one process
// (`same_process`) with memcpy. False with *err set when the kernel refuses.
bool cma_read(bool same_process, int pid, uint64_t addr, std::byte* dst, size_t len, int* err);
bool cma_write(bool same_process, int pid, uint64_t addr, const std::byte* src, size_t len, int* err);
// Non-zero errno of a failed single-copy read.
int cma_errno(Connection* c);
// The peer is inside this rank's memory (reading a single-copy message, or
// writing a pushed half into it). Any thread.
bool peer_inside(Connection* c);

}  // namespace shm
}  // namespace loom
