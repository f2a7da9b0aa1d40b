// loom-stress: a randomized, seed-driven soak and differential tester.
//
//   build/bin/loomrun -n 4 -- build/bin/loom-stress --seed 7 --seconds 60
//
// Every rank derives the same random plan of operations from --seed
// (tools/stress/stress_plan.h): every collective, data type and reduction,
// counts at the sizes where transports and schedules change behaviour, in
// place and out of place, blocking and in async batches waited in random
// order, groups of collectives and transfers, split communicators. Each rank
// chooses its own buffers (heap, loom::mem_alloc, reused mem_alloc, misaligned)
// and checks every byte of every op against the closed-form data of
// perf-tests/verifiable.h: the output, the input of out-of-place ops
// (unchanged), and guard bytes on both sides of every buffer. The first
// wrong byte ends the run with the seed, the op and a command that replays it.
#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm.h"
#include "stress/stress_check.h"
#include "stress/stress_plan.h"

namespace loom::stress {
namespace {

using Clock = std::chrono::steady_clock;

// Exit codes.
constexpr int kExitWrong = 1;     // a wrong byte, or ranks that disagree
constexpr int kExitOpFailed = 2;  // an operation returned an error
constexpr int kExitUsage = 3;

struct Options {
  uint64_t seed = 1;
  uint64_t ops = 0;  // 0: unlimited (with --seconds), else 1000 when neither is given
  double seconds = 0;
  uint64_t from = 0;
  GenOptions gen;
  int verbose = 0;
  double progress_s = 5;
  double timeout_s = 0;
  // --self-test-corrupt N[:output|input|guard]: rank 0 damages the first op
  // from N on that has such a region, to prove the checker fails.
  int64_t corrupt_op = -1;
  std::string corrupt_kind = "output";
  std::string argv_flags;  // for the replay line
  int threads = 0;          // --threads N: N ranks as threads of this process (Comm::init_all), no loomrun
  // --fake-hosts K (ranks r / K share a host) or modK (ranks r % K): sets
  // LOOM_HOST_ID per rank, so one machine runs a multi-host job (shared
  // memory inside a fake host, TCP between them, hierarchical algorithms).
  std::string fake_hosts;
};

struct Stats {
  std::array<uint64_t, kNumKinds> ops_by_kind{};
  std::array<uint64_t, kNumCollectives> parts_by_coll{};
  uint64_t world_ops = 0, child_ops = 0, splits = 0, async_batches = 0, caller_waits_steps = 0;
  uint64_t overlapped = 0, destroyed_in_flight = 0;  // child batches in flight across a parent step / a destroy
  uint64_t bytes_checked = 0;
  uint64_t concurrent = 0;  // parent steps run on a second thread while the child's batch was waited for
  void add(const Stats& o) {
    for (int k = 0; k < kNumKinds; ++k) ops_by_kind[k] += o.ops_by_kind[k];
    for (int c = 0; c < kNumCollectives; ++c) parts_by_coll[c] += o.parts_by_coll[c];
    world_ops += o.world_ops, child_ops += o.child_ops, splits += o.splits, async_batches += o.async_batches;
    caller_waits_steps += o.caller_waits_steps, overlapped += o.overlapped;
    destroyed_in_flight += o.destroyed_in_flight, bytes_checked += o.bytes_checked, concurrent += o.concurrent;
  }
};

// One communicator the plan runs on: the world, or a split child.
struct Level {
  Comm* comm = nullptr;
  int rank = 0, n = 1;
  uint64_t seed = 0;
  GenOptions gen;
  std::string where;  // "" for the world, else "in split op #57 color 1 (rank 0/3): "
  // A child's ops replay from the world op that split it (--from).
  uint64_t split_op = 0;
};

struct Run {
  Options opt;
  Stats st;
  int world_rank = 0, world_n = 1;
  Clock::time_point start = Clock::now(), last_progress = Clock::now();
  std::string current;  // the op rank 0 is at, for the progress line
  uint64_t progress_ops = 0;
  bool corrupted = false;
};

thread_local Run* g_run = nullptr;  // each rank's (ranks are threads with --threads)

[[noreturn]] void fail(int code, const std::string& msg) {
  fprintf(stderr, "loom-stress: FAIL seed %llu rank %d/%d: %s\n", static_cast<unsigned long long>(g_run->opt.seed),
          g_run->world_rank, g_run->world_n, msg.c_str());
  fflush(stderr);
  fflush(stdout);
  std::_Exit(code);
}

std::string replay(uint64_t op_index) {
  const std::string launch = g_run->opt.threads > 0 ? fmt::format("build/bin/loom-stress --threads {}", g_run->world_n)
                                                     : fmt::format("build/bin/loomrun -n {} -- build/bin/loom-stress",
                                                                   g_run->world_n);
  return fmt::format("reproduce: (same environment) {} --seed {} --from {} --ops 1{}", launch, g_run->opt.seed,
                     op_index, g_run->opt.argv_flags);
}

// ---- buffers and expectations of one part on this rank ------------------------

struct P2pCall {
  bool is_send = false;
  size_t xfer = 0;
  void* buf = nullptr;
  size_t count = 0;
  DataType dt = DataType::kUint8;
  int peer = 0;
};

struct Prepared {
  std::vector<std::shared_ptr<Alloc>> allocs;
  std::vector<Region> regions;
  const void* send = nullptr;
  void* recv = nullptr;
  bool in_place = false;
  std::vector<P2pCall> calls;  // in this rank's issue order
  std::string bufs;            // "send heap+3, recv mem_alloc"
  std::shared_ptr<Alloc> input;  // an out-of-place collective's send buffer
  bool input_shared = false;     // ... also another op's (twin ops)
};

uint8_t poison_byte(Rng& local) {
  static const std::vector<uint8_t> kPoison = {0xa5, 0x5a, 0xff, 0x7e, 0xc3, 0x3c, 0x81, 0x99};
  return local.pick(kPoison);
}

Region region(const std::shared_ptr<Alloc>& a, size_t off, size_t bytes, Region::Type t, bool output,
              std::string what) {
  Region r;
  r.alloc = a;
  r.off = off;
  r.bytes = bytes;
  r.type = t;
  r.output = output;
  r.what = std::move(what);
  return r;
}

Region copied(const std::shared_ptr<Alloc>& a, size_t off, size_t bytes, bool output, std::string what, DataType dt,
              RedOp op, int src, int nranks, uint64_t index0) {
  Region r = region(a, off, bytes, Region::Type::kCopied, output, std::move(what));
  r.dt = dt;
  r.op = op;
  r.src = src;
  r.nranks = nranks;
  r.index0 = index0;
  return r;
}

Region reduced(const std::shared_ptr<Alloc>& a, size_t off, size_t bytes, std::string what, DataType dt, RedOp op,
               int nranks, uint64_t index0) {
  Region r = region(a, off, bytes, Region::Type::kReduced, true, std::move(what));
  r.dt = dt;
  r.op = op;
  r.nranks = nranks;
  r.index0 = index0;
  return r;
}

Region untouched(const std::shared_ptr<Alloc>& a, uint8_t fill, std::string what) {
  Region r = region(a, 0, a->len, Region::Type::kFill, false, std::move(what));
  r.fill = fill;
  return r;
}

// twin: the prepared op before this one when the plan made this op its twin.
Prepared prepare_collective(const Part& p, int me, int n, Rng& local, const Prepared* twin) {
  Prepared pr;
  const size_t es = dtype_size(p.dt), count = p.count, bytes = count * es;
  const size_t nb = static_cast<size_t>(n);
  const bool in_place = p.mixed_place ? local.chance(0.5) : p.in_place;
  pr.in_place = in_place;
  const RedOp fill_op = p.reduces() ? p.op : RedOp::kSum;
  const uint64_t salt = p.salt;
  const uint8_t poison = poison_byte(local);
  auto get = [&](size_t len, uint8_t fill) {
    auto a = pool().get(len, local, fill);
    pr.allocs.push_back(a);
    return a;
  };
  auto input = [&](size_t len_elems, uint64_t index0) {
    auto a = get(len_elems * es, poison);
    fill_input(a->data(), len_elems, p.dt, fill_op, p.scheme, me, n, index0);
    return a;
  };
  // An out-of-place op's input: the twin's send buffer (same data) or a new one.
  bool shared_input = false;
  auto send_input = [&](size_t len_elems, uint64_t index0) {
    if (twin && twin->input && twin->input->len == len_elems * es && local.chance(0.7)) {
      pr.allocs.push_back(twin->input);
      pr.input = twin->input;
      shared_input = true;
      return twin->input;
    }
    pr.input = input(len_elems, index0);
    return pr.input;
  };
  // Copied region of the input this rank gave (must be unchanged).
  auto own_input = [&](const std::shared_ptr<Alloc>& a, size_t off, size_t len_elems, uint64_t index0,
                       const std::string& what) {
    return copied(a, off, len_elems * es, false, what, p.dt, fill_op, me, n, index0);
  };
  // With count 0 a rank may pass null buffers.
  const bool null_if_empty = count == 0 && local.chance(0.3);
  if (null_if_empty) {
    pr.bufs = "null buffers";
    return pr;
  }
  switch (p.coll) {
    case Collective::kAllReduce:
      if (in_place) {
        auto a = input(count, salt);
        pr.send = pr.recv = a->data();
        pr.regions.push_back(reduced(a, 0, bytes, "output", p.dt, p.op, n, salt));
        pr.bufs = "buf " + a->name();
      } else {
        auto s = send_input(count, salt), r = get(bytes, poison);
        pr.send = s->data();
        pr.recv = r->data();
        pr.regions.push_back(reduced(r, 0, bytes, "output", p.dt, p.op, n, salt));
        pr.regions.push_back(own_input(s, 0, count, salt, "input (must be unchanged)"));
        pr.bufs = "send " + s->name() + ", recv " + r->name();
      }
      break;
    case Collective::kReduceScatter:
      if (in_place) {
        auto a = input(nb * count, salt);
        pr.send = a->data();
        pr.recv = a->data() + static_cast<size_t>(me) * bytes;
        for (int b = 0; b < n; ++b) {
          const size_t off = static_cast<size_t>(b) * bytes;
          if (b == me) {
            pr.regions.push_back(reduced(a, off, bytes, "output (own block, in place)", p.dt, p.op, n, salt + off / es));
          } else {
            pr.regions.push_back(
                own_input(a, off, count, salt + off / es, fmt::format("input block {} (must be unchanged)", b)));
          }
        }
        pr.bufs = "buf " + a->name();
      } else {
        auto s = send_input(nb * count, salt), r = get(bytes, poison);
        pr.send = s->data();
        pr.recv = r->data();
        pr.regions.push_back(reduced(r, 0, bytes, "output", p.dt, p.op, n, salt + static_cast<size_t>(me) * count));
        pr.regions.push_back(own_input(s, 0, nb * count, salt, "input (must be unchanged)"));
        pr.bufs = "send " + s->name() + ", recv " + r->name();
      }
      break;
    case Collective::kAllGather: {
      std::shared_ptr<Alloc> out;
      if (in_place) {
        out = get(nb * bytes, poison);
        fill_input(out->data() + static_cast<size_t>(me) * bytes, count, p.dt, fill_op, p.scheme, me, n, salt);
        pr.send = out->data() + static_cast<size_t>(me) * bytes;
        pr.bufs = "buf " + out->name();
      } else {
        auto s = send_input(count, salt);
        out = get(nb * bytes, poison);
        pr.send = s->data();
        pr.regions.push_back(own_input(s, 0, count, salt, "input (must be unchanged)"));
        pr.bufs = "send " + s->name() + ", recv " + out->name();
      }
      pr.recv = out->data();
      for (int b = 0; b < n; ++b)
        pr.regions.push_back(copied(out, static_cast<size_t>(b) * bytes, bytes, true,
                                    fmt::format("output block {} (from rank {})", b, b), p.dt, fill_op, b, n, salt));
      break;
    }
    case Collective::kBroadcast:
      if (in_place) {
        auto a = get(bytes, poison);
        if (me == p.root) fill_input(a->data(), count, p.dt, fill_op, p.scheme, me, n, salt);
        pr.send = pr.recv = a->data();
        pr.regions.push_back(copied(a, 0, bytes, true, "output", p.dt, fill_op, p.root, n, salt));
        pr.bufs = "buf " + a->name();
      } else {
        auto r = get(bytes, poison);
        pr.recv = r->data();
        pr.regions.push_back(copied(r, 0, bytes, true, "output", p.dt, fill_op, p.root, n, salt));
        if (me == p.root) {
          auto s = send_input(count, salt);
          pr.send = s->data();
          pr.regions.push_back(own_input(s, 0, count, salt, "input (must be unchanged)"));
          pr.bufs = "send " + s->name() + ", recv " + r->name();
        } else if (local.chance(0.5)) {
          // Not significant off the root: null, or a buffer nobody may write.
          pr.bufs = "send null, recv " + r->name();
        } else {
          const uint8_t other = poison_byte(local);
          auto s = get(bytes, other);
          pr.send = s->data();
          pr.regions.push_back(untouched(s, other, "send buffer of a non-root (must be untouched)"));
          pr.bufs = "send " + s->name() + ", recv " + r->name();
        }
      }
      break;
    case Collective::kReduce:
      if (in_place) {
        auto a = input(count, salt);
        pr.send = pr.recv = a->data();
        if (me == p.root) {
          pr.regions.push_back(reduced(a, 0, bytes, "output", p.dt, p.op, n, salt));
        } else {
          pr.regions.push_back(own_input(a, 0, count, salt, "in-place buffer of a non-root (must be unchanged)"));
        }
        pr.bufs = "buf " + a->name();
      } else {
        auto s = send_input(count, salt);
        pr.send = s->data();
        pr.regions.push_back(own_input(s, 0, count, salt, "input (must be unchanged)"));
        pr.bufs = "send " + s->name();
        if (me == p.root) {
          auto r = get(bytes, poison);
          pr.recv = r->data();
          pr.regions.push_back(reduced(r, 0, bytes, "output", p.dt, p.op, n, salt));
          pr.bufs += ", recv " + r->name();
        } else if (local.chance(0.5)) {
          pr.bufs += ", recv null";
        } else {
          auto r = get(bytes, poison);
          pr.recv = r->data();
          pr.regions.push_back(untouched(r, poison, "recv buffer of a non-root (must be untouched)"));
          pr.bufs += ", recv " + r->name();
        }
      }
      break;
    case Collective::kAllToAll: {
      std::shared_ptr<Alloc> out;
      if (in_place) {
        out = input(nb * count, salt);
        pr.send = out->data();
        pr.bufs = "buf " + out->name();
      } else {
        auto s = send_input(nb * count, salt);
        out = get(nb * bytes, poison);
        pr.send = s->data();
        pr.regions.push_back(own_input(s, 0, nb * count, salt, "input (must be unchanged)"));
        pr.bufs = "send " + s->name() + ", recv " + out->name();
      }
      pr.recv = out->data();
      // Block b of the output is block `me` of rank b's input.
      for (int b = 0; b < n; ++b)
        pr.regions.push_back(copied(out, static_cast<size_t>(b) * bytes, bytes, true,
                                    fmt::format("output block {} (from rank {})", b, b), p.dt, fill_op, b, n,
                                    salt + static_cast<size_t>(me) * count));
      break;
    }
    case Collective::kSendRecv: break;
  }
  if (shared_input) pr.bufs += " (send buffer shared with the op before)";
  pr.input_shared = shared_input;
  for (Region& r : pr.regions) r.scheme = p.scheme;
  return pr;
}

Prepared prepare_p2p(const Part& p, int me, int n, Rng& local) {
  Prepared pr;
  const uint8_t poison = poison_byte(local);
  // A send buffer that is also a receive buffer of the same group (Loom
  // stages such sends: the peer gets the data from before the group).
  const bool alias = p.grouped && local.chance(0.15);
  std::vector<std::shared_ptr<Alloc>> send_alloc(p.xfers.size());
  std::vector<bool> aliased(p.xfers.size(), false);
  for (size_t t = 0; t < p.xfers.size(); ++t) {
    const Transfer& x = p.xfers[t];
    if (x.src != me) continue;
    auto a = pool().get(x.count * dtype_size(x.send_dt), local, poison);
    fill_input(a->data(), x.count, x.send_dt, RedOp::kSum, p.scheme, me, n, x.salt);
    send_alloc[t] = a;
    pr.allocs.push_back(a);
    pr.calls.push_back({true, t, a->data(), x.count, x.send_dt, x.dst});
  }
  for (size_t t = 0; t < p.xfers.size(); ++t) {
    const Transfer& x = p.xfers[t];
    if (x.dst != me) continue;
    const size_t bytes = x.count * dtype_size(x.send_dt);
    std::shared_ptr<Alloc> a;
    if (alias) {
      for (size_t s = 0; s < p.xfers.size() && !a; ++s)
        if (send_alloc[s] && !aliased[s] && send_alloc[s]->len == bytes) {
          a = send_alloc[s];
          aliased[s] = true;
        }
    }
    const bool shared = a != nullptr;
    if (!a) {
      a = pool().get(bytes, local, poison);
      pr.allocs.push_back(a);
    }
    pr.regions.push_back(copied(a, 0, bytes, true,
                                fmt::format("received message {} from rank {}{}", t, x.src,
                                            shared ? " (into a buffer this rank also sends from)" : ""),
                                x.send_dt, RedOp::kSum, x.src, n, x.salt));
    pr.calls.push_back({false, t, a->data(), x.recv_count, x.recv_dt, x.src});
  }
  for (size_t t = 0; t < p.xfers.size(); ++t)
    if (send_alloc[t] && !aliased[t])
      pr.regions.push_back(copied(send_alloc[t], 0, send_alloc[t]->len, false,
                                  fmt::format("send buffer of message {} (must be unchanged)", t), p.xfers[t].send_dt,
                                  RedOp::kSum, me, n, p.xfers[t].salt));
  // Issue in a random order that keeps the order of the messages between
  // any two ranks (they match in order).
  std::vector<P2pCall>& c = pr.calls;
  for (size_t i = c.size(); i > 1; --i) std::swap(c[i - 1], c[local.below(i)]);
  std::map<std::pair<int, int>, std::vector<size_t>> by_channel;  // (is_send, peer) -> positions
  for (size_t i = 0; i < c.size(); ++i) by_channel[{c[i].is_send ? 1 : 0, c[i].peer}].push_back(i);
  for (auto& [key, pos] : by_channel) {
    std::vector<P2pCall> calls;
    for (size_t i : pos) calls.push_back(c[i]);
    std::sort(calls.begin(), calls.end(), [](const P2pCall& a, const P2pCall& b) { return a.xfer < b.xfer; });
    for (size_t k = 0; k < pos.size(); ++k) c[pos[k]] = calls[k];
  }
  pr.bufs = fmt::format("{} send(s), {} recv(s){}", std::count_if(c.begin(), c.end(), [](auto& x) { return x.is_send; }),
                        std::count_if(c.begin(), c.end(), [](auto& x) { return !x.is_send; }),
                        alias ? ", aliased" : "");
  for (const auto& a : pr.allocs) pr.bufs += " " + a->name();
  for (Region& r : pr.regions) r.scheme = p.scheme;
  return pr;
}

// ---- issuing, waiting, checking -----------------------------------------------

struct Issued {
  const Op* op = nullptr;
  int scribble = 0;  // overwrite its inputs (1), or all its buffers (2), as soon as its wait returns
  bool scattered = false;  // this rank's sends/recvs scattered among the group's collectives
  uint64_t outputs_checked_early = 0;
  std::vector<Prepared> parts;
  // One Work, or (a group this rank issued ungrouped) one per collective
  // and one for the group of its transfers.
  std::vector<Work> works;
  bool ungrouped = false;
  bool has_work() const { return !works.empty(); }
  bool done() const {
    for (const Work& w : works)
      if (!w.test()) return false;
    return true;
  }
  // Plain waits, in order; the first failure.
  Status wait() const {
    Status first;
    for (const Work& w : works) {
      Status st = w.wait();
      if (first.is_ok() && !st.is_ok()) first = st;
    }
    return first;
  }
  std::string label;  // "op #57" or "op #57 > child op #3"
};

std::string status_str(const Status& s) { return s.to_string(); }

Result<Work> issue_part(Comm& c, const Part& p, Prepared& pr) {
  switch (p.coll) {
    case Collective::kAllReduce: return c.allreduce(pr.send, pr.recv, p.count, p.dt, p.op);
    case Collective::kReduceScatter: return c.reduce_scatter(pr.send, pr.recv, p.count, p.dt, p.op);
    case Collective::kAllGather: return c.all_gather(pr.send, pr.recv, p.count, p.dt);
    case Collective::kBroadcast: return c.broadcast(pr.send, pr.recv, p.count, p.dt, p.root);
    case Collective::kReduce: return c.reduce(pr.send, pr.recv, p.count, p.dt, p.op, p.root);
    case Collective::kAllToAll: return c.all_to_all(pr.send, pr.recv, p.count, p.dt);
    case Collective::kSendRecv: break;
  }
  Result<Work> last = Work();
  for (const P2pCall& k : pr.calls) {
    last = k.is_send ? c.send(k.buf, k.count, k.dt, k.peer) : c.recv(k.buf, k.count, k.dt, k.peer);
    if (!last.is_ok()) return last;
  }
  return last;
}

std::string op_context(const Level& lv, const Issued& is, size_t pos, size_t batch, bool async) {
  std::string s = fmt::format("{}{} [{}/{}{}]: {}", lv.where, is.label, pos + 1, batch, async ? ", async" : "",
                              describe(*is.op));
  for (size_t i = 0; i < is.parts.size(); ++i)
    s += fmt::format("\n    buffers{}: {}", is.parts.size() > 1 ? fmt::format(" of part {}", i) : "", is.parts[i].bufs);
  if (is.scattered) s += "\n    this rank called its sends/recvs scattered among the collectives";
  if (is.ungrouped) s += "\n    this rank issued the group's calls as plain ops (a collective group: its transfers grouped after them)";
  return s;
}

void issue(Level& lv, Issued& is, Rng& local, size_t pos, size_t batch, bool async) {
  Comm& c = *lv.comm;
  const Op& op = *is.op;
  auto check = [&](const Result<Work>& w, const char* what) {
    if (!w.is_ok())
      fail(kExitOpFailed, fmt::format("{} failed: {}\n  op: {}", what, status_str(w.status()),
                                      op_context(lv, is, pos, batch, async)));
  };
  if (op.group) {
    bool any = false;
    for (const Prepared& pr : is.parts) any = any || op.kind == Kind::kGroup || !pr.calls.empty();
    // A rank with nothing in a group of transfers may leave the group out.
    if (!any && local.chance(0.5)) return;
    // What this rank calls, in order: each collective part whole, each
    // send/recv on its own. As planned, a part's transfers come where the
    // part is; a rank may instead scatter them among the collectives (NCCL
    // queues a group's transfers apart from its collectives, so only their
    // order among themselves matters).
    struct Call {
      size_t part;
      int call;  // -1: the whole (collective) part
    };
    std::vector<Call> calls, colls, p2p;
    for (size_t i = 0; i < is.parts.size(); ++i) {
      if (op.parts[i].coll != Collective::kSendRecv) {
        calls.push_back({i, -1});
        colls.push_back({i, -1});
      }
      for (size_t j = 0; j < is.parts[i].calls.size(); ++j) {
        calls.push_back({i, static_cast<int>(j)});
        p2p.push_back({i, static_cast<int>(j)});
      }
    }
    if (!colls.empty() && !p2p.empty() && local.chance(0.4)) {
      std::vector<uint64_t> slot(p2p.size());
      for (auto& x : slot) x = local.below(colls.size() + 1);
      std::sort(slot.begin(), slot.end());
      calls.clear();
      size_t k = 0;
      for (size_t ci = 0; ci <= colls.size(); ++ci) {
        for (; k < p2p.size() && slot[k] == ci; ++k) calls.push_back(p2p[k]);
        if (ci < colls.size()) calls.push_back(colls[ci]);
      }
      is.scattered = true;
    }
    // A rank that only sends, or only receives, in a group of transfers may
    // issue them as plain ops instead, in the plan's order of transfers (its
    // peers group theirs: messages between two ranks match in order however
    // each end groups them). Ranks that both send and receive keep their
    // group: plain sends and receives in different orders could deadlock.
    if (op.kind == Kind::kSendRecv && !op.nested && colls.empty() && !p2p.empty() && local.chance(0.25)) {
      const std::vector<P2pCall>& pc = is.parts[0].calls;
      const bool pure = std::all_of(pc.begin(), pc.end(), [&](const P2pCall& x) { return x.is_send == pc[0].is_send; });
      if (pure) {
        std::vector<P2pCall> in_order = pc;
        std::sort(in_order.begin(), in_order.end(), [](const P2pCall& a, const P2pCall& b) { return a.xfer < b.xfer; });
        for (const P2pCall& x : in_order) {
          Result<Work> w = x.is_send ? c.send(x.buf, x.count, x.dt, x.peer) : c.recv(x.buf, x.count, x.dt, x.peer);
          check(w, "issue (a group's transfer, ungrouped on this rank)");
          is.works.push_back(*w);
        }
        is.ungrouped = true;
        is.scattered = false;
        return;
      }
    }
    // A rank may also issue a group of collectives as plain ops, one after
    // another, and only its transfers in a group of their own (after them:
    // where Loom runs a group's transfers): the same sequence of
    // collectives, grouped differently on each rank.
    if (op.kind == Kind::kGroup && !op.nested && local.chance(0.15)) {
      is.ungrouped = true;
      is.scattered = false;
      for (const Call& k : colls) {
        Result<Work> w = issue_part(c, op.parts[k.part], is.parts[k.part]);
        check(w, "issue (a group's collective, ungrouped on this rank)");
        is.works.push_back(*w);
      }
      if (!p2p.empty()) {
        c.group_start();
        for (const Call& k : p2p) {
          const P2pCall& x = is.parts[k.part].calls[static_cast<size_t>(k.call)];
          check(x.is_send ? c.send(x.buf, x.count, x.dt, x.peer) : c.recv(x.buf, x.count, x.dt, x.peer),
                "issue inside a group");
        }
        Result<Work> w = c.group_end();
        check(w, "group_end");
        is.works.push_back(*w);
      }
      return;
    }
    c.group_start();
    if (op.nested) c.group_start();
    const size_t inner_end = op.nested ? local.below(calls.size() + 1) : size_t{0};
    for (size_t i = 0; i <= calls.size(); ++i) {
      if (op.nested && i == inner_end) {
        Result<Work> w = c.group_end();
        check(w, "inner group_end");
        if (w->valid()) fail(kExitWrong, "an inner group_end returned a valid Work: " + op_context(lv, is, pos, batch, async));
      }
      if (i < calls.size()) {
        const Call& k = calls[i];
        Result<Work> w = Work();
        if (k.call < 0) {
          w = issue_part(c, op.parts[k.part], is.parts[k.part]);
        } else {
          const P2pCall& x = is.parts[k.part].calls[static_cast<size_t>(k.call)];
          w = x.is_send ? c.send(x.buf, x.count, x.dt, x.peer) : c.recv(x.buf, x.count, x.dt, x.peer);
        }
        check(w, "issue inside a group");
        if (w->valid())
          fail(kExitWrong, "an op issued inside a group returned a valid Work: " + op_context(lv, is, pos, batch, async));
      }
    }
    Result<Work> w = c.group_end();
    check(w, "group_end");
    is.works.push_back(*w);
    return;
  }
  const Part& p = op.parts[0];
  if (p.coll == Collective::kSendRecv && is.parts[0].calls.empty()) return;  // not in this plain send/recv
  Result<Work> w = issue_part(c, p, is.parts[0]);
  check(w, "issue");
  is.works.push_back(*w);
}

// Damages the op's buffers once on rank 0 (--self-test-corrupt).
bool corrupt(Run& run, Issued& is) {
  const std::string& kind = run.opt.corrupt_kind;
  for (Prepared& pr : is.parts) {
    for (Region& r : pr.regions) {
      if (r.bytes == 0) continue;
      if (kind == "output" && r.output) {
        r.alloc->data()[r.off + r.bytes / 2] ^= std::byte{0x10};
        return true;
      }
      if (kind == "input" && !r.output) {
        r.alloc->data()[r.off + r.bytes / 2] ^= std::byte{0x10};
        return true;
      }
      if (kind == "guard" && r.output) {
        r.alloc->data()[r.alloc->len + 3] ^= std::byte{0x10};
        return true;
      }
    }
  }
  return false;
}

void check_op(Run& run, Level& lv, Issued& is, size_t pos, size_t batch, bool async, const std::string& waits) {
  if (run.opt.corrupt_op >= 0 && !run.corrupted && run.world_rank == 0 && lv.where.empty() &&
      is.op->index >= static_cast<uint64_t>(run.opt.corrupt_op) && corrupt(run, is)) {
    run.corrupted = true;
    fprintf(stderr, "loom-stress: self-test: corrupted the %s of op #%llu on rank 0\n", run.opt.corrupt_kind.c_str(),
            static_cast<unsigned long long>(is.op->index));
  }
  for (size_t i = 0; i < is.parts.size(); ++i) {
    const Prepared& pr = is.parts[i];
    const std::string part = is.parts.size() > 1 ? fmt::format(" of part {}", i) : "";
    for (const Region& r : pr.regions) {
      std::string bad = check_region(r);
      if (!bad.empty())
        fail(kExitWrong, fmt::format("wrong data in the {}{} ({}): {}\n  op: {}\n  {}\n  {}", r.what, part,
                                     r.alloc->name(), bad, op_context(lv, is, pos, batch, async), waits,
                                     replay(lv.where.empty() ? is.op->index : lv.split_op)));
      if (r.output && r.type != Region::Type::kFill) run.st.bytes_checked += r.bytes;
    }
    for (const auto& a : pr.allocs) {
      std::string bad = check_guards(*a);
      if (!bad.empty())
        fail(kExitWrong, fmt::format("{} ({}, {} bytes){}\n  op: {}\n  {}\n  {}", bad, a->name(), a->len, part,
                                     op_context(lv, is, pos, batch, async), waits,
                                     replay(lv.where.empty() ? is.op->index : lv.split_op)));
    }
  }
}

void progress(Run& run) {
  if (run.world_rank != 0 || run.opt.progress_s <= 0) return;
  const auto now = Clock::now();
  const double since = std::chrono::duration<double>(now - run.last_progress).count();
  if (since < run.opt.progress_s) return;
  const uint64_t ops = run.st.world_ops + run.st.child_ops;
  printf("loom-stress: %llu ops, %.1f ops/s, at %s\n", static_cast<unsigned long long>(ops),
         static_cast<double>(ops - run.progress_ops) / since, run.current.c_str());
  fflush(stdout);
  run.last_progress = now;
  run.progress_ops = ops;
}

void run_steps(Run& run, Level& lv, uint64_t first_step, uint64_t nsteps, bool world);

// Once an op's wait has returned its buffers are the caller's again: they
// may be rewritten at once. Checks the op's buffers at that moment, then
// overwrites its send buffers (level 1) or every buffer of it (level 2,
// outputs too: a peer forwards from what this rank received); a peer still
// reading one (a single-copy read or a mapping not yet done) would now get
// the new bytes, and the final check expects exactly those (no late writes
// either). Buffers another op of the batch also reads stay.
std::string scribble(Issued& is) {
  // The regions this level rewrites.
  auto rewritten = [&is](const Prepared& pr, const Region& r) {
    if (r.type == Region::Type::kFill || r.bytes == 0) return false;
    if (pr.input_shared && r.alloc == pr.input) return false;
    bool holds_output = false;
    for (const Prepared& q : is.parts)
      for (const Region& o : q.regions) holds_output = holds_output || (o.output && o.alloc == r.alloc);
    return !holds_output || is.scribble >= 2;
  };
  for (Prepared& pr : is.parts) {
    for (Region& r : pr.regions) {
      if (!rewritten(pr, r)) continue;
      std::string bad = check_region(r);
      if (!bad.empty()) return fmt::format("{} ({}), checked as its wait returned: {}", r.what, r.alloc->name(), bad);
      bad = check_guards(*r.alloc);
      if (!bad.empty()) return fmt::format("{} ({}), checked as its wait returned", bad, r.alloc->name());
    }
  }
  for (Prepared& pr : is.parts) {
    for (Region& r : pr.regions) {
      if (!rewritten(pr, r)) continue;
      if (r.output) is.outputs_checked_early += r.bytes;
      std::memset(r.alloc->data() + r.off, 0xee, r.bytes);
      r.type = Region::Type::kFill;
      r.fill = 0xee;
      r.what += " (overwritten by this rank once its wait returned)";
    }
  }
  return "";
}

// A batch issued and not yet waited for (start_batch, finish_batch): a
// split child's batch stays in flight while the parent runs a step.
struct Pending {
  Step step;
  Rng local{0};
  bool caller_waits = false;
  std::vector<Issued> batch;
  // Eager: a second thread waits for each op as soon as it is issued,
  // while this one issues the next (Work::wait from another thread running
  // queued ops while the issuing thread enqueues).
  struct Eager {
    std::mutex mu;
    std::condition_variable cv;
    size_t issued = 0;
    bool stop = false;
    std::vector<Status> result;
    std::thread thread;
  };
  std::unique_ptr<Eager> eager;
  ~Pending() {
    if (eager && eager->thread.joinable()) {
      {
        std::lock_guard<std::mutex> lk(eager->mu);
        eager->stop = true;
      }
      eager->cv.notify_all();
      eager->thread.join();
    }
  }
};

// Prepares and issues the step's ops (a blocking step also waits for each).
// no_caller_waits: this rank must not promise to wait at once (another
// communicator's step runs before these ops are waited for).
std::unique_ptr<Pending> start_batch(Run& run, Level& lv, Step step, uint64_t step_index, bool no_caller_waits) {
  auto pend = std::make_unique<Pending>();
  pend->step = std::move(step);
  const Step& s = pend->step;
  pend->local = Rng(local_seed(lv.seed, step_index, lv.rank));
  Rng& local = pend->local;
  Comm& c = *lv.comm;
  const bool caller_waits = local.chance(0.3) && !no_caller_waits;
  pend->caller_waits = caller_waits;
  c.set_caller_waits(caller_waits);
  run.st.caller_waits_steps += caller_waits;
  run.st.async_batches += s.async;
  std::vector<Issued>& batch = pend->batch;
  batch.resize(s.ops.size());
  const size_t k = batch.size();
  if (s.async && !caller_waits && k > 1 && local.chance(0.15)) {
    pend->eager = std::make_unique<Pending::Eager>();
    Pending::Eager* e = pend->eager.get();
    e->result.assign(k, Status::ok());
    e->thread = std::thread([e, &batch, k] {
      for (size_t i = 0; i < k; ++i) {
        {
          std::unique_lock<std::mutex> lk(e->mu);
          e->cv.wait(lk, [&] { return e->issued > i || e->stop; });
          if (e->issued <= i) return;
        }
        e->result[i] = batch[i].wait();
      }
    });
  }
  for (size_t i = 0; i < k; ++i) {
    Issued& is = batch[i];
    is.op = &s.ops[i];
    is.label = fmt::format("op #{}", is.op->index);
    const Prepared* twin = is.op->twin ? &batch[i - 1].parts[0] : nullptr;
    for (const Part& p : is.op->parts)
      is.parts.push_back(p.coll == Collective::kSendRecv ? prepare_p2p(p, lv.rank, lv.n, local)
                                                         : prepare_collective(p, lv.rank, lv.n, local, twin));
    if (twin && is.parts[0].input_shared) batch[i - 1].parts[0].input_shared = true;
    is.scribble = static_cast<int>(local.below(3));
    if (pend->eager) is.scribble = 0;  // the op before may be a twin still in use
    if (run.world_rank == 0) run.current = lv.where + is.label + ": " + describe(*is.op);
    if (run.opt.verbose >= 2 || (run.opt.verbose == 1 && run.world_rank == 0)) {
      printf("%s%s\n", caller_waits ? "(caller waits) " : "", op_context(lv, is, i, k, s.async).c_str());
      fflush(stdout);
    }
    issue(lv, is, local, i, k, s.async);
    if (pend->eager) {
      {
        std::lock_guard<std::mutex> lk(pend->eager->mu);
        pend->eager->issued = i + 1;
      }
      pend->eager->cv.notify_all();
    }
    if (!s.async && is.has_work()) {
      Status st = is.wait();
      if (!st.is_ok())
        fail(kExitOpFailed, fmt::format("operation failed: {}\n  op: {}", status_str(st), op_context(lv, is, i, k, false)));
    }
    if (!s.async && is.scribble) {
      const std::string bad = scribble(is);
      if (!bad.empty())
        fail(kExitWrong, fmt::format("wrong data in the {}\n  op: {}\n  {}", bad, op_context(lv, is, i, k, false),
                                     replay(lv.where.empty() ? is.op->index : lv.split_op)));
    }
  }
  return pend;
}

// Waits for the batch's ops (an async batch in this rank's chosen order and
// manner) and checks every one.
void finish_batch(Run& run, Level& lv, Pending& pend, const std::string& before_wait) {
  const Step& s = pend.step;
  Rng& local = pend.local;
  const bool caller_waits = pend.caller_waits;
  std::vector<Issued>& batch = pend.batch;
  const size_t k = batch.size();
  std::string waits = before_wait + (caller_waits ? "caller waits; " : "");
  if (s.async) {
    std::vector<size_t> order(k);
    std::iota(order.begin(), order.end(), 0);
    const uint64_t how = local.below(20);
    if (how < 3) {
      std::reverse(order.begin(), order.end());
    } else if (how < 10) {
      for (size_t i = k; i > 1; --i) std::swap(order[i - 1], order[local.below(i)]);
    }
    // How this rank waits: plainly; on two threads (a helper waits every
    // other op of the order); with short timed waits; or by polling test()
    // first. A caller that waits has promised plain waits (nothing else
    // runs its queued ops).
    enum class Style { kPlain, kHelper, kTimed, kPoll, kEager } style = Style::kPlain;
    if (!caller_waits) {
      const uint64_t w = local.below(10);
      style = w < 5 ? Style::kPlain : w < 7 ? Style::kHelper : w < 9 ? Style::kTimed : Style::kPoll;
    }
    if (style == Style::kPoll) {
      for (size_t i : order)
        while (!batch[i].done()) sched_yield();
    }
    static constexpr const char* kStyle[] = {"", "helper thread waits every other op, ", "timed waits, ",
                                             "polled with test(), "};
    waits += kStyle[static_cast<int>(style)];
    waits += "waited in order";
    for (size_t i : order) waits += fmt::format(" {}", i + 1);
    std::vector<Status> result(k, Status::ok());
    std::vector<std::string> scribbled(k);
    if (pend.eager) {
      pend.eager->thread.join();
      result = pend.eager->result;
      style = Style::kEager;
      waits = before_wait + "a second thread waited for each op as soon as it was issued";
    }
    auto wait_one = [&](size_t i) {
      if (!batch[i].has_work()) return;
      if (style == Style::kTimed) {
        const auto slice = std::chrono::milliseconds(1 + (i % 4));
        for (const Work& w : batch[i].works) {
          Status st = w.wait(slice);
          while (st.code() == StatusCode::kTimeout && !w.test()) st = w.wait(slice);
          if (result[i].is_ok()) result[i] = w.test() ? w.status() : st;
        }
      } else {
        result[i] = batch[i].wait();
      }
      if (result[i].is_ok() && batch[i].scribble) scribbled[i] = scribble(batch[i]);
    };
    if (style == Style::kEager) {
      // done: the eager thread waited for them all
    } else if (style == Style::kHelper) {
      std::thread helper([&] {
        for (size_t j = 1; j < k; j += 2) wait_one(order[j]);
      });
      for (size_t j = 0; j < k; j += 2) wait_one(order[j]);
      helper.join();
    } else {
      for (size_t i : order) wait_one(i);
    }
    // Report in issue order: a failed op fails the later ones too
    // ("communicator failed earlier"), whichever was waited for first.
    for (size_t i = 0; i < k; ++i) {
      if (!result[i].is_ok())
        fail(kExitOpFailed, fmt::format("operation failed: {}\n  op: {}\n  {}", status_str(result[i]),
                                        op_context(lv, batch[i], i, k, true), waits));
      if (!scribbled[i].empty())
        fail(kExitWrong, fmt::format("wrong data in the {}\n  op: {}\n  {}\n  {}", scribbled[i],
                                     op_context(lv, batch[i], i, k, true), waits,
                                     replay(lv.where.empty() ? batch[i].op->index : lv.split_op)));
    }
  } else {
    waits += "blocking";
  }
  for (size_t i = 0; i < k; ++i) {
    check_op(run, lv, batch[i], i, k, s.async, waits);
    run.st.bytes_checked += batch[i].outputs_checked_early;
    run.st.ops_by_kind[static_cast<int>(batch[i].op->kind)]++;
    for (const Part& p : batch[i].op->parts) run.st.parts_by_coll[static_cast<int>(p.coll)]++;
    (lv.where.empty() ? run.st.world_ops : run.st.child_ops)++;
  }
  progress(run);
}

void run_batch(Run& run, Level& lv, const Step& s, uint64_t step_index) {
  std::unique_ptr<Pending> pend = start_batch(run, lv, s, step_index, false);
  finish_batch(run, lv, *pend, "");
}

// Step `index` of a level's plan (the op numbers of the steps before it
// are counted by generating them).
Step step_at(const Level& lv, uint64_t index) {
  uint64_t op_index = 0;
  for (uint64_t i = 0; i < index; ++i) op_index += ops_in(make_step(lv.seed, i, lv.n, lv.gen, op_index));
  return make_step(lv.seed, index, lv.n, lv.gen, op_index);
}

void run_split(Run& run, Level& lv, const Step& s) {
  Comm& c = *lv.comm;
  const int color = s.colors[lv.rank], key = s.keys[lv.rank];
  const std::string what = fmt::format("{}op #{}: split (color {}, key {})", lv.where, s.op_index, color, key);
  if (run.opt.verbose >= 2 || (run.opt.verbose == 1 && run.world_rank == 0)) {
    printf("%s\n", what.c_str());
    fflush(stdout);
  }
  Result<std::unique_ptr<Comm>> child = c.split(color, key);
  if (!child.is_ok()) fail(kExitOpFailed, fmt::format("{} failed: {}", what, status_str(child.status())));
  ++run.st.splits;
  // Expected membership: ranks of my color ordered by (key, old rank).
  std::vector<std::pair<int, int>> members;
  for (int r = 0; r < lv.n; ++r)
    if (color >= 0 && s.colors[r] == color) members.push_back({s.keys[r], r});
  std::sort(members.begin(), members.end());
  // With s.interleave, a step on the parent follows each child step (every
  // parent rank runs it, in a child or not): two communicators in use by
  // turns, sharing this rank's buffers.
  Level parent = lv;
  parent.seed = mix(s.child_seed, 0x706172656e74ull);
  parent.gen.split = false;
  parent.split_op = lv.where.empty() ? s.op_index : lv.split_op;
  parent.where = fmt::format("{}interleaved with split op #{} on the parent: ", lv.where, s.op_index);
  Level sub;
  if (color < 0) {
    if (*child) fail(kExitWrong, what + ": a rank with a negative color got a communicator");
  } else {
    if (!*child) fail(kExitWrong, what + ": no communicator returned");
    const int want_rank =
        static_cast<int>(std::find(members.begin(), members.end(), std::make_pair(key, lv.rank)) - members.begin());
    if ((*child)->size() != static_cast<int>(members.size()) || (*child)->rank() != want_rank)
      fail(kExitWrong, fmt::format("{}: child rank {}/{}, want {}/{}", what, (*child)->rank(), (*child)->size(),
                                   want_rank, members.size()));
    sub.comm = child->get();
    sub.rank = want_rank;
    sub.n = static_cast<int>(members.size());
    sub.seed = mix(s.child_seed, static_cast<uint64_t>(color));
    sub.gen = lv.gen;
    sub.gen.depth = lv.gen.depth + 1;
    sub.split_op = parent.split_op;
    sub.where = fmt::format("{}in split op #{} color {} (rank {}/{}): ", lv.where, s.op_index, color, sub.rank, sub.n);
  }
  // With s.overlap, the child's batch is still in flight during the
  // parent's step (each communicator has its engine), and after the last
  // one a rank may destroy the child before it waits (destroy waits for
  // queued ops; their Work handles must still tell how they ended).
  Rng local(mix(local_seed(lv.seed, s.op_index, lv.rank), 0x73706c6974ull));
  bool destroyed = false;
  auto destroy = [&] {
    Status st = (*child)->destroy();
    if (!st.is_ok()) fail(kExitOpFailed, fmt::format("{}: destroying the child failed: {}", what, status_str(st)));
    destroyed = true;
  };
  for (int j = 0; j < s.child_steps; ++j) {
    const uint64_t step = static_cast<uint64_t>(j);
    std::unique_ptr<Pending> pend;
    std::string before_wait;
    if (sub.comm) {
      Step cs = step_at(sub, step);
      if (s.overlap && cs.type == Step::Type::kBatch) {
        pend = start_batch(run, sub, std::move(cs), step, true);
        run.st.overlapped += s.interleave && pend->step.async;
        before_wait = s.interleave ? "the parent ran a step before these were waited for; " : "";
        if (j == s.child_steps - 1 && local.chance(0.3)) {
          destroy();
          ++run.st.destroyed_in_flight;
          before_wait += "the child was destroyed before they were waited for; ";
        }
      } else {
        run_steps(run, sub, step, 1, false);
      }
    }
    if (s.interleave && s.concurrent && pend) {
      // The parent's step on a second thread while this one waits for and
      // checks the child's batch: two threads each driving a communicator
      // of the same ranks (process-wide state: buffer mappings, mem_alloc).
      Run side;
      side.opt = run.opt;
      side.world_rank = run.world_rank;
      side.world_n = run.world_n;
      side.opt.progress_s = 0;
      std::thread t([&] {
        g_run = &side;
        run_steps(side, parent, step, 1, false);
      });
      finish_batch(run, sub, *pend, before_wait + "the parent ran a step on another thread meanwhile; ");
      t.join();
      run.st.add(side.st);
      ++run.st.concurrent;
      continue;
    }
    if (s.interleave) run_steps(run, parent, step, 1, false);
    if (pend) finish_batch(run, sub, *pend, before_wait);
  }
  if (sub.comm && !destroyed) destroy();
}

// Every rank's op count must agree at the end (else the ranks diverged).
void agree_counts(Run& run, Comm& c) {
  uint64_t v[2] = {run.st.world_ops, ~run.st.world_ops};  // max of both = (max, ~min)
  Result<Work> w = c.allreduce(v, v, 2, DataType::kUint64, RedOp::kMax);
  Status st = w.is_ok() ? w->wait() : w.status();
  if (!st.is_ok()) fail(kExitOpFailed, "final agreement allreduce failed: " + status_str(st));
  if (v[0] != ~v[1])
    fail(kExitWrong, fmt::format("ranks ran different numbers of ops: from {} to {}", ~v[1], v[0]));
}

bool should_stop(Run& run, Comm& c, uint64_t op_index) {
  const Options& o = run.opt;
  if (o.ops > 0 && op_index >= o.from + o.ops) return true;
  if (o.seconds <= 0) return false;
  // Rank 0 decides from its clock; everyone learns it from one allreduce.
  int32_t flag = run.world_rank == 0 &&
                 std::chrono::duration<double>(Clock::now() - run.start).count() >= o.seconds;
  Result<Work> w = c.allreduce(&flag, &flag, 1, DataType::kInt32, RedOp::kMax);
  Status st = w.is_ok() ? w->wait() : w.status();
  if (!st.is_ok()) fail(kExitOpFailed, "stop-flag allreduce failed: " + status_str(st));
  return flag != 0;
}

void run_steps(Run& run, Level& lv, uint64_t first_step, uint64_t nsteps, bool world) {
  uint64_t op_index = 0, step = 0;
  // Fast-forward (--from): generate the steps before the first one to run.
  for (; step < first_step; ++step) op_index += ops_in(make_step(lv.seed, step, lv.n, lv.gen, op_index));
  if (world) {
    for (;; ++step) {
      Step s = make_step(lv.seed, step, lv.n, lv.gen, op_index);
      if (op_index + ops_in(s) > run.opt.from) break;
      op_index += ops_in(s);
    }
  }
  for (uint64_t done = 0; world || done < nsteps; ++done, ++step) {
    if (world && should_stop(run, *lv.comm, op_index)) break;
    Step s = make_step(lv.seed, step, lv.n, lv.gen, op_index);
    if (s.type == Step::Type::kSplit) {
      run_split(run, lv, s);
      if (world) ++run.st.world_ops;
    } else {
      run_batch(run, lv, s, step);
    }
    op_index += ops_in(s);
  }
}

void usage(FILE* f) {
  fprintf(f,
          "usage: loomrun -n N -- loom-stress [options]\n"
          "  --seed S          plan seed (default 1); every rank derives the same ops from it\n"
          "  --ops K           run K ops (default 1000 unless --seconds is given)\n"
          "  --seconds T       run for T seconds (rank 0's clock, agreed by an allreduce)\n"
          "  --from X          start at op X of the plan (replays a failure: the steps before are only generated)\n"
          "  --max-bytes B     largest buffer of one op (default 4M; K/M suffixes)\n"
          "  --colls LIST      comma list of allreduce,reduce_scatter,all_gather,broadcast,reduce,\n"
          "                    all_to_all,sendrecv,group (default all)\n"
          "  --no-split        no split communicators\n"
          "  --no-async        every op waited before the next is issued\n"
          "  --timeout S       deadline of every wait (default LOOM_TIMEOUT)\n"
          "  --threads N       N ranks as threads of this process (Comm::init_all) instead of loomrun's processes\n"
          "  --fake-hosts K    pretend ranks r/K (modK: r%%K) share a host (LOOM_HOST_ID): shm inside, TCP between\n"
          "  --progress S      rank 0 prints a progress line every S seconds (default 5, 0 = never)\n"
          "  -v                print every op (rank 0); -v -v: on every rank\n"
          "Exit: 0 all checked ops right, 1 wrong data, 2 an op failed, 3 usage.\n");
}

bool parse_bytes(const char* s, size_t* out) {
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (end == s || v < 0) return false;
  double m = 1;
  if (*end == 'K' || *end == 'k') m = 1024, ++end;
  else if (*end == 'M' || *end == 'm') m = 1024.0 * 1024, ++end;
  else if (*end == 'G' || *end == 'g') m = 1024.0 * 1024 * 1024, ++end;
  if (*end == 'i') ++end;
  if (*end == 'B') ++end;
  if (*end) return false;
  *out = static_cast<size_t>(v * m);
  return true;
}

int parse_args(int argc, char** argv, Options* o) {
  bool ops_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        fprintf(stderr, "loom-stress: %s needs a value\n", a.c_str());
        std::exit(kExitUsage);
      }
      return argv[++i];
    };
    auto number = [&](const char* v) {
      char* end = nullptr;
      const double d = std::strtod(v, &end);
      if (end == v || *end || d < 0) {
        fprintf(stderr, "loom-stress: %s: not a number: %s\n", a.c_str(), v);
        std::exit(kExitUsage);
      }
      return d;
    };
    // Flags that change the plan go into the replay line.
    if (a == "--seed") {
      o->seed = std::strtoull(value(), nullptr, 0);
    } else if (a == "--ops") {
      o->ops = static_cast<uint64_t>(number(value()));
      ops_given = true;
    } else if (a == "--seconds") {
      o->seconds = number(value());
    } else if (a == "--from") {
      o->from = static_cast<uint64_t>(number(value()));
    } else if (a == "--max-bytes") {
      const char* v = value();
      if (!parse_bytes(v, &o->gen.max_bytes) || o->gen.max_bytes == 0) {
        fprintf(stderr, "loom-stress: --max-bytes: bad size %s\n", v);
        return kExitUsage;
      }
      o->argv_flags += fmt::format(" --max-bytes {}", v);
    } else if (a == "--colls") {
      const char* v = value();
      std::string err;
      if (!parse_kinds(v, &o->gen.kinds, &err)) {
        fprintf(stderr, "loom-stress: --colls: %s\n", err.c_str());
        return kExitUsage;
      }
      o->argv_flags += fmt::format(" --colls {}", v);
    } else if (a == "--no-split") {
      o->gen.split = false;
      o->argv_flags += " --no-split";
    } else if (a == "--no-async") {
      o->gen.async = false;
      o->argv_flags += " --no-async";
    } else if (a == "--timeout") {
      o->timeout_s = number(value());
    } else if (a == "--threads") {
      o->threads = static_cast<int>(number(value()));
      if (o->threads < 1) {
        fprintf(stderr, "loom-stress: --threads needs at least 1\n");
        return kExitUsage;
      }
    } else if (a == "--fake-hosts") {
      o->fake_hosts = value();
      const std::string k = o->fake_hosts.rfind("mod", 0) == 0 ? o->fake_hosts.substr(3) : o->fake_hosts;
      if (k.empty() || k.find_first_not_of("0123456789") != std::string::npos || std::stoi(k) < 1) {
        fprintf(stderr, "loom-stress: --fake-hosts K or modK (K >= 1)\n");
        return kExitUsage;
      }
      o->argv_flags += " --fake-hosts " + o->fake_hosts;
    } else if (a == "--progress") {
      o->progress_s = number(value());
    } else if (a == "--self-test-corrupt") {
      const std::string v = value();
      const size_t colon = v.find(':');
      o->corrupt_op = static_cast<int64_t>(number(v.substr(0, colon).c_str()));
      if (colon != std::string::npos) o->corrupt_kind = v.substr(colon + 1);
      if (o->corrupt_kind != "output" && o->corrupt_kind != "input" && o->corrupt_kind != "guard") {
        fprintf(stderr, "loom-stress: --self-test-corrupt N[:output|input|guard]\n");
        return kExitUsage;
      }
    } else if (a == "-v") {
      ++o->verbose;
    } else if (a == "-vv") {
      o->verbose += 2;
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      std::exit(0);
    } else {
      fprintf(stderr, "loom-stress: unknown option %s\n", a.c_str());
      usage(stderr);
      return kExitUsage;
    }
  }
  if (!ops_given && o->seconds <= 0) o->ops = 1000;
  return 0;
}

std::string mib(uint64_t b) { return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20)); }

// One rank's whole run on its world communicator.
int rank_main(const Options& opt, Comm& c) {
  Run run;
  run.opt = opt;
  g_run = &run;
  run.world_rank = c.rank();
  run.world_n = c.size();
  run.start = run.last_progress = Clock::now();
  Level world;
  world.comm = &c;
  world.rank = c.rank();
  world.n = c.size();
  world.seed = run.opt.seed;
  world.gen = run.opt.gen;
  if (run.world_rank == 0) {
    printf("loom-stress: seed %llu, %d ranks, %s, max %zu bytes per buffer\n",
           static_cast<unsigned long long>(run.opt.seed), run.world_n,
           run.opt.seconds > 0 ? fmt::format("{} s", run.opt.seconds).c_str()
                               : fmt::format("{} ops from op #{}", run.opt.ops, run.opt.from).c_str(),
           run.opt.gen.max_bytes);
    fflush(stdout);
  }
  run_steps(run, world, 0, 0, true);
  c.set_caller_waits(false);
  agree_counts(run, c);
  if (run.opt.corrupt_op >= 0 && run.world_rank == 0)
    fail(kExitWrong, "--self-test-corrupt: no op from #" + std::to_string(run.opt.corrupt_op) +
                         " had a region of that kind to damage");
  Status st = c.destroy();
  if (!st.is_ok()) fail(kExitOpFailed, "destroy failed: " + status_str(st));
  if (run.world_rank == 0) {
    const double secs = std::chrono::duration<double>(Clock::now() - run.start).count();
    std::string per;
    for (int k = 0; k < kNumKinds; ++k)
      per += fmt::format("{}{} {}", k ? ", " : "", kind_name(static_cast<Kind>(k)), run.st.ops_by_kind[k]);
    printf("loom-stress: ops by kind (rank 0, world and split children): %s\n", per.c_str());
    printf("loom-stress: %llu splits (%llu async child batches in flight across a parent step, %llu parent steps on "
           "a second thread while the child's were waited for, %llu child batches in flight across its destroy), "
           "%llu async batches, %llu steps with caller_waits, %s of output checked on rank 0\n",
           static_cast<unsigned long long>(run.st.splits), static_cast<unsigned long long>(run.st.overlapped),
           static_cast<unsigned long long>(run.st.concurrent),
           static_cast<unsigned long long>(run.st.destroyed_in_flight),
           static_cast<unsigned long long>(run.st.async_batches),
           static_cast<unsigned long long>(run.st.caller_waits_steps), mib(run.st.bytes_checked).c_str());
    printf("loom-stress: PASS seed %llu, %d ranks%s: %llu ops (+%llu in split communicators) in %.1f s, wrong 0\n",
           static_cast<unsigned long long>(run.opt.seed), run.world_n, run.opt.threads > 0 ? " (threads)" : "",
           static_cast<unsigned long long>(run.st.world_ops),
           static_cast<unsigned long long>(run.st.child_ops), secs);
    fflush(stdout);
  }
  return 0;
}

int main_impl(int argc, char** argv) {
  Options opt;
  if (int rc = parse_args(argc, argv, &opt)) return rc;
  Config cfg;
  cfg.name = "stress";
  cfg.timeout_s = opt.timeout_s;
  if (!opt.fake_hosts.empty()) {
    const char* r = std::getenv("LOOM_RANK");
    if (opt.threads > 0 || !r) {
      fprintf(stderr, "loom-stress: --fake-hosts needs ranks as processes under loomrun (LOOM_RANK)\n");
      return kExitUsage;
    }
    const bool mod = opt.fake_hosts.rfind("mod", 0) == 0;
    const int k = std::stoi(mod ? opt.fake_hosts.substr(3) : opt.fake_hosts), rank = std::atoi(r);
    setenv("LOOM_HOST_ID", fmt::format("loom-stress-host{}", mod ? rank % k : rank / k).c_str(), 1);
  }
  if (opt.threads > 0) {
    Result<std::vector<std::unique_ptr<Comm>>> comms = Comm::init_all(opt.threads, cfg);
    if (!comms.is_ok()) {
      fprintf(stderr, "loom-stress: init_all failed: %s\n", comms.status().to_string().c_str());
      return kExitOpFailed;
    }
    std::vector<std::thread> ranks;
    for (auto& c : *comms) ranks.emplace_back([&opt, comm = c.get()] { (void)rank_main(opt, *comm); });
    for (auto& t : ranks) t.join();
    return 0;  // a failing rank ends the process with its code
  }
  Result<std::unique_ptr<Comm>> comm = Comm::init_from_env(cfg);
  if (!comm.is_ok()) {
    fprintf(stderr, "loom-stress: init failed: %s\n", comm.status().to_string().c_str());
    return kExitOpFailed;
  }
  return rank_main(opt, **comm);
}

}  // namespace
}  // namespace loom::stress

int main(int argc, char** argv) { return loom::stress::main_impl(argc, argv); }
