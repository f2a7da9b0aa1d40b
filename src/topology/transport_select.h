// Per-peer transport choice from the path between two ranks.
//
//   other host           -> ib when the rank's NIC is a verbs device (and IB
//                           is usable), else socket
//   same host, GPU ranks -> cuda_ipc when the path is no worse than the P2P
//                           level (NVLink always; PCI up to PXB on Intel/ARM,
//                           up to SYS on AMD, as NCCL defaults), else shm
//                           (staged through host memory)
//   same host, CPU ranks -> shm
// Every choice carries a one-line reason that loom-topo prints.
#pragma once

#include <string>

#include "topology/graph.h"
#include "topology/paths.h"

namespace loom::topo {

enum class TransportKind { kShm, kCudaIpc, kSocket, kIb };
const char* transport_name(TransportKind k);  // "shm", "cuda_ipc", "socket", "ib"

struct TransportPolicy {
  bool p2p_level_auto = true;
  PathType p2p_level = PathType::kPxb;  // used when !p2p_level_auto
  bool ib_usable = true;                 // false: build or host without verbs
};

struct TransportChoice {
  TransportKind kind = TransportKind::kShm;
  std::string reason;
};

// The deepest path type over which GPU peer-to-peer is used by default.
PathType default_p2p_level(const TopoGraph& g);

TransportChoice choose_transport(const TopoGraph& g, const RankTopology& rt, int a, int b,
                                 const TransportPolicy& policy = {});

}  // namespace loom::topo
