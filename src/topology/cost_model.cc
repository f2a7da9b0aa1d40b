#include "topology/cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "core/btree.h"
#include "core/message_class.h"

namespace loom::topo {
namespace {

constexpr std::array<const char*, kNumAlgoKinds> kNames = {
    "ring", "chain", "tree", "binomial", "hypercube", "rabenseifner",
    "bruck", "direct", "two_shot", "pairwise", "scatter_allgather", "p2p", "hierarchical"};

int ceil_log2(int p) {
  int l = 0;
  while ((1 << l) < p) ++l;
  return l;
}
bool is_pow2(int p) { return p > 0 && (p & (p - 1)) == 0; }

// What the receiver does with a message: stores it (all_gather, broadcast),
// reduces it as it arrives (ring / halving reduce-scatter), or stores it in
// scratch for a local reduction step (recursive doubling, one-shot, two-shot).
// The transport picks the single-copy threshold by the first two (the last is
// a stored message to it); the model also needs the third.
enum class Land { kStore, kReduce, kStoreThenReduce };

// Cost of the communicator shape with the channel-count bandwidth factor applied.
struct Ctx {
  const CommCost& c;
  double n;  // bytes
  int p;
  double beta_scale;  // >= 1: fewer channels than needed to fill a link
  // The transport moves every message of the op as a reduced one
  // (core/message_class.h, RankSchedule::reduced_class).
  bool reducing = false;
  // Symmetric collectives with more ranks than cores (set in estimate()):
  // the per-byte factor of a message between two ranks of one core
  // (CommCost::same_core_beta_factor), rank r on core r mod cores; 1 = off.
  double same_core = 1.0;
  int cores = 1;
  // Partners 2^k apart (exchange i ^ 2^k, or shift i + 2^k) share a core.
  bool level_shares_core(int k) const { return same_core != 1.0 && k >= 0 && k < 30 && (1 << k) % cores == 0; }
  // Mean factor over every peer of a rank: p / cores - 1 of its p - 1 share its core.
  double peers_factor() const {
    if (same_core == 1.0 || p < 2) return 1.0;
    const double mates = std::max(0.0, std::ceil(static_cast<double>(p) / cores) - 1);
    return (mates * same_core + (p - 1 - mates)) / (p - 1);
  }
  LinkCost lvl(int k) const {
    LinkCost l = (k >= 0 && static_cast<size_t>(k) < c.level.size()) ? c.level[static_cast<size_t>(k)] : c.all;
    // A level whose partners sit on different hosts (ranks placed in
    // contiguous blocks of q per host, so partners 2^k >= q apart): all q
    // ranks of a host cross at once and share its way out: one NIC, or each
    // NIC among the ranks that use it (CommCost::ranks_per_nic). The ring's
    // crossing edge carries one flow per host.
    // Measured, 2 hosts x 2 ranks over TCP: Rabenseifner (both ranks of a
    // host cross in its far step) 24 ms vs ring 14 ms at 4 MiB, while the
    // per-pair model called them a tie. Simulated (loom-sim, azure-ndv4.xml,
    // a NIC per GPU): charging all 8 ranks of a host to one NIC made the
    // far steps 4-8x too slow, and the tuner passed Rabenseifner over at
    // 64-4096 ranks from 64 KiB (docs/simulator.md).
    if (c.nhosts > 1 && k >= 0 && k < 30) {
      const int q = (p + c.nhosts - 1) / c.nhosts;
      const int share = c.ranks_per_nic > 0 ? std::min(q, c.ranks_per_nic) : q;
      if ((1 << k) >= q) l.beta_us_per_byte *= share;  // partners 2^k >= q apart: other hosts
    }
    l.beta_us_per_byte *= beta_scale;
    if (level_shares_core(k)) l.beta_us_per_byte *= same_core;
    return l;
  }
  // Neighbours i, i + 1 share a core only when there is one core.
  LinkCost ring() const {
    return {c.ring.alpha_us, c.ring.beta_us_per_byte * beta_scale * (cores == 1 ? same_core : 1.0)};
  }
  LinkCost all() const { return {c.all.alpha_us, c.all.beta_us_per_byte * beta_scale}; }
  // A rank's messages to every peer (direct, pairwise): the mean over the peers' placement.
  LinkCost peers() const { return {c.all.alpha_us, c.all.beta_us_per_byte * beta_scale * peers_factor()}; }
  LinkCost tree_edge() const {
    LinkCost w = lvl(0);
    for (int k = 1; k < ceil_log2(p); ++k) {
      LinkCost l = lvl(k);
      w.alpha_us = std::max(w.alpha_us, l.alpha_us);
      w.beta_us_per_byte = std::max(w.beta_us_per_byte, l.beta_us_per_byte);
    }
    return w;
  }
  double g() const {
    return (c.cache_bytes > 0 && c.gamma_cached_us_per_byte > 0 && n <= static_cast<double>(c.cache_bytes))
               ? c.gamma_cached_us_per_byte
               : c.gamma_us_per_byte;
  }
  // Moving one message of m bytes with per-byte cost beta in a symmetric
  // collective: from the single-copy threshold of its class (whether the
  // receiver reduces it or only stores it) a single copy, cheaper per byte
  // but with a fixed cost of its own (CommCost::single_copy_*).
  double move(double m, double beta, Land land) const {
    const size_t thr = land == Land::kReduce || reducing ? c.single_copy_bytes : c.single_copy_plain_bytes;
    if (thr == 0 || m < static_cast<double>(thr)) return m * beta * (land == Land::kReduce ? c.fused_receive_factor : 1.0);
    // Stored into scratch only to be reduced by a local step: with more
    // ranks than cores the total work is what counts, and that is the
    // reduced FIFO message's (one copy, then the reduction): no discount.
    const double f = land == Land::kStoreThenReduce && c.oversubscribed ? 1.0 : c.single_copy_factor;
    return c.single_copy_alpha_us + m * beta * f;
  }
  // A message of m bytes from Loom's scratch goes through a mapping.
  bool mapped(double m) const {
    return c.map_min_bytes > 0 && m >= static_cast<double>(c.map_min_bytes) &&
           (c.map_cache_bytes == 0 || n <= static_cast<double>(c.map_cache_bytes) / 4);
  }
  // A message that leaves from Loom's scratch (reduce_scatter's partial
  // sums): from map_min_bytes read through a mapping, no copy by the sender.
  double move_from_scratch(double m, double beta, Land land) const {
    if (!mapped(m)) return move(m, beta, land);
    return c.single_copy_alpha_us + m * beta * c.mapped_factor;
  }
  // Start-up of p-1 concurrent messages: one alpha plus a small overlap each.
  double direct_alpha() const { return c.all.alpha_us + std::max(0, p - 2) * c.overlap_us; }
  // Per message of a direct phase (one message to every peer at once).
  // Across hosts with each rank's NIC known, the messages to other hosts
  // leave through the rank's NIC (shared by ranks_per_nic ranks) while those
  // inside the host take the host's own links, at the same time: the busier
  // of the two sets the pace. Otherwise (one host, or the way out unknown)
  // they go one after another at the worst pair's beta. Simulated (loom-sim,
  // azure-ndv4, a NIC per GPU): priced serially at the SMP link's beta,
  // two_shot allreduce ran at 0.42 of its estimate at 64 ranks, 128 MiB and
  // lost to Rabenseifner in the tuner while 23% faster.
  double direct_beta() const {
    double b = peers().beta_us_per_byte;
    if (c.nhosts > 1 && c.ranks_per_nic > 0 && c.cross.beta_us_per_byte > 0 && p > 1) {
      const int q = std::min((p + c.nhosts - 1) / c.nhosts, p);
      const double out = (p - q) * c.cross.beta_us_per_byte * std::min(q, c.ranks_per_nic);
      const double in = (q - 1) * (c.intra.beta_us_per_byte > 0 ? c.intra.beta_us_per_byte : c.cross.beta_us_per_byte);
      b = std::max(out, in) / (p - 1) * beta_scale;
    }
    return b / std::max(c.direct_efficiency, 1e-3);
  }
};

// More ranks than cores, with the core count known: the ranks take turns
// on the cores (the oversubscribed terms below apply).
bool core_bound(const CommCost& c, int p) { return c.oversubscribed && c.cores > 0 && p > c.cores; }

struct Pipe {
  double us;
  size_t chunk;
};

// (d + k - 1)(alpha + (n/k) beta), minimised over the chunk count k.
Pipe pipelined(int d, double n, LinkCost l, size_t min_chunk) {
  double kmax = std::max(1.0, std::floor(n / static_cast<double>(std::max<size_t>(min_chunk, 1))));
  double k = 1;
  if (d > 1 && l.alpha_us > 0) k = std::sqrt((d - 1) * n * l.beta_us_per_byte / l.alpha_us);
  k = std::clamp(std::round(k), 1.0, kmax);
  double us = (d + k - 1) * (l.alpha_us + (n / k) * l.beta_us_per_byte);
  return {us, static_cast<size_t>(std::ceil(n / k))};
}

// Non-power-of-two fold for recursive algorithms: the p - p2 extra ranks hand
// their data to a partner first and get the result back at the end.
double fold_cost(const Ctx& x, bool reduce, bool result_back) {
  if (is_pow2(x.p)) return 0;
  LinkCost a = x.all();
  double t = a.alpha_us + x.n * a.beta_us_per_byte + (reduce ? x.n * x.g() : 0);
  if (result_back) t += a.alpha_us + x.n * a.beta_us_per_byte;
  return t;
}

// 1 when the sender of a rooted collective's message of `bytes` copies it
// (FIFO), 0 when the receiver reads it in place (single copy). Broadcast-like
// sends land plain; reduce's are reduced on receipt.
double rooted_sender_copies(const Ctx& x, bool red, double bytes) {
  const size_t single = red || x.reducing ? x.c.single_copy_bytes : x.c.single_copy_plain_bytes;
  return single == 0 || bytes < static_cast<double>(single) ? 1.0 : 0.0;
}

// What the receiver of that message pays per byte, in FIFO copies (beta):
// one from the FIFO, or single_copy_read_factor for a single-copy read.
double rooted_receiver_reads(const Ctx& x, bool red, double bytes) {
  return rooted_sender_copies(x, red, bytes) > 0 ? 1.0 : x.c.single_copy_read_factor;
}

// Steady-state time per op of a rooted collective: the work of its busiest
// rank. Every message costs each end an overhead o = alpha / 2; the receiver
// copies its bytes (and reduces them: gamma); the sender copies them too
// unless the message goes single-copy (the receiver reads the sender's
// buffer). `chunk` is the pipelining chunk of chain and tree.
//   chain     inner rank: 1 recv + 1 send per chunk
//   tree      inner rank: broadcast 1 recv + 2 sends, reduce 2 recvs + 1 send
//   binomial  root: ceil(log2 p) sends (broadcast) or reduced recvs (reduce)
//   direct    root: p - 1 sends or reduced recvs
// Oversubscribed, rooted_core_busy_us (below) sums these terms per core.
double rooted_busy_us(AlgoKind a, bool red, const Ctx& x, size_t chunk) {
  const double n = x.n, pp = x.p;
  const int L = ceil_log2(x.p);
  auto sender_copies = [&](double bytes) { return rooted_sender_copies(x, red, bytes); };
  const double k = chunk > 0 ? std::max(1.0, std::ceil(n / static_cast<double>(chunk))) : 1.0;
  const double c = n / k;
  const double gam = red ? x.g() : 0;
  switch (a) {
    case AlgoKind::kChain: {
      LinkCost l = x.ring();
      const double o = l.alpha_us / 2, b = l.beta_us_per_byte;
      if (x.p == 2) return k * o + n * (b + gam);  // one message; the receiver is the busier end
      return k * 2 * o + n * (b + gam) + sender_copies(c) * n * b;
    }
    case AlgoKind::kTree: {
      LinkCost l = x.tree_edge();
      const double o = l.alpha_us / 2, b = l.beta_us_per_byte, s = sender_copies(c);
      if (x.p == 2) return k * o + n * (b + gam);
      return red ? k * 3 * o + 2 * n * (b + gam) + s * n * b : k * 3 * o + n * b + 2 * s * n * b;
    }
    case AlgoKind::kBinomial: {
      LinkCost l = x.all();
      const double o = l.alpha_us / 2, b = l.beta_us_per_byte;
      // The root's reduced receives, chunk by chunk (both directions are
      // pipelined, tree.cc / patterns.cc).
      if (red) return L * (k * o + n * (b + gam));
      // The root's sends and its first child's receive + forwards.
      const double s = sender_copies(c);
      return std::max(L * (k * o + s * n * b), k * o + n * b + (L - 1) * (k * o + s * n * b));
    }
    case AlgoKind::kDirect: {
      const double o = x.direct_alpha() / 2, b = x.direct_beta();
      // Broadcast: the root's sends, or a receiver's copy when the root
      // copies nothing (single copy: every receiver reads the root's buffer).
      return red ? (pp - 1) * (o + n * (b + gam))
                 : std::max((pp - 1) * (o + sender_copies(n) * n * b) + o, o + n * b * rooted_receiver_reads(x, red, n));
    }
    case AlgoKind::kScatterAllgather: {
      // A non-root rank: its scatter piece, then the ring all-gather.
      LinkCost r = x.ring();
      const double o = r.alpha_us / 2, b = r.beta_us_per_byte, m = n / pp;
      return (L + 2 * (pp - 1)) * o + n / 2 * b + (pp - 1) * m * b * (1 + sender_copies(m));
    }
    case AlgoKind::kRabenseifner: {
      // The root: halving steps (send + reduced recv of n/2^j), then the
      // gather of the pieces.
      LinkCost l = x.all();
      const double o = l.alpha_us / 2, b = l.beta_us_per_byte;
      double t = 0;
      for (int j = 1; j <= L; ++j) {
        double m = n / std::ldexp(1.0, j);
        t += 2 * o + m * (b * (1 + sender_copies(m)) + gam) + o + m * b;
      }
      return t;
    }
    default: return 0;
  }
}

// Oversubscribed (more ranks than cores, CommCost::cores known): the ranks
// take turns on the cores, rank r on core r mod cores (loomrun --bind core,
// its default; mpirun maps round-robin alike), and a stream of rooted ops
// runs at the pace of the busiest core: the summed work of its ranks per op,
// not the busiest rank's. Per position v (rank root + v): o per message end,
// the receiver's copy (b) and reduction (gam), the sender's copy unless
// single copy, as in rooted_busy_us.
// Which ranks do the heavy roles then matters: with 2 cores a near-first
// binomial reduce receives and reduces only on the root's parity (the odd
// positions send and leave at the first step; so binomial_reduce goes
// far-first on one host, which balances the cores like the chain) and the
// binary tree's interior nodes are the even positions, all on the root's
// core, while a chain alternates cores. And a pipelined chain pays a message
// per chunk per rank, which the busiest-rank view hides behind its one inner
// rank. Measured, 4 ranks on 2 cores: reduce 128 KiB chain 23.8 us,
// near-first binomial 34.0 (the busiest-rank model called them a tie); 8
// ranks, broadcast 32 KiB binomial 13.6 us, chain (4 chunks) 16.6.
// Rabenseifner's halving and scatter-allgather's ring are symmetric: their
// per-rank figure times the ranks of the busiest core.
double rooted_core_busy_us(AlgoKind a, bool red, const Ctx& x, size_t chunk) {
  const int p = x.p, cores = std::max(1, x.c.cores);
  const double n = x.n;
  auto sender_copies = [&](double bytes) { return rooted_sender_copies(x, red, bytes); };
  const double gam = red ? x.g() : 0;
  std::vector<double> w(static_cast<size_t>(p), 0.0);
  auto at = [&](int v) -> double& { return w[static_cast<size_t>(v)]; };
  // One message of m bytes, k times (chunks), from position s to position r.
  // A reduce's inner ranks send their partial sums from Loom's scratch
  // (`scratch`), which goes through a mapping from map_min_bytes as in
  // reduce_scatter: no sender copy, the receiver reduces straight from it.
  // But the sender's step ends only when the receiver has read it (a FIFO
  // message ends once copied in), so the sender sleeps until then and must
  // get its core back: a hand-off per message, on its core (hand_off_us when
  // the receiver shares the core, hand_off_cross_us otherwise). Measured, 8
  // ranks on 2 cores, 256 KiB (2 -> 0, 6 -> 4, 4 -> 0 mapped, all within a
  // core), 400 iterations: binomial 135 us mapped, 103 through the FIFO
  // (LOOM_SHM_MAP_SHARED=0), the chain 114; the model without the term chose
  // binomial there (1.17-1.30x slower, run 18).
  // A message between two ranks of one core moves its bytes at
  // same_core_beta_factor of beta, as in the symmetric collectives: the
  // receiver reads lines its core-mate just wrote. Measured, -z 1, 128 KiB
  // chunks, 16 MiB: the far-first binomial reduce (every step but the last
  // within a core) 2886 us at 4 ranks, 6980 at 8; the chain (every hop
  // across) 3549 / 9424, at equal message counts per core.
  // A broadcast whose data fits in the cache (CommCost::fifo_cached_factor).
  const bool cached = !red && x.c.llc_bytes > 0 && p * n <= static_cast<double>(x.c.llc_bytes);
  auto msg = [&](int s, int r, double m, double k, double o, double b, bool scratch = false) {
    if (s % cores == r % cores) b *= x.c.same_core_beta_factor;
    if (cached) b *= x.c.fifo_cached_factor;
    if (scratch && red && x.mapped(m)) {
      const double wait = (s % cores == r % cores) ? x.c.hand_off_us : x.c.hand_off_cross_us;
      at(s) += k * (o + wait);
      at(r) += k * (o + x.c.single_copy_alpha_us + m * (b * x.c.mapped_factor + gam));
      return;
    }
    at(s) += k * (o + sender_copies(m) * m * b);
    at(r) += k * (o + m * (b * rooted_receiver_reads(x, red, m) + gam));
  };
  const double k = chunk > 0 ? std::max(1.0, std::ceil(n / static_cast<double>(chunk))) : 1.0;
  const double c = n / k;
  switch (a) {
    case AlgoKind::kChain: {
      LinkCost l = x.ring();
      // Broadcast 0 -> 1 -> ... -> p-1; reduce 1 -> 2 -> ... -> p-1 -> 0.
      for (int i = 0; i + 1 < p; ++i)
        red ? msg(i + 1, (i + 2) % p, c, k, l.alpha_us / 2, l.beta_us_per_byte, i > 0)
            : msg(i, i + 1, c, k, l.alpha_us / 2, l.beta_us_per_byte);
      break;
    }
    case AlgoKind::kTree: {
      LinkCost l = x.tree_edge();
      for (int v = 1; v < p; ++v) {
        const TreeNode node = btree_node(p, v);
        red ? msg(v, node.parent, c, k, l.alpha_us / 2, l.beta_us_per_byte, node.child[0] >= 0 || node.child[1] >= 0)
            : msg(node.parent, v, c, k, l.alpha_us / 2, l.beta_us_per_byte);
      }
      break;
    }
    case AlgoKind::kBinomial: {
      // Broadcast near-first (patterns.cc): at mask m, v < m sends to v + m.
      // Reduce on one host far-first, its mirror: v in [m, 2m) sends to v - m
      // (and has a child if v >= 2); across hosts near-first: v whose lowest
      // set bit is m sends to v - m (tree.cc, binomial_reduce).
      LinkCost l = x.all();
      const double o = l.alpha_us / 2, b = l.beta_us_per_byte;
      for (int m = 1; m < p; m *= 2) {
        if (red && x.c.nhosts > 1)
          for (int v = m; v < p; v += 2 * m) msg(v, v - m, c, k, o, b, m > 1 && v + 1 < p);  // v has a child
        else if (red)  // oversubscribed its partial sums stay in the FIFO (tree.cc): never mapped
          for (int v = m; v < std::min(2 * m, p); ++v) msg(v, v - m, c, k, o, b);
        else
          for (int v = m; v < std::min(2 * m, p); ++v) msg(v - m, v, c, k, o, b);
      }
      break;
    }
    case AlgoKind::kDirect: {
      const double o = x.direct_alpha() / 2, b = x.direct_beta();
      if (!red && stages_broadcast(n, p, static_cast<double>(x.c.stage_min_bytes), static_cast<double>(x.c.llc_bytes))) {
        // Staged, only beyond the cache (direct.cc, message_class.h): the
        // root copies its buffer once into scratch, each receiver reads it
        // through a mapping, one copy per byte (placement-mean, as the staged
        // all_gather), where the FIFO costs the root a copy per receiver and
        // the receiver another. No reader starts before the root's copy is
        // done: the other cores wait for it. And as any mapped message (msg
        // above), the root's send ends only once its reader has read it: a
        // hand-off per reader.
        const double copy = n * x.all().beta_us_per_byte * x.c.single_copy_factor;
        at(0) += copy;
        for (int v = 1; v < p; ++v) {
          at(0) += o + (v % cores == 0 ? x.c.hand_off_us : x.c.hand_off_cross_us);
          at(v) += o + x.c.single_copy_alpha_us + n * x.peers().beta_us_per_byte * x.c.single_copy_factor;
        }
        for (int v = 1; v < cores; ++v) at(v) += copy;  // one rank per other core waits
        break;
      }
      for (int v = 1; v < p; ++v) red ? msg(v, 0, n, 1, o, b) : msg(0, v, n, 1, o, b);
      break;
    }
    default: return rooted_busy_us(a, red, x, chunk) * std::ceil(static_cast<double>(p) / cores);
  }
  std::vector<double> core(static_cast<size_t>(cores), 0.0);
  for (int v = 0; v < p; ++v) core[static_cast<size_t>(v % cores)] += w[static_cast<size_t>(v)];
  return *std::max_element(core.begin(), core.end());
}

// A nanosecond per hand-off: decides ties only.
constexpr double kTieBreakUsPerHop = 1e-3;

// Sequential hand-offs from the root to the farthest rank: p - 1 for the
// chain, one for direct, ceil(log2 p) for the trees.
int rooted_depth(AlgoKind a, int p) {
  return a == AlgoKind::kChain ? p - 1 : a == AlgoKind::kDirect ? 1 : ceil_log2(p);
}

// Oversubscribed, a rank that waits for a peer waits, each time, for the
// ranks queued before that peer on its core to yield, per round of messages
// that depend on the previous round; every algorithm's own terms count
// p / cores times (each core runs that many ranks' work). What a round costs
// depends on where the partners sit (rank r on core r mod cores, loomrun
// --bind core): a partner on another core runs while this rank runs, and the
// rank that yields hands its core to a core-mate with work of its own; a
// partner on the same core runs only once this rank has yielded to it, and
// then this rank waits for its turn back. Per round, for each of the
// p / cores - 1 other ranks of a core: hand_off_cross_us when no pair of the
// round shares a core, hand_off_us when one does.
// Measured, allreduce 8 B (2 KiB at 4 ranks), us, 300-500 iterations: 4 ranks
// ring (6 rounds, all across) 30.0, recursive doubling (one across, one
// within) 17.4; 8 ranks ring (14 across) 186.6, recursive doubling (one
// across, two within) 85.8, two-shot (two rounds with peers within) 70.9:
// about 4 us across and 11 us within per other rank at both rank counts,
// against an alpha of 0.5. Another day the same host read ring 6.1 and
// recursive doubling 6.6 at 4 ranks (0.5 / 5 us): the two move together with
// the host's context-switch cost, 3-10x apart; the defaults sit between.
// The earlier single figure (0.6 us per round whatever the placement, fitted
// on direct against recursive doubling) priced the ring's 2(p - 1) rounds
// like the hypercube's and chose Rabenseifner (two rounds within a core at 4
// ranks) over the ring at 32 and 512 KiB (1.18-1.29x slower, run 15).

struct Rounds {
  int cross = 0;  // no pair of the round shares a core
  int same = 0;   // some pair does
};

// Adds `times` rounds made of the exchanges `pairs`.
void add_round(Rounds& r, const std::vector<std::pair<int, int>>& pairs, int cores, int times = 1) {
  bool same = false;
  for (auto [i, j] : pairs) same = same || (i != j && i % cores == j % cores);
  (same ? r.same : r.cross) += times;
}

// Exchanges between i and partner(i) for every i (partner -1 or >= p: none).
template <class F>
std::vector<std::pair<int, int>> pairs_of(int p, F partner) {
  std::vector<std::pair<int, int>> v;
  for (int i = 0; i < p; ++i) {
    const int j = partner(i);
    if (j >= 0 && j < p) v.emplace_back(i, j);
  }
  return v;
}

// Rounds of dependent messages of a symmetric collective, by placement.
Rounds oversubscribed_rounds(AlgoKind a, Collective coll, int p, int cores) {
  Rounds r;
  cores = std::max(cores, 1);
  const Fold f = make_fold(p);
  // Every rank with every other: some pair shares a core once p > cores.
  auto all_peers = [&](int times) { (p > cores ? r.same : r.cross) += times; };
  auto shift = [&](int k) { return pairs_of(p, [&](int i) { return (i + k) % p; }); };
  auto xor_rounds = [&](int each) {
    // Power-of-two core over the fold's members (patterns.h).
    if (f.extra > 0) add_round(r, pairs_of(2 * f.extra, [](int i) { return i ^ 1; }), cores, 2);
    for (int m = 1; m < f.p2; m *= 2)
      add_round(r, pairs_of(p, [&](int i) {
                  const int c = f.core_of(i);
                  return c < 0 ? -1 : f.member_of(c ^ m);
                }),
                cores, each);
  };
  const int L = ceil_log2(p);
  switch (coll) {
    case Collective::kAllReduce:
      switch (a) {
        case AlgoKind::kRing: add_round(r, shift(1), cores, 2 * (p - 1)); break;
        case AlgoKind::kHypercube: xor_rounds(1); break;
        case AlgoKind::kRabenseifner: xor_rounds(2); break;
        case AlgoKind::kDirect: all_peers(1); break;
        case AlgoKind::kTwoShot: all_peers(2); break;
        case AlgoKind::kTree: {
          // Both trees' edges by the child's depth; each level up, then down.
          std::vector<int> rank_b(static_cast<size_t>(p));
          for (int q = 0; q < p; ++q) rank_b[static_cast<size_t>(dbtree_second_pos(p, q))] = q;
          for (int d = 1; d <= btree_depth(p); ++d) {
            std::vector<std::pair<int, int>> v;
            for (int pos = 1; pos < p; ++pos) {
              const TreeNode node = btree_node(p, pos);
              if (node.depth != d) continue;
              v.emplace_back(pos, node.parent);
              v.emplace_back(rank_b[static_cast<size_t>(pos)], rank_b[static_cast<size_t>(node.parent)]);
            }
            add_round(r, v, cores, 2);
          }
          break;
        }
        default:  // binomial reduce + broadcast, hierarchical on one host
          for (int m = 1; m < p; m *= 2) add_round(r, pairs_of(p, [&](int i) { return i + m; }), cores, 2);
          break;
      }
      break;
    case Collective::kReduceScatter:
    case Collective::kAllGather:
    case Collective::kAllToAll:  // pairwise, Bruck, direct as below
      switch (a) {
        case AlgoKind::kRing: add_round(r, shift(1), cores, p - 1); break;
        case AlgoKind::kHypercube:
        case AlgoKind::kRabenseifner: xor_rounds(1); break;
        case AlgoKind::kBruck:
          for (int k = 0; k < L; ++k) add_round(r, shift(1 << k), cores, 1);
          break;
        case AlgoKind::kPairwise:
          for (int k = 1; k < p; ++k) add_round(r, shift(k), cores, 1);
          break;
        default: all_peers(1); break;  // direct
      }
      break;
    default: break;
  }
  return r;
}

// The oversubscribed price of a symmetric collective whose own terms are t.
double oversubscribed_us(double t, AlgoKind a, Collective coll, int p, const CommCost& c) {
  if (!core_bound(c, p)) return t;
  const double per_core = static_cast<double>(p) / c.cores;
  const Rounds r = oversubscribed_rounds(a, coll, p, c.cores);
  return t * per_core + (r.cross * c.hand_off_cross_us + r.same * c.hand_off_us) * (per_core - 1);
}

}  // namespace

const char* algo_name(AlgoKind a) {
  int i = static_cast<int>(a);
  return (i >= 0 && i < kNumAlgoKinds) ? kNames[static_cast<size_t>(i)] : "invalid";
}

std::optional<AlgoKind> parse_algo(std::string_view name, Collective coll) {
  std::string l;
  for (char ch : name) l += static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
  if (l == "recursive_doubling") l = "hypercube";
  if (l == "double_binary_tree") l = "tree";
  if (l == "one_shot") l = "direct";
  if (l == "halving_doubling" || l == "recursive_halving") l = "rabenseifner";
  if (l == "double_tree") l = "tree";
  if (l == "ring" && (coll == Collective::kBroadcast || coll == Collective::kReduce)) l = "chain";
  for (int i = 0; i < kNumAlgoKinds; ++i) {
    if (l == kNames[static_cast<size_t>(i)]) return static_cast<AlgoKind>(i);
  }
  return std::nullopt;
}

std::vector<AlgoKind> algos_for(Collective coll) {
  using A = AlgoKind;
  switch (coll) {
    case Collective::kAllReduce:
      return {A::kRing,         A::kTree,   A::kBinomial, A::kHypercube,
              A::kRabenseifner, A::kDirect, A::kTwoShot,  A::kHierarchical};
    case Collective::kReduceScatter: return {A::kRing, A::kRabenseifner, A::kDirect, A::kPairwise};
    case Collective::kAllGather: return {A::kRing, A::kHypercube, A::kBruck, A::kDirect};
    case Collective::kBroadcast: return {A::kChain, A::kTree, A::kBinomial, A::kScatterAllgather, A::kDirect};
    case Collective::kReduce: return {A::kChain, A::kTree, A::kBinomial, A::kRabenseifner, A::kDirect};
    case Collective::kAllToAll: return {A::kPairwise, A::kBruck, A::kDirect};
    case Collective::kSendRecv: return {A::kP2p};
  }
  return {};
}

bool algo_supports(AlgoKind a, Collective coll) {
  std::vector<AlgoKind> v = algos_for(coll);
  return std::find(v.begin(), v.end(), a) != v.end();
}

std::optional<Estimate> estimate(AlgoKind a, Collective coll, size_t bytes, int p, const CommCost& c) {
  if (!algo_supports(a, coll) || p < 1) return std::nullopt;
  Estimate e;
  e.algo = a;
  const double n = static_cast<double>(bytes);
  if (p == 1) {
    e.chunk_bytes = bytes;
    return e;  // nothing to communicate
  }
  const bool pow2 = is_pow2(p);
  const bool needs_pow2 = (a == AlgoKind::kHypercube && coll != Collective::kAllReduce) ||
                          (a == AlgoKind::kRabenseifner && coll != Collective::kAllReduce);
  if (needs_pow2 && !pow2) return std::nullopt;

  // Channels: enough to fill the link, but not so many that each carries a
  // sliver of a small message.
  int need = static_cast<int>(std::ceil(1.0 / std::clamp(c.channel_fraction, 1e-3, 1.0)));
  int by_size = static_cast<int>(bytes / std::max<size_t>(c.min_bytes_per_channel, 1));
  e.channels = std::clamp(std::min(need, by_size), 1, std::max(c.max_channels, 1));
  double fill = std::min(1.0, e.channels * c.channel_fraction);
  Ctx x{c, n, p, 1.0 / std::max(fill, 1e-3), moves_as_reduced(coll, p, a == AlgoKind::kDirect)};
  const bool symmetric = coll == Collective::kAllReduce || coll == Collective::kReduceScatter ||
                         coll == Collective::kAllGather || coll == Collective::kAllToAll;
  if (symmetric && core_bound(c, p)) {
    x.same_core = c.same_core_beta_factor;
    x.cores = c.cores;
  }

  const int L = ceil_log2(p);
  const int L2 = ceil_log2(floor_pow2(p));  // steps of the power-of-two core
  const double pp = p;
  double t = 0;
  size_t chunk = static_cast<size_t>(std::ceil(n / e.channels));
  auto block_chunk = [&] { chunk = static_cast<size_t>(std::ceil(n / pp / e.channels)); };
  // The direct allreduces (direct_reduce.cc) store what they receive in
  // scratch and reduce it from there in local steps; the ring, tree and
  // Rabenseifner reduce a message as it is read. The extra round trip
  // through scratch, a write and a read of each stored byte, is priced as a
  // copy: two of a reduction's three streams, at its rate (in or out of the
  // cache: x.g()). Without it the model chose two-shot over the ring at 3, 5,
  // 6 and 7 ranks at every size from 64 KiB; measured, 2 rounds, us out of
  // place (performance.md Run 27): 3 ranks 4 MiB two-shot 1519-1567 against
  // the ring's 879-890, 16 MiB 6975-9149 against 4623; 5 ranks 4 MiB
  // 2814-3089 against 2085-2120, 16 MiB 13090-13870 against 9739-9926; 6
  // ranks 16 MiB 17565-18939 against 12436-12707; two-shot still ahead at
  // 64 KiB (5 ranks 78-114 against 93-142).
  auto scratch_pass = [&](double stored_bytes) { return 2.0 / 3.0 * stored_bytes * x.g(); };
  // The chunk of a schedule in slices or columns (ring allreduce,
  // Rabenseifner allreduce, recursive-doubling all_gather): whole blocks
  // unless, on one host, what a step writes and a later step sends again
  // (`reread` bytes per rank) outgrows a core's cache: then a quarter of the
  // cache, so it is sent again from there. Not with more than two ranks per
  // core (measured no gain at 8 on 2, Run 27).
  auto cache_chunk = [&](size_t whole, double reread, bool crowd_ok) {
    if (c.nhosts != 1 || c.cache_bytes == 0 || reread <= static_cast<double>(c.cache_bytes)) return whole;
    if (!crowd_ok && core_bound(c, p) && p > 2 * c.cores) return whole;
    return std::min(whole, std::max<size_t>(c.min_chunk_bytes, c.cache_bytes / 4));
  };

  switch (coll) {
    case Collective::kAllReduce:
      switch (a) {
        case AlgoKind::kRing: {
          LinkCost r = x.ring();
          // Reduce-scatter messages are reduced on receipt, all-gather ones stored.
          const double m = n / pp;
          const double b = r.beta_us_per_byte;
          t = (pp - 1) * (2 * r.alpha_us + x.move(m, b, Land::kReduce) + x.move(m, b, Land::kStore)) +
              (pp - 1) / pp * n * x.g();
          // The ring's slices (ring_allreduce): whole blocks, however many
          // channels, except on one host once a block outgrows a core's
          // cache: then each reduced (or received) slice is forwarded from
          // the cache instead of re-read after the whole block. Measured,
          // 256 KiB slices against whole blocks, out of place / in place
          // (performance.md Run 26): 2 ranks 4 and 8 MiB within the spread,
          // 16 MiB medians -1% / -17%, 64 MiB -6% / -28%, 256 MiB -16% /
          // -25%, at 1 and 2 MiB (blocks in cache) 0 to +10%; ring forced,
          // 4 rounds in two sittings, us: 4 ranks on 2 cores 16 MiB
          // 9010-11121 / 7785-10963 -> 6572-6680 (one 13676) / 5372-6472,
          // 64 MiB 50222-59782 / 43419-46391 -> 26509-30080 / 19913-26396;
          // 8 ranks 16 MiB 24020-26486 / 22277-24109 -> 22042-25853 /
          // 18367-20054, 64 MiB 103482-119687 / 74709-101769 -> 90169-117406
          // / 81141-102380. Same time in the model: the slices' extra
          // phases against the re-read it does not price (Rabenseifner, in
          // columns by the same rule, measured faster at 4 ranks: Run 27).
          // Across hosts (not measured) each slice's phase would wait a
          // network latency: whole blocks there.
          // Two ranks: whole halves up to twice the cache. Their ring is two
          // phases, which 256 KiB slices of a 2 MiB half make nine, each one
          // a meeting of the two ranks; the half re-read from the shared
          // last-level cache costs less. Measured (performance.md Run 43),
          // 2 ranks 4 MiB, alternating, us out of place / in place: fast host
          // phase slices 297-316 / 241-247 against whole 280-292 / 197-200;
          // slow phase 2130-2206 / 1992-2055 against 2040-2044 / 1972-2006;
          // from 6 MiB (3 MiB halves) slices still win (8 MiB: 3702-4188 /
          // 4006-4216 against 4744-5123 / 4604-5048).
          const double reread = p == 2 ? m / 2 : m;
          chunk = cache_chunk(static_cast<size_t>(std::ceil(n / pp)), reread, /*crowd_ok=*/true);
          break;
        }
        case AlgoKind::kTree: {
          // Reduce up then broadcast down, pipelined; with a double binary
          // tree the busiest rank sends 2n in all and reduces n for most p
          // (as a ring does), n and n/2 at p = 2 (each rank the root of one
          // tree, the leaf of the other: one half up, the other down).
          const DbtreeLoad load = dbtree_max_load(x.p);
          LinkCost l = x.tree_edge();
          l.beta_us_per_byte *= load.sends / 2.0;
          Pipe pi = pipelined(2 * L, n, l, c.min_chunk_bytes);
          t = pi.us + load.reduces / 2.0 * n * x.g();
          chunk = (pi.chunk + static_cast<size_t>(e.channels) - 1) / static_cast<size_t>(e.channels);
          break;
        }
        case AlgoKind::kBinomial:
          for (int k = 0; k < L; ++k) t += 2 * (x.lvl(k).alpha_us + n * x.lvl(k).beta_us_per_byte) + n * x.g();
          break;
        case AlgoKind::kHypercube:
          // Each exchange is reduced as it arrives. Priced as before that
          // (stored, then reduced): oversubscribed, a single-copy read of the
          // partner's whole partial saves no summed work either way
          // (TunerModel.OversubscribedScratchReadsSaveNothing).
          for (int k = 0; k < L2; ++k)
            t += x.lvl(k).alpha_us + x.move(n, x.lvl(k).beta_us_per_byte, Land::kStoreThenReduce) + n * x.g();
          t += fold_cost(x, true, true);
          break;
        case AlgoKind::kRabenseifner:
          // Halving far-first (hypercube.cc: core c ends owning block c), so
          // step j moves n/2^j over distance 2^(L2-j); doubling mirrored.
          for (int j = 1; j <= L2; ++j) {
            LinkCost l = x.lvl(L2 - j);
            double m = n / std::ldexp(1.0, j);
            t += 2 * l.alpha_us + x.move(m, l.beta_us_per_byte, Land::kReduce) + x.move(m, l.beta_us_per_byte, Land::kStore) +
                 m * x.g();
          }
          t += fold_cost(x, true, true);
          // Its columns (rabenseifner_allreduce), as the ring's slices: a
          // whole block per column (however many channels), except on one
          // host once the half a rank reduces in the first step outgrows a
          // core's cache, which the doubling re-read from memory: then
          // columns of a quarter of the cache. Measured, 4 ranks on 2 cores,
          // us out of place / in place, whole blocks -> 256 KiB columns
          // (performance.md Run 27): 64 MiB 31419, 36984 / 28396, 32901 ->
          // 25189, 23526 / 17383, 19195; 16 MiB 6076, 9236 / 5312, 7198 ->
          // 6419, 6131 / 4356, 4848; 4 MiB 1141, 1548 / 1053, 1217 -> 1110,
          // 1249 / 931, 985. Not with more than two ranks per core: 8 ranks
          // on 2 cores measured no gain (16 / 64 MiB, 256 KiB - 2 MiB
          // columns against whole blocks, 7 rounds: within a 1.5x spread):
          // a turn's columns leave the cache the core's other ranks share
          // before its next turn, and every extra phase waits for their
          // turns. Not priced, as the ring's slices are not: both gain
          // alike where both apply.
          chunk = cache_chunk(static_cast<size_t>(std::ceil(n / floor_pow2(p))), n / 2, /*crowd_ok=*/false);
          break;
        case AlgoKind::kDirect:
          t = x.direct_alpha() + (pp - 1) * (x.move(n, x.direct_beta(), Land::kStoreThenReduce) + n * x.g()) +
              scratch_pass((pp - 1) * n);
          break;
        case AlgoKind::kTwoShot:
          // Reduce-scatter by direct reads into scratch + local reduce, then gather.
          t = 2 * x.direct_alpha() + (pp - 1) * x.move(n / pp, x.direct_beta(), Land::kStoreThenReduce) +
              (pp - 1) * x.move(n / pp, x.direct_beta(), Land::kStore) + (pp - 1) / pp * n * x.g() +
              scratch_pass((pp - 1) / pp * n);
          block_chunk();
          break;
        case AlgoKind::kHierarchical: {
          // Binomial reduce + broadcast inside a host of q ranks, recursive
          // doubling (with fold) among the H leaders over the worst link. On
          // one host it is binomial reduce + broadcast, which recursive
          // doubling always beats, so it is never chosen there.
          const int H = std::max(c.nhosts, 1), q = (p + H - 1) / H;
          LinkCost in = c.intra.alpha_us > 0 ? c.intra : x.lvl(0), out = x.all();
          const int lq = ceil_log2(q), lh = ceil_log2(floor_pow2(H));
          t = lq * (2 * (in.alpha_us + n * in.beta_us_per_byte) + n * x.g());
          t += lh * (out.alpha_us + n * out.beta_us_per_byte + n * x.g());
          if (!is_pow2(H)) t += 2 * (out.alpha_us + n * out.beta_us_per_byte) + n * x.g();
          break;
        }
        default: return std::nullopt;
      }
      t = oversubscribed_us(t, a, coll, p, c);
      break;
    case Collective::kReduceScatter:
      switch (a) {
        case AlgoKind::kRing: {
          // Step 1 sends a block of the input; every later step forwards
          // the partial sum it reduced into scratch (ring.cc).
          LinkCost r = x.ring();
          const double m = n / pp, b = r.beta_us_per_byte;
          t = (pp - 1) * (r.alpha_us + m * x.g()) + x.move(m, b, Land::kReduce) +
              (pp - 2) * x.move_from_scratch(m, b, Land::kReduce);
          break;
        }
        case AlgoKind::kRabenseifner:
          // Step 1 sends half of the input; later steps send from the
          // working copy W in scratch (hypercube.cc). Measured, 8 ranks on 2
          // cores, 8 MiB: the ring 4.4-6.8 ms against halving 5.9-8.5 since
          // scratch is mapped: halving copies n/2 into FIFOs, the ring n/p.
          // Far-first, as in the allreduce (hypercube.cc: mask p2 >> (j+1)):
          // step j moves n/2^j over distance 2^(L-j). Regression: priced
          // near-first, the crossing step at n/4 instead of n/2.
          for (int j = 1; j <= L; ++j) {
            LinkCost l = x.lvl(L - j);
            double m = n / std::ldexp(1.0, j);
            t += l.alpha_us + m * x.g() +
                 (j == 1 ? x.move(m, l.beta_us_per_byte, Land::kReduce)
                         : x.move_from_scratch(m, l.beta_us_per_byte, Land::kReduce));
          }
          break;
        case AlgoKind::kDirect:
          t = x.direct_alpha() + (pp - 1) / pp * n * (x.direct_beta() + x.g());
          break;
        case AlgoKind::kPairwise: {
          LinkCost l = x.peers();
          t = (pp - 1) * (l.alpha_us + n / pp * (l.beta_us_per_byte + x.g()));
          break;
        }
        default: return std::nullopt;
      }
      block_chunk();
      // Recursive halving can go in columns too (hypercube.cc, with
      // LOOM_CHUNK_BYTES) but keeps whole blocks, however many channels: 4
      // ranks on 2 cores, 16 and 64 MiB, 7 alternated rounds, 256 KiB
      // columns measured as fast as whole blocks (its later steps' partial
      // sums are read through a mapping of the sender's scratch).
      if (a == AlgoKind::kRabenseifner) chunk = static_cast<size_t>(std::ceil(n / pp));
      t = oversubscribed_us(t, a, coll, p, c);
      break;
    case Collective::kAllGather:
      switch (a) {
        case AlgoKind::kRing: {
          LinkCost r = x.ring();
          t = (pp - 1) * (r.alpha_us + x.move(n / pp, r.beta_us_per_byte, Land::kStore));
          break;
        }
        case AlgoKind::kHypercube:
          // Near-first (hypercube.cc keeps each exchange one contiguous
          // range): step j moves 2^(j-1) blocks over distance 2^(j-1).
          for (int j = 1; j <= L; ++j) {
            LinkCost l = x.lvl(j - 1);
            t += l.alpha_us + x.move(n * std::ldexp(1.0, j - 1) / pp, l.beta_us_per_byte, Land::kStore);
          }
          break;
        case AlgoKind::kBruck:
          // Step k moves cnt = min(2^k, p - 2^k) blocks, written straight into
          // their final places (hypercube.cc, no rotation): a run that wraps
          // past the last block goes as two messages, each below the
          // single-copy threshold sooner. The slowest rank's split counts.
          // Measured, 4 ranks, 512 KiB (128 KiB blocks; single copy from 256
          // KiB): Bruck 109 us, recursive doubling 74, priced alike before.
          for (int k = 0; k < L; ++k) {
            LinkCost l = x.lvl(k);
            const int cnt = std::min(1 << k, p - (1 << k));
            const double blk = n / pp;
            double worst = l.alpha_us + x.move(cnt * blk, l.beta_us_per_byte, Land::kStore);
            for (int head = 1; head < cnt; ++head)  // head blocks before the wrap
              worst = std::max(worst, 2 * l.alpha_us + x.move(head * blk, l.beta_us_per_byte, Land::kStore) +
                                          x.move((cnt - head) * blk, l.beta_us_per_byte, Land::kStore));
            t += worst;
          }
          break;
        case AlgoKind::kDirect: {
          const double m = n / pp;
          if (core_bound(c, p) && c.stage_min_bytes > 0 && m >= static_cast<double>(c.stage_min_bytes)) {
            // Staged (direct.cc): the block copied once into scratch, then
            // each peer's block read through a mapping, one copy per byte
            // (the FIFO's beta prices two). Measured, 2 cores, -z 1, us, 3
            // alternated rounds (performance.md Run 35), staged direct
            // against recursive doubling through the FIFOs: 8 ranks 1 MiB
            // 210-260 / 657-910, 4 MiB 1268-2019 / 3746-5894, 16 MiB
            // 7641-11070 / 13593-19279; 4 ranks 1 MiB 113-132 / 182-281,
            // 4 MiB 403-855 / 1162-1745; 6 ranks 1 MiB 158-180 / 410-481.
            const double copy = x.all().beta_us_per_byte * c.single_copy_factor;
            t = x.direct_alpha() + m * copy +
                (pp - 1) * (c.single_copy_alpha_us + m * x.peers().beta_us_per_byte * c.single_copy_factor);
          } else if (core_bound(c, p)) {
            t = x.direct_alpha() + (pp - 1) * x.move(m, x.direct_beta(), Land::kStore);
          } else {
            // Measured only with ranks sharing cores (above; through the
            // FIFOs, 8 ranks 64-256 KiB, 0.73-0.96 of recursive doubling in
            // one process, --ab). Elsewhere (a CPU per rank, GPUs, several
            // hosts) it is left to LOOM_ALGO rather than to a guess.
            return std::nullopt;
          }
          break;
        }
        default: return std::nullopt;
      }
      block_chunk();
      // Recursive doubling in columns (hypercube_all_gather), from 4 ranks
      // (at 2 its one step sends nothing received): what step j received,
      // step j + 1 sends on, up to half the output in the last step.
      // Measured, 4 ranks on 2 cores, us out of place / in place, whole
      // blocks -> 256 KiB columns, 4 rounds (performance.md Run 27): 4 MiB
      // 543-999 / 489-632 -> 514-636 / 453-591, 16 MiB 3352-4800 /
      // 2877-9365 -> 3108-3729 / 2350-6362, 64 MiB 16789-18964 /
      // 14704-18965 -> 13714-15635 / 10762-12186; 8 ranks (4 per core)
      // 4 MiB 1697-1803 -> 1930-1948, 64 MiB 29288-29519 -> 43105-54406.
      if (a == AlgoKind::kHypercube)
        chunk = L2 >= 2 ? cache_chunk(static_cast<size_t>(std::ceil(n / pp)), n / 2, /*crowd_ok=*/false)
                        : static_cast<size_t>(std::ceil(n / pp));
      t = oversubscribed_us(t, a, coll, p, c);
      break;
    case Collective::kBroadcast:
    case Collective::kReduce: {
      // Rooted collectives are priced by their steady-state time per op, the
      // busiest rank's work (rooted_busy_us): issued back to back they
      // overlap, since the root does not wait for the leaves (or the leaves
      // for the root), so a stream of them runs at the bottleneck rank's
      // pace, not at the depth of the tree. The pipelined algorithms keep the
      // chunk that minimises one op's latency.
      const bool red = coll == Collective::kReduce;
      const double gam = red ? x.g() : 0;
      switch (a) {
        case AlgoKind::kChain: {
          LinkCost r = x.ring();
          r.beta_us_per_byte += gam;
          // Oversubscribed, a chunk reaches the next rank (on the other core)
          // only once that rank's core-mates have yielded: per hop and chunk
          // a hand-off each, which the chunk must amortise. Measured, 8 ranks
          // on 2 cores, us (interleave.sh -R 3 -i 100-200 -x "-z 1"): reduce
          // 256 KiB 98.4 in 18 KiB chunks (alpha alone) / 78.2 in 64 KiB,
          // 1 MiB 333 / 288 in 128 KiB, 4 MiB 1519 / 1382 in 128 KiB. The
          // broadcast chain gains alike (64 KiB 25.9 / 20.0 in 32 KiB, 1 MiB
          // 328 / 286 in 256 KiB) but stays 1.25-1.45x behind the pipelined
          // binomial tree for a reason the model does not know; with fewer
          // chunks it would price the chain below the tree: reduce only.
          const bool over = core_bound(c, p);
          if (red && over) r.alpha_us += (static_cast<double>(p) / c.cores - 1) * c.hand_off_cross_us;
          chunk = pipelined(p - 1, n, r, c.min_chunk_bytes).chunk;
          // And below the size from which partial sums go mapped: a mapped
          // chunk costs its sender a hand-off (rooted_core_busy_us), and 256
          // KiB chunks measured 2.3-2.5x slower than 128 KiB ones (8 ranks,
          // 256 KiB: 183 against 84 us; 1 MiB 729 / 288).
          // (The transport maps by message size alone, whatever the cache.)
          if (red && over && c.map_min_bytes > 0 && chunk >= c.map_min_bytes)
            chunk = std::max<size_t>(c.min_chunk_bytes, c.map_min_bytes / 2);
          break;
        }
        case AlgoKind::kTree: {
          LinkCost l = x.tree_edge();
          l.beta_us_per_byte = 2 * (l.beta_us_per_byte + gam);
          chunk = pipelined(L, n, l, c.min_chunk_bytes).chunk;
          break;
        }
        case AlgoKind::kScatterAllgather:
          if (red) return std::nullopt;
          block_chunk();
          break;
        case AlgoKind::kRabenseifner:
          if (!red) return std::nullopt;
          break;
        case AlgoKind::kBinomial: {
          // Pipelines like a tree of depth ceil(log2 p) whose root sends (or
          // reduces) each chunk ceil(log2 p) times (the factor cancels in the
          // chunk). Reduce oversubscribed as the chain: a hand-off per hop
          // and chunk to amortise, and chunks that stay in cache while the
          // ranks take turns: a whole-message step writes its n bytes into
          // the FIFO long before the parent gets the core to read them.
          // And every chunk a rank waits for is a turn on its core, which
          // small chunks do not amortise: one size, an eighth of the cache.
          // Measured, -z 1, binomial (far-first, partial sums in the FIFO)
          // in 64 / 128 / 256 / 512 KiB chunks, us: 4 ranks 16 MiB 3383 /
          // 2886 / 3299 / 3538, 8 ranks 7753 / 6980 / 7528 / 8353; whole
          // messages 4 ranks 1 / 2 MiB 180-200 / 392-430 against 121-126 /
          // 261-263 in 128 KiB chunks; 4 ranks 64 / 256 KiB in 16 / 32 / 64
          // KiB chunks 11.2-12.0 / 9.5-11.0 / 9.3-10.5 and 43-45 / 37-39 /
          // 34-35 (min of 3 runs each, `LOOM_CHUNK_BYTES=C reduce_perf -A
          // binomial -z 1`).
          const bool over = core_bound(c, p);
          if (red && over && c.cache_bytes > 0) {
            chunk = std::min(std::max<size_t>(bytes, 1), std::max<size_t>(c.min_chunk_bytes, c.cache_bytes / 8));
          } else {
            LinkCost r = x.all();
            r.beta_us_per_byte += gam;
            chunk = pipelined(L, n, r, c.min_chunk_bytes).chunk;
          }
          break;
        }
        case AlgoKind::kDirect: break;
        default: return std::nullopt;
      }
      if (core_bound(c, p)) {
        // Equal summed work (a chain and a binomial tree of tiny messages
        // both cost p - 1 messages) goes to the shallower algorithm: with
        // ranks waiting for a core, every hand-off in a row is a chance to
        // wait for the next rank's turn. Measured, 8 B: 4 ranks binomial
        // 0.55-0.60 us, chain 0.66-0.75; 8 ranks 32 B 1.1 vs 1.5.
        t = rooted_core_busy_us(a, red, x, chunk) + kTieBreakUsPerHop * rooted_depth(a, p);
      } else {
        t = rooted_busy_us(a, red, x, chunk);
      }
      chunk = (chunk + static_cast<size_t>(e.channels) - 1) / static_cast<size_t>(e.channels);
      break;
    }
    case Collective::kAllToAll:
      switch (a) {
        case AlgoKind::kPairwise: {
          LinkCost l = x.peers();
          t = (pp - 1) * (l.alpha_us + x.move(n / pp, l.beta_us_per_byte, Land::kStore));
          break;
        }
        case AlgoKind::kBruck:
          for (int k = 0; k < L; ++k) t += x.lvl(k).alpha_us + x.move(n / 2, x.lvl(k).beta_us_per_byte, Land::kStore);
          break;
        case AlgoKind::kDirect: {
          // On one host each rank copies its p-1 incoming blocks itself, as
          // pairwise does, just without a phase per peer: no fan-in penalty
          // (measured, 4 and 8 ranks: direct 1.02-1.16x faster than pairwise
          // at every size from 128 KiB). Across hosts p-1 senders converge on
          // one NIC at once: direct_efficiency applies.
          const double b = c.nhosts > 1 ? x.direct_beta() : x.peers().beta_us_per_byte;
          t = x.direct_alpha() + (pp - 1) * x.move(n / pp, b, Land::kStore);
          break;
        }
        default: return std::nullopt;
      }
      block_chunk();
      t = oversubscribed_us(t, a, coll, p, c);
      break;
    case Collective::kSendRecv:
      t = x.all().alpha_us + n * x.all().beta_us_per_byte;
      break;
  }
  e.us = t;
  e.chunk_bytes = std::max<size_t>(chunk, 1);
  return e;
}

}  // namespace loom::topo
