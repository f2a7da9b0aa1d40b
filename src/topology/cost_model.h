// Alpha-beta-gamma cost model of collective algorithms.
//
// Formulas follow Thakur, Rabenseifner & Gropp, "Optimization of Collective
// Communication Operations in MPICH" (IJHPCA 2005): a message of m bytes
// between two ranks costs alpha + m*beta, reducing m bytes costs m*gamma.
// Unlike the paper's flat model, alpha/beta are per pair distance, taken from
// the topology: ring neighbours (i, i+1), hypercube partners (i, i^2^k), and
// the worst pair overall; so an algorithm whose large transfers cross the SMP
// link or the network pays for it. Pipelined algorithms (tree, chain) choose
// the chunk count k that minimises (d + k - 1)(alpha + (n/k) beta).
//
// Conventions for `bytes` (n), as nccl-tests reports sizes: allreduce,
// broadcast, reduce, sendrecv: the buffer; all_gather: the total output;
// reduce_scatter: the total input; all_to_all: the total send buffer of one rank.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

#include "loom/types.h"

namespace loom::topo {

enum class AlgoKind {
  kRing,              // ring reduce-scatter + all-gather; ring all-gather/reduce-scatter
  kChain,             // pipelined chain (a ring cut at the root): broadcast, reduce
  kTree,              // pipelined (double) binary tree
  kBinomial,          // binomial tree, pipelined in chunks
  kHypercube,         // recursive doubling
  kRabenseifner,      // recursive halving (+ doubling)
  kBruck,             // Bruck's log-step algorithm
  kDirect,            // one-shot: all peers at once
  kTwoShot,           // direct reduce-scatter + direct all-gather
  kPairwise,          // p-1 pairwise exchanges
  kScatterAllgather,  // van de Geijn broadcast: binomial scatter + ring all-gather
  kP2p,               // send/recv
  kHierarchical,      // reduce inside hosts, allreduce across hosts, broadcast inside
};
inline constexpr int kNumAlgoKinds = 13;

const char* algo_name(AlgoKind a);
// Accepts the names above and aliases: recursive_doubling, double_binary_tree,
// one_shot, halving_doubling, recursive_halving, double_tree; "ring" for
// broadcast/reduce means the chain.
std::optional<AlgoKind> parse_algo(std::string_view name, Collective coll);
bool algo_supports(AlgoKind a, Collective coll);
// Every algorithm the model knows for a collective, in a stable order.
std::vector<AlgoKind> algos_for(Collective coll);

struct LinkCost {
  double alpha_us = 0;          // per message
  double beta_us_per_byte = 0;  // 1 / bandwidth
};

// Costs of one communicator shape (nranks), derived from the topology.
struct CommCost {
  LinkCost ring;                // worst over (i, i+1 mod p)
  std::vector<LinkCost> level;  // level[k]: worst over (i, i xor 2^k)
  LinkCost all;                 // worst over every pair
  double gamma_us_per_byte = 0; // reduction, operands in memory
  // Reduction while the operands fit in a core's cache (calls of at most
  // cache_bytes): 3-5x faster on CPUs, which moves the latency/bandwidth
  // crossovers (2 ranks: one exchange + reduce beats ring's two half-size
  // steps up to ~64 KiB, measured). 0 = no separate cached rate.
  double gamma_cached_us_per_byte = 0;
  size_t cache_bytes = 0;
  double overlap_us = 0.2;      // start-up of each extra concurrent message (direct algorithms)
  double direct_efficiency = 0.8;  // bandwidth fraction left under p-1 -> 1 fan-in contention
  double channel_fraction = 1.0;   // share of a link one channel can drive
  int max_channels = 1;
  size_t min_chunk_bytes = 4096;
  size_t min_bytes_per_channel = 128 * 1024;
  // Same-host messages of at least this many bytes are single-copy (the
  // receiver reads the sender's buffer, the sender copies nothing); 0 = none.
  // single_copy_bytes for every message of a reducing collective (allreduce,
  // reduce_scatter, reduce: the transport moves them all as reduced ones).
  size_t single_copy_bytes = 0;
  size_t single_copy_plain_bytes = 0;  // the same for the other collectives' messages
  // Per-byte cost of a single-copy message relative to beta (the FIFO
  // path's), in the symmetric collectives, where every rank sends and
  // receives at once and so pays both copies of a FIFO message itself.
  // Measured, 2 ranks, all_gather of 256 KiB (128 KiB messages): 8.0 us
  // single copy, 15.6 us through the FIFO.
  double single_copy_factor = 0.5;
  // Per-byte cost of a FIFO message its receiver reduces as it reads it
  // (Land::kReduce: ring, Rabenseifner, recursive halving), relative to
  // beta. beta prices both copies of a FIFO message, the sender's in and the
  // receiver's out; a receiver that reduces reads the FIFO in the reduction
  // itself (priced by gamma), so only the sender's copy is left. 1 = off
  // (across hosts and between GPUs, where beta is the wire or the link).
  // The symmetric collectives only: the rooted model (rooted_receiver_reads)
  // still charges a reduce's receiver its copy out of the FIFO (not
  // measured there; reduce's algorithms all reduce on receipt alike).
  double fused_receive_factor = 1.0;
  // Fixed cost of a single-copy message beyond alpha: the read's system call
  // and the acknowledgement the sender waits for. Measured, 2 ranks: a 32 KiB
  // single-copy all_gather message 3.6 us against 2.6 us of alpha + bytes.
  double single_copy_alpha_us = 1.0;
  // A rooted collective's single-copy message costs its receiver this many
  // times a FIFO copy of its bytes (beta): process_vm_readv pins every page
  // of the sender's buffer and pulls lines still dirty in the sender's cache.
  // Measured, 8 ranks on 2 cores, the direct broadcast (every receiver reads
  // the root's buffer) by process_vm_readv against the same through mappings
  // of loom::mem_alloc buffers, min of 3 interleaved runs: 1 MiB 442 / 200
  // us, 4 MiB 1530 / 620, 16 MiB 10212 / 3536 (2.2-2.9x); the chain through
  // the FIFOs 343 / 1366 / 6858 in between.
  double single_copy_read_factor = 2.5;
  // Messages sent from Loom's own scratch (the ring's and recursive
  // halving's partial sums in reduce_scatter) of at least this many bytes
  // are read through a mapping of the sender's scratch (loom::mem_alloc
  // memory, LOOM_SHM_MAP_SHARED): the sender copies nothing, the receiver
  // reduces straight from the mapping, whatever the single-copy thresholds
  // (also between oversubscribed ranks). They cost single_copy_alpha_us plus
  // mapped_factor x beta per byte. 0 = no mapping (another host, mapping off).
  size_t map_min_bytes = 0;
  double mapped_factor = 0.0;
  // ... for collectives of up to a quarter of the host's last-level cache
  // (n <= map_cache_bytes / 4; 0 = no limit). Beyond, halving measured as
  // fast or faster again. Measured on 2 cores with a 32 MiB L3, ring against
  // halving, min of 5 interleaved rounds: 4 ranks 4 MiB 1208 / 1403 us, 8 MiB
  // 2323 / 2656, 16 MiB 8429 / 5988; 8 ranks 4 MiB 1609 / 2307, 8 MiB 5772 /
  // 6657, 16 MiB 10669 / 9489, 64 MiB 48110 / 45296. The crossover (8-16 MiB
  // at both rank counts) is tied to the cache size as a guess at how it
  // moves on other hosts; it is not explained.
  size_t map_cache_bytes = 0;
  // More ranks on the host than CPUs: ranks take turns on the cores, so an
  // op costs the ranks' summed work, not its critical path. A single-copy
  // message that lands in scratch to be reduced then saves nothing over a
  // reduced FIFO message (the sender's copy becomes the receiver's).
  bool oversubscribed = false;
  // With oversubscribed ranks: the CPUs they share (0 = unknown). Rooted
  // collectives are then priced by the busiest core, with rank r on core
  // r mod cores (loomrun --bind core, the default; see cost_model.cc).
  int cores = 0;
  // Oversubscribed: what one rank's turn costs a peer waiting for it, per
  // round of dependent messages of a symmetric collective (allreduce,
  // reduce_scatter, all_gather, all_to_all), for each of the p / cores - 1
  // other ranks of a core: hand_off_us when some pair of the round shares a
  // core (rank r on core r mod cores), hand_off_cross_us when none does.
  // Defaults between the days measured on the 2-core development host
  // (cost_model.cc).
  double hand_off_us = 4.0;
  double hand_off_cross_us = 1.0;
  // Oversubscribed, symmetric collectives: the per-byte cost of a message
  // between two ranks of one core, relative to beta. The receiver reads lines
  // its core-mate has just written, still in that core's cache; across cores
  // they move between caches. Fitted on the slopes of 8 ranks on 2 cores,
  // allreduce 4-256 KiB, us per KiB, measured / model with 1.0 / with 0.5:
  // recursive doubling (one step of three across) 1.03-1.3 / 1.63 / 1.22,
  // two-shot (4 of 7 peers across) 0.78-0.88 / 1.01 / 0.82, Rabenseifner
  // (the two big steps within) 0.48-0.60 / 0.84 / 0.53. 1 = placement-blind.
  double same_core_beta_factor = 0.5;
  // With more ranks than cores, a broadcast's FIFO messages (chain, tree,
  // binomial, unstaged direct) cost this fraction of their beta while the
  // op's data, nranks x bytes, fits in the host's last-level cache
  // (llc_bytes; 0 = unknown, no discount): the pipelined chunks are copied
  // in and out of the FIFOs in cache. Reads of a staged buffer through a
  // mapping measured no such gain. Measured, 8 ranks on 2 cores, binomial,
  // -z 1, us (performance.md Run 36) against the undiscounted model:
  // 1 MiB 231-281 / 468, 2 MiB 492-594 / 936, 4 MiB 1040-1417 / 1870; from
  // 8 MiB (64 MiB of data, past a 32 MiB cache) 2506-3373 / 3740 (an Intel
  // guest, Run 36). On an AMD EPYC guest (Run 41) 8 ranks ran at the
  // undiscounted price (1 MiB 437-490 / 468) while 4 ranks kept the
  // discount (1 MiB 140-148 / 225): the tuner counts the cache over (ranks
  // per core)^2 (params::broadcast_cache_bytes).
  double fifo_cached_factor = 0.5;
  // The host's last-level cache (LOOM_LLC_BYTES / sysfs) over (ranks per
  // core)^2 (params::broadcast_cache_bytes); 0 = unknown.
  size_t llc_bytes = 0;
  // Oversubscribed on one host with mappings on: the direct all_gather stages
  // a rank's block of at least this many bytes once in its scratch, the
  // direct broadcast's root its buffer, and every peer reads it from there
  // through a mapping (direct.cc; 0 = never): one copy in plus one per
  // reader, where the FIFO costs a copy in and one out per pair
  // (LOOM_SHM_ANNOUNCED_MIN_BYTES).
  size_t stage_min_bytes = 0;
  int nhosts = 1;               // hosts spanned (hierarchical algorithms)
  // The most ranks of one host that leave it through the same NIC (0 =
  // unknown: all of the host's ranks share one way out). A step whose
  // partners sit on other hosts shares each NIC among this many flows.
  int ranks_per_nic = 0;
  LinkCost intra;               // worst pair inside a host (hierarchical)
  LinkCost cross;               // worst pair on different hosts (direct phases; 0 = one host)
};

struct Estimate {
  AlgoKind algo = AlgoKind::kRing;
  double us = 0;
  size_t chunk_bytes = 0;
  int channels = 1;
};

// nullopt when the algorithm cannot run this collective or rank count
// (e.g. hypercube all_gather needs a power of two).
std::optional<Estimate> estimate(AlgoKind a, Collective coll, size_t bytes, int nranks, const CommCost& c);

// Collectives whose `bytes` (the conventions above) are nranks blocks of a
// rank's count: all_gather, reduce_scatter, all_to_all.
inline bool bytes_are_blocks(Collective coll) {
  return coll == Collective::kAllGather || coll == Collective::kReduceScatter || coll == Collective::kAllToAll;
}

}  // namespace loom::topo
