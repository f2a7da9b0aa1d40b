#include "stress/stress_plan.h"

#include "stress/stress_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace loom::stress {

uint64_t mix(uint64_t a, uint64_t b) {
  Rng r(a ^ (b * 0xd6e8feb86659fd93ull));
  r.next();
  return r.next() ^ b;
}
uint64_t mix(uint64_t a, uint64_t b, uint64_t c) { return mix(mix(a, b), c); }

namespace {

constexpr const char* kKindNames[kNumKinds] = {"allreduce", "reduce_scatter", "all_gather", "broadcast",
                                               "reduce",    "all_to_all",     "sendrecv",   "group"};

Collective coll_of(Kind k) { return static_cast<Collective>(static_cast<int>(k)); }

// Element counts: the sizes where transports and schedules change behaviour
// (slots of 120 bytes, cache lines, pages, the 256 KiB single-copy and FIFO
// step, the 512 KiB chunk, the 2 MiB FIFO), small primes that divide nothing,
// and a log-uniform spread up to the cap.
size_t gen_count(Rng& r, size_t es, size_t cap) {
  static const std::vector<size_t> kPrimes = {3, 5, 7, 11, 13, 17, 31, 61, 127, 251, 509, 1021, 4093, 65521};
  static const std::vector<size_t> kElemEdges = {63, 64, 65, 127, 128, 129, 255, 256, 257, 1023, 1024, 1025};
  static const std::vector<size_t> kByteEdges = {8,       16,       56,        64,         88,       96,
                                                 112,     120,      128,       136,        4095,     4096,
                                                 4097,    8192,     65536,     131072,     262144,   524288,
                                                 1048576, 2097152,  2097152 - 4096, 4194304};
  size_t c = 0;
  const uint64_t k = r.below(20);
  if (k < 3) {
    c = r.below(4);
  } else if (k < 5) {
    c = r.pick(kPrimes);
  } else if (k < 8) {
    c = r.pick(kElemEdges);
  } else if (k < 12) {
    const size_t b = r.pick(kByteEdges);
    const long delta = static_cast<long>(r.below(3)) - 1;
    c = static_cast<size_t>(std::max<long>(0, static_cast<long>(b / es) + delta));
  } else if (k < 19) {
    const double lg = std::log(static_cast<double>(std::min<size_t>(cap, size_t{1} << 16)) + 1.0);
    c = static_cast<size_t>(std::exp(r.uniform() * lg));
  } else {
    // Large: near the cap.
    c = cap > 8 ? cap - r.below(std::min<size_t>(cap / 4, 4096) + 1) : cap;
  }
  return std::min(c, cap);
}

DataType gen_dt(Rng& r) { return static_cast<DataType>(r.below(kNumDataTypes)); }

// Largest count of dt whose biggest buffer of `coll` fits in `max_bytes`.
size_t count_cap(Collective coll, size_t es, int nranks, size_t max_bytes) {
  size_t mult = 1;
  if (coll == Collective::kReduceScatter || coll == Collective::kAllGather || coll == Collective::kAllToAll)
    mult = static_cast<size_t>(nranks);
  return max_bytes / (es * mult);
}

Part gen_collective(Rng& r, Collective coll, int nranks, size_t max_bytes) {
  Part p;
  p.coll = coll;
  p.dt = gen_dt(r);
  p.op = p.reduces() ? static_cast<RedOp>(r.below(kNumRedOps)) : RedOp::kSum;
  p.count = gen_count(r, dtype_size(p.dt), count_cap(coll, dtype_size(p.dt), nranks, max_bytes));
  p.root = static_cast<int>(r.below(static_cast<uint64_t>(nranks)));
  p.in_place = r.chance(0.35);
  p.mixed_place = nranks > 1 && r.chance(0.15);
  p.salt = r.below(uint64_t{1} << 24);
  if (!p.reduces()) {
    p.scheme = Scheme::kHashBytes;
  } else if (hash_bound(p.dt, p.op, nranks) >= 1 && r.chance(0.8)) {
    p.scheme = Scheme::kHashValues;
  }
  return p;
}

Part gen_p2p(Rng& r, int nranks, size_t max_bytes, bool allow_lone) {
  Part p;
  p.coll = Collective::kSendRecv;
  p.scheme = Scheme::kHashBytes;
  p.salt = r.below(uint64_t{1} << 24);
  const int n = nranks;
  std::vector<std::pair<int, int>> pairs;
  if (allow_lone && n >= 2 && r.chance(0.15)) {
    p.grouped = false;
    int a = static_cast<int>(r.below(n)), b = static_cast<int>(r.below(n - 1));
    if (b >= a) ++b;
    pairs.push_back({a, b});
  } else {
    switch (r.below(4)) {
      case 0: {  // everyone sends to rank + k (k = 0: to itself)
        const int k = static_cast<int>(r.below(n));
        for (int i = 0; i < n; ++i) pairs.push_back({i, (i + k) % n});
        break;
      }
      case 1: {  // a random permutation
        std::vector<int> perm(n);
        std::iota(perm.begin(), perm.end(), 0);
        for (int i = n - 1; i > 0; --i) std::swap(perm[i], perm[r.below(i + 1)]);
        for (int i = 0; i < n; ++i) pairs.push_back({i, perm[i]});
        break;
      }
      case 2: {  // random pairs, several between the same two ranks too
        const int m = 1 + static_cast<int>(r.below(2 * n));
        for (int i = 0; i < m; ++i)
          pairs.push_back({static_cast<int>(r.below(n)), static_cast<int>(r.below(n))});
        break;
      }
      default: {  // exchanges: both directions between partners
        const int m = 1 + static_cast<int>(r.below(n));
        for (int i = 0; i < m; ++i) {
          int a = static_cast<int>(r.below(n)), b = static_cast<int>(r.below(n));
          pairs.push_back({a, b});
          pairs.push_back({b, a});
        }
        break;
      }
    }
  }
  const bool one_dt = r.chance(0.6);
  const DataType dt0 = gen_dt(r);
  const size_t cap_bytes = std::max<size_t>(max_bytes / std::max<size_t>(1, (pairs.size() + n - 1) / n), 1);
  uint64_t t = 0;
  for (auto [a, b] : pairs) {
    Transfer x;
    x.src = a;
    x.dst = b;
    x.send_dt = one_dt ? dt0 : gen_dt(r);
    const size_t es = dtype_size(x.send_dt);
    x.count = gen_count(r, es, cap_bytes / es);
    x.recv_dt = x.send_dt;
    x.recv_count = x.count;
    x.salt = p.salt + (t++) * 7919;
    p.xfers.push_back(x);
  }
  return p;
}

std::vector<Kind> enabled(uint32_t mask) {
  std::vector<Kind> out;
  for (int k = 0; k < kNumKinds; ++k)
    if (mask & (1u << k)) out.push_back(static_cast<Kind>(k));
  return out;
}

Op gen_op(Rng& r, int nranks, const GenOptions& g, size_t max_bytes) {
  Op op;
  const std::vector<Kind> kinds = enabled(g.kinds);
  op.kind = r.pick(kinds);
  if (op.kind == Kind::kSendRecv) {
    op.parts.push_back(gen_p2p(r, nranks, max_bytes, true));
    op.group = op.parts[0].grouped;
    op.nested = op.group && r.chance(0.1);
  } else if (op.kind == Kind::kGroup) {
    // Collectives (and maybe transfers) in one group; parts from the enabled
    // collectives, all of them when only groups are enabled.
    std::vector<Kind> colls;
    for (Kind k : kinds)
      if (k != Kind::kGroup && k != Kind::kSendRecv) colls.push_back(k);
    if (colls.empty())
      for (int k = 0; k < 6; ++k) colls.push_back(static_cast<Kind>(k));
    const int nparts = 1 + static_cast<int>(r.below(3));
    const bool with_p2p = r.chance(0.5);
    const size_t part_max = max_bytes / static_cast<size_t>(nparts + (with_p2p ? 1 : 0));
    const int p2p_at = with_p2p ? static_cast<int>(r.below(nparts + 1)) : -1;
    for (int i = 0; i <= nparts; ++i) {
      if (i == p2p_at) op.parts.push_back(gen_p2p(r, nranks, part_max, false));
      if (i < nparts) op.parts.push_back(gen_collective(r, coll_of(r.pick(colls)), nranks, part_max));
    }
    op.group = true;
    op.nested = r.chance(0.2);
  } else {
    op.parts.push_back(gen_collective(r, coll_of(op.kind), nranks, max_bytes));
  }
  return op;
}

}  // namespace

const char* scheme_name(Scheme s) {
  switch (s) {
    case Scheme::kVerifiable: return "verifiable";
    case Scheme::kHashBytes: return "hashed bytes";
    case Scheme::kHashValues: return "hashed values";
  }
  return "?";
}

const char* kind_name(Kind k) {
  const int i = static_cast<int>(k);
  return i >= 0 && i < kNumKinds ? kKindNames[i] : "invalid";
}

bool parse_kinds(const std::string& list, uint32_t* mask, std::string* err) {
  *mask = 0;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string name = list.substr(pos, end - pos);
    if (!name.empty()) {
      int found = -1;
      for (int k = 0; k < kNumKinds; ++k)
        if (name == kKindNames[k]) found = k;
      if (found < 0) {
        if (auto c = parse_collective(name)) found = static_cast<int>(*c);
      }
      if (name == "all") {
        *mask |= kAllKinds;
      } else if (found < 0) {
        *err = fmt::format("unknown collective '{}' (known: all, allreduce, reduce_scatter, all_gather, broadcast, "
                           "reduce, all_to_all, sendrecv, group)",
                           name);
        return false;
      } else {
        *mask |= 1u << found;
      }
    }
    pos = end + 1;
  }
  if (*mask == 0) {
    *err = "empty collective list";
    return false;
  }
  return true;
}

Step make_step(uint64_t seed, uint64_t step_index, int nranks, const GenOptions& g, uint64_t first_op) {
  Rng r(mix(seed, step_index, static_cast<uint64_t>(nranks)));
  Step s;
  if (g.split && g.depth < 2 && nranks >= 2 && r.chance(g.depth == 0 ? 0.02 : 0.05)) {
    s.type = Step::Type::kSplit;
    s.op_index = first_op;
    const int ncolors = 1 + static_cast<int>(r.below(3));
    for (int i = 0; i < nranks; ++i) {
      s.colors.push_back(r.chance(0.15) ? -1 : static_cast<int>(r.below(ncolors)));
      s.keys.push_back(static_cast<int>(r.below(4)) - 1);
    }
    s.child_seed = r.next();
    s.child_steps = 1 + static_cast<int>(r.below(8));
    s.interleave = r.chance(0.5);
    s.overlap = r.chance(0.5);
    s.concurrent = r.chance(0.5);
    return s;
  }
  s.async = g.async && r.chance(0.4);
  const int nops = s.async ? 1 + static_cast<int>(r.below(8)) : 1;
  // An async batch holds every op's buffers at once: keep it within 4x the cap.
  const size_t op_max = nops <= 4 ? g.max_bytes : g.max_bytes * 4 / static_cast<size_t>(nops);
  for (int i = 0; i < nops; ++i) {
    const Op* prev = i > 0 ? &s.ops.back() : nullptr;
    if (prev && !prev->group && prev->kind != Kind::kSendRecv && r.chance(0.15)) {
      Op t = *prev;
      t.twin = true;
      t.parts[0].in_place = t.parts[0].mixed_place = false;
      s.ops.push_back(t);
    } else {
      s.ops.push_back(gen_op(r, nranks, g, op_max));
    }
    s.ops.back().index = first_op + static_cast<uint64_t>(i);
  }
  return s;
}

std::string describe(const Part& p) {
  if (p.coll == Collective::kSendRecv) {
    std::string s = p.grouped ? "sendrecv {" : "send/recv (no group) {";
    for (size_t i = 0; i < p.xfers.size(); ++i) {
      const Transfer& x = p.xfers[i];
      s += fmt::format("{}{}->{} {}x{}", i ? ", " : "", x.src, x.dst, x.count, dtype_name(x.send_dt));
      if (x.recv_dt != x.send_dt) s += fmt::format(" recv as {}x{}", x.recv_count, dtype_name(x.recv_dt));
    }
    return s + "}";
  }
  std::string s = fmt::format("{} {}", collective_name(p.coll), dtype_name(p.dt));
  if (p.reduces()) s += fmt::format(" {}", redop_name(p.op));
  s += fmt::format(" count {} ({} B)", p.count, p.count * dtype_size(p.dt));
  if (p.coll == Collective::kBroadcast || p.coll == Collective::kReduce) s += fmt::format(" root {}", p.root);
  s += p.mixed_place ? " in-place per rank" : p.in_place ? " in place" : " out of place";
  return s + fmt::format(" salt {} data {}", p.salt, scheme_name(p.scheme));
}

std::string describe(const Op& op) {
  if (!op.group || op.kind != Kind::kGroup)
    return describe(op.parts[0]) + (op.nested ? " (nested group)" : "") +
           (op.twin ? " (twin of the op before: may share its send buffer)" : "");
  std::string s = op.nested ? "group (nested) [" : "group [";
  for (size_t i = 0; i < op.parts.size(); ++i) s += (i ? "; " : "") + describe(op.parts[i]);
  return s + "]";
}

}  // namespace loom::stress
