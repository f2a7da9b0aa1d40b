#include "simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>

#include "algorithms/matching.h"
#include "event_queue.h"

namespace loom::sim {

const char* limit_name(Limit l) {
  switch (l) {
    case Limit::kLatency: return "latency";
    case Limit::kOverhead: return "per-message overhead";
    case Limit::kPath: return "path bandwidth";
    case Limit::kSendPort: return "send side";
    case Limit::kRecvPort: return "receive side";
    case Limit::kLink: return "host link";
    case Limit::kNicOut: return "NIC out";
    case Limit::kNicIn: return "NIC in";
    case Limit::kLocal: return "local copy/reduce";
  }
  return "?";
}

// ---- the engine ------------------------------------------------------------

namespace {

// A time as the sum of the pieces of the critical path that led to it.
struct Chain {
  std::array<double, kNumLimits> t{};
  // Per kind: the resource (for kPath the pair, src * nranks + dst) behind
  // the largest single piece, and that piece.
  std::array<uint32_t, kNumLimits> top{};
  std::array<float, kNumLimits> top_t{};
  void add(Limit l, double dt, uint32_t what = 0) {
    const auto k = static_cast<size_t>(l);
    t[k] += dt;
    if (dt > top_t[k]) {
      top_t[k] = static_cast<float>(dt);
      top[k] = what;
    }
  }
};

constexpr uint32_t kNone = UINT32_MAX;

// One posted transfer step.
struct MsgRef {
  uint64_t phase = 0;
  uint64_t count = 0;
  uint32_t step = 0;  // its index in the phase
  StepKind kind = StepKind::kSend;
  uint8_t flags = 0;
};

struct Landed {
  MsgRef msg;
  Chain chain;  // of its arrival
};

// A FIFO that keeps its storage (pairs are reused).
template <class T>
struct Fifo {
  std::vector<T> v;
  size_t head = 0;
  bool empty() const { return head == v.size(); }
  size_t size() const { return v.size() - head; }
  const T& front() const { return v[head]; }
  void push(const T& x) { v.push_back(x); }
  T pop() {
    T x = std::move(v[head++]);
    if (head == v.size()) {
      v.clear();
      head = 0;
    } else if (head >= 64 && 2 * head >= v.size()) {  // never drained: drop what was taken
      v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(head));
      head = 0;
    }
    return x;
  }
  template <class F>
  bool any(F&& f) const {
    for (size_t k = head; k < v.size(); ++k)
      if (f(v[k])) return true;
    return false;
  }
};

// The same with its front element inline: a pair's queues hold one posted
// step most of the time, and an all-to-all phase has p^2 pairs at once.
template <class T>
struct SmallFifo {
  T first{};
  bool has_first = false;
  std::unique_ptr<Fifo<T>> rest;  // the rest, rarely any
  bool empty() const { return !has_first; }
  size_t size() const { return has_first ? 1 + (rest ? rest->size() : 0) : 0; }
  const T& front() const { return first; }
  void push(const T& x) {
    if (!has_first) {
      first = x;
      has_first = true;
      return;
    }
    if (!rest) rest = std::make_unique<Fifo<T>>();
    rest->push(x);
  }
  T pop() {
    T x = std::move(first);
    has_first = rest && !rest->empty();
    if (has_first) first = rest->pop();
    return x;
  }
  template <class F>
  bool any(F&& f) const {
    return has_first && (f(first) || (rest && rest->any(f)));
  }
};

// A FIFO that is usually empty: storage only once used.
template <class T>
struct RareFifo {
  std::unique_ptr<Fifo<T>> q;
  bool empty() const { return !q || q->empty(); }
  size_t size() const { return q ? q->size() : 0; }
  const T& front() const { return q->front(); }
  void push(const T& x) {
    if (!q) q = std::make_unique<Fifo<T>>();
    q->push(x);
  }
  T pop() { return q->pop(); }
};

// Messages from src to dst: posted sends not yet started, posted receives
// not yet matched, and messages that arrived before their receive.
constexpr size_t kMaxRoute = 8;

struct Pair {
  int src = -1, dst = -1;
  bool busy = false;      // a message is on its way (one at a time)
  SmallFifo<MsgRef> sends, recvs;
  RareFifo<Landed> landed;  // a message ahead of its receive (eager sends)
  // Its messages' price and path (timed only): alpha, 1 / beta, and the
  // shared resources they use.
  double alpha = 0, path_rate = 0;
  uint8_t nroute = 0;
  std::array<uint32_t, kMaxRoute> route{};
  bool idle() const { return !busy && sends.empty() && recvs.empty() && landed.empty(); }
};

// Open addressing, linear probing, backward-shift deletion: (src, dst) ->
// the pair's slot. Pairs live only while they hold something, so the table
// holds the pairs in use at one time, not every pair ever used.
class PairIndex {
 public:
  static constexpr uint64_t kEmpty = UINT64_MAX;
  PairIndex() { resize(1024); }
  const uint32_t* find(uint64_t key) const {
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == kEmpty) return nullptr;
      if (keys_[i] == key) return &vals_[i];
    }
  }
  void insert(uint64_t key, uint32_t val) {
    if (2 * (size_ + 1) > keys_.size()) resize(2 * keys_.size());
    size_t i = slot(key);
    while (keys_[i] != kEmpty) i = (i + 1) & mask_;
    keys_[i] = key;
    vals_[i] = val;
    ++size_;
  }
  void erase(uint64_t key) {
    size_t i = slot(key);
    while (keys_[i] != key) i = (i + 1) & mask_;
    // Backward shift: later entries of the probe run move into the hole
    // unless their home lies cyclically in (hole, entry].
    for (size_t j = (i + 1) & mask_; keys_[j] != kEmpty; j = (j + 1) & mask_) {
      const size_t home = slot(keys_[j]);
      const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
      if (!stays) {
        keys_[i] = keys_[j];
        vals_[i] = vals_[j];
        i = j;
      }
    }
    keys_[i] = kEmpty;
    --size_;
  }
  size_t size() const { return size_; }

 private:
  size_t slot(uint64_t key) const {
    const uint64_t h = key * 0x9e3779b97f4a7c15ULL;
    return static_cast<size_t>(h ^ (h >> 29)) & mask_;
  }
  void resize(size_t n) {
    std::vector<uint64_t> keys = std::move(keys_);
    std::vector<uint32_t> vals = std::move(vals_);
    keys_.assign(n, kEmpty);
    vals_.assign(n, 0);
    mask_ = n - 1;
    size_ = 0;
    for (size_t i = 0; i < keys.size(); ++i)
      if (keys[i] != kEmpty) insert(keys[i], vals[i]);
  }
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> vals_;
  size_t mask_ = 0, size_ = 0;
};

// A shared resource: its capacity and the flows on it, as a list threaded
// through the flows (Flow::next / prev), so that pricing a flow reads one
// line per resource and nothing behind it.
// The bandwidth kinds of Limit, kPath .. kNicIn, contiguous.
constexpr size_t kFirstBandwidthLimit = static_cast<size_t>(Limit::kPath);
constexpr size_t kNumBandwidthLimits = static_cast<size_t>(Limit::kNicIn) - kFirstBandwidthLimit + 1;

struct Resource {
  double cap = 0;  // bytes per us
  uint32_t head = kNone;
  uint32_t count = 0;
  bool dirty = false;
};

// A message moving its bytes.
struct Flow {
  uint32_t pair = 0;
  uint32_t ver = 0;      // its pending event's (stale ones are skipped)
  uint8_t nres = 0;
  int8_t limiter = -1;   // index into res, or -1: the path itself
  bool dirty = false;
  // Alone on every resource when last priced: no event at its bytes' end
  // (nothing else would change then), only its arrival. It stays on its
  // resources until then, or until a newcomer finds its bytes done.
  bool lazy = false;
  bool linked = false;   // on its resources' lists
  // Its resources are its pair's route; its links in their lists:
  std::array<uint32_t, kMaxRoute> next{}, prev{};
  double remaining = 0, rate = 0, last = 0, since = 0;
  double end = 0;        // when its bytes are done at the current rate
  double overhead = 0;   // per-message gaps before it (Fabric::gap_us), on top of alpha
  MsgRef msg;
  // Its critical path: the chain it started from (pooled: a phase's flows
  // share their sender's), plus its own bandwidth-limited time by kind
  // (kPath .. kNicIn) and its largest single piece.
  uint32_t start = 0;
  std::array<double, kNumBandwidthLimits> bw{};
  uint32_t main_what = 0;
  float main_dt = 0;
  Limit main_kind = Limit::kPath;
};

struct RankState {
  uint32_t run = 0, rep = 0;  // position in the store's runs
  uint64_t phase = 0;
  uint32_t pending = 0;       // transfers of the phase not done
  double ready = 0;           // when the phase's finished work is all done
  bool done = false;
  double finish = 0;
  Chain ready_chain, post_chain;
  // Its latest pairs (pair_of), before the index.
  static constexpr size_t kPairCache = 4;
  std::array<uint32_t, kPairCache> pair_cache{kNone, kNone, kNone, kNone};
  uint32_t started = 0;  // messages this phase has started (Fabric::gap_us)
  uint32_t pool_id = kNone;  // post_chain pooled for the flows of phase pool_phase
  uint64_t pool_phase = 0;
};

class Engine {
 public:
  Engine(const ScheduleStore& store, const Fabric& fab, const SimOptions& opt)
      : store_(store), fab_(fab), opt_(opt), n_(store.nranks()), timed_(!opt.structure_only), ranks_(static_cast<size_t>(n_)) {
    if (timed_) {
      res_.resize(fab.capacity_GBps.size());
      for (size_t i = 0; i < res_.size(); ++i) res_[i].cap = fab.capacity_GBps[i] * 1e3;
      copy_us_per_elem_ = 2.0 / 3.0 * fab.gamma_us_per_byte * static_cast<double>(opt.elem_bytes);
      reduce_us_per_elem_ = fab.gamma_us_per_byte * static_cast<double>(opt.elem_bytes);
      gap_ = fab.gap_us;
    }
    total_msgs_ = store.transfers() / 2;
    sweep_at_ = std::max<size_t>(size_t{1} << 20, 8 * static_cast<size_t>(n_));
  }

  Result<SimResult> run() {
    for (int r = 0; r < n_; ++r) start_phase(r, 0.0, Chain{});
    while (error_.is_ok()) {
      Event e;
      if (!now_posts_.empty()) {  // posts due now (all of them in --check)
        e = Event{now_, now_posts_.front(), static_cast<uint32_t>(EvType::kPost) << 30};
        now_posts_.pop_front();
      } else {
        if (heap_.empty()) break;
        e = heap_.top();
        heap_.pop();
      }
      now_ = e.t;
      ++events_;
      if ((events_ & ((1u << 20) - 1)) == 0 && opt_.progress) opt_.progress(now_, msgs_done_, total_msgs_);
      switch (e.type()) {
        case EvType::kPost: on_post(static_cast<int>(e.id)); break;
        case EvType::kFlowEnd: on_flow_end(e.id, e.ver()); break;
        case EvType::kArrive: on_arrive(e.id, e.ver()); break;
      }
      if (timed_ && now_posts_.empty() && (heap_.empty() || heap_.top().t > now_)) flush_rates();
    }
    if (!error_.is_ok()) return error_;
    LOOM_RETURN_IF_ERROR(final_check());
    SimResult out;
    out.messages = msgs_done_;
    out.events = events_;
    out.finish_us.resize(static_cast<size_t>(n_));
    for (int r = 0; r < n_; ++r) {
      const RankState& rs = ranks_[static_cast<size_t>(r)];
      out.finish_us[static_cast<size_t>(r)] = rs.finish;
      if (out.slowest_rank < 0 || rs.finish > out.time_us) {
        out.time_us = rs.finish;
        out.slowest_rank = r;
      }
    }
    if (out.slowest_rank >= 0 && timed_) {
      const Chain& c = ranks_[static_cast<size_t>(out.slowest_rank)].ready_chain;
      out.path_us = c.t;
      size_t k = 0;
      for (size_t i = 1; i < c.t.size(); ++i)
        if (c.t[i] > c.t[k]) k = i;
      out.critical = static_cast<Limit>(k);
      out.critical_text = describe_limit(out.critical, c.top[k]);
    }
    return out;
  }

 private:
  std::string describe_limit(Limit l, uint32_t what) const {
    if (l == Limit::kPath)
      return fmt::format("path bandwidth ({} -> {})", what / static_cast<uint32_t>(n_), what % static_cast<uint32_t>(n_));
    if (l == Limit::kSendPort || l == Limit::kRecvPort || l == Limit::kLink || l == Limit::kNicOut || l == Limit::kNicIn) {
      if (fab_.name) return fab_.name(what);
    }
    return limit_name(l);
  }

  // ---- events
  void push(double t, EvType type, uint32_t id, uint32_t ver = 0) {
    // A post due now skips the heap: most phases start the moment their
    // last message arrives.
    if (type == EvType::kPost && (!timed_ || t == now_)) now_posts_.push_back(id);
    else heap_.push(Event{t, id, (static_cast<uint32_t>(type) << 30) | (ver & Event::kVerMask)});
  }

  const PhaseShape& current(const RankState& rs, int r) const { return store_.shape(store_.runs(r)[rs.run].shape); }

  // The rank's next phase: its local steps from t, its transfers after them.
  void start_phase(int r, double t, const Chain& c) {
    RankState& rs = ranks_[static_cast<size_t>(r)];
    if (rs.run >= store_.runs(r).size()) {
      rs.done = true;
      rs.finish = t;
      if (timed_) rs.ready_chain = c;
      return;
    }
    const PhaseShape& p = current(rs, r);
    double local = 0;
    if (timed_) {
      rs.post_chain = c;
      local = static_cast<double>(p.copy_elems) * copy_us_per_elem_ + static_cast<double>(p.reduce_elems) * reduce_us_per_elem_;
      if (local > 0) rs.post_chain.add(Limit::kLocal, local);
    }
    push(t + local, EvType::kPost, static_cast<uint32_t>(r));
  }

  void phase_done(int r) {
    RankState& rs = ranks_[static_cast<size_t>(r)];
    const auto runs = store_.runs(r);
    if (++rs.rep == runs[rs.run].reps) {
      rs.rep = 0;
      ++rs.run;
    }
    ++rs.phase;
    start_phase(r, rs.ready, rs.ready_chain);
  }

  void step_done(int r, double t, const Chain& c) {
    RankState& rs = ranks_[static_cast<size_t>(r)];
    if (t > rs.ready) {
      rs.ready = t;
      if (timed_) rs.ready_chain = c;
    }
    if (--rs.pending == 0) phase_done(r);
  }

  void on_post(int r) {
    RankState& rs = ranks_[static_cast<size_t>(r)];
    const PhaseShape& p = current(rs, r);
    const uint64_t phase = rs.phase;
    rs.pending = p.ncomm;
    rs.ready = now_;
    rs.started = 0;  // the gap counts a phase's own messages (start_flow), not phases
    if (timed_) rs.ready_chain = rs.post_chain;
    if (timed_ && p.overlap_elems) {
      const double t = static_cast<double>(p.overlap_elems) * copy_us_per_elem_;
      rs.ready += t;
      rs.ready_chain.add(Limit::kLocal, t);
    }
    if (p.ncomm == 0) return phase_done(r);
    const auto steps = store_.steps(p);
    for (uint32_t i = 0; i < steps.size() && error_.is_ok(); ++i) {
      const StepLite& s = steps[i];
      if (!is_comm_step(s.kind)) continue;
      const int peer = store_.peer(r, s);
      if (peer < 0) {
        error_ = step_error(r, phase, i, [&](const Step& st) { return check_peer(r, phase, st, n_); });
        return;
      }
      const MsgRef m{phase, s.count, i, s.kind, s.flags};
      if (s.kind == StepKind::kSend) {
        const uint32_t pid = pair_of(r, peer, r);
        pairs_[pid].sends.push(m);
        try_start(pid, rs.post_chain, r);
      } else {
        post_recv(pair_of(peer, r, r), m);
      }
    }
  }

  // ---- pairs and messages
  uint64_t key_of(int src, int dst) const {
    return static_cast<uint64_t>(src) * static_cast<uint64_t>(n_) + static_cast<uint64_t>(dst);
  }
  // The pair (src, dst), seen from rank `me` (one of the two): a few pairs
  // per rank are remembered (a ring's two, a tree's few) before the index.
  uint32_t pair_of(int src, int dst, int me) {
    const uint64_t key = key_of(src, dst);
    RankState& rs = ranks_[static_cast<size_t>(me)];
    const size_t slot = static_cast<size_t>(key % RankState::kPairCache);
    const uint32_t cached = rs.pair_cache[slot];
    if (cached != kNone && pairs_[cached].src == src && pairs_[cached].dst == dst) return cached;
    const uint32_t pid = pair_index(src, dst, key);
    rs.pair_cache[slot] = pid;
    return pid;
  }
  uint32_t pair_index(int src, int dst, uint64_t key) {
    if (const uint32_t* v = index_.find(key)) return *v;
    if (index_.size() >= sweep_at_) sweep_pairs();
    uint32_t id;
    if (!free_pairs_.empty()) {
      id = free_pairs_.back();
      free_pairs_.pop_back();
    } else {
      id = static_cast<uint32_t>(pairs_.size());
      pairs_.emplace_back();
    }
    Pair& p = pairs_[id];
    p.src = src;
    p.dst = dst;
    if (timed_) {
      const topo::LinkCost l = fab_.link(src, dst);
      p.alpha = l.alpha_us;
      p.path_rate = l.beta_us_per_byte > 0 ? 1.0 / l.beta_us_per_byte : std::numeric_limits<double>::infinity();
      route_.clear();
      fab_.route(src, dst, route_);
      p.nroute = 0;
      for (uint32_t rid : route_)
        if (p.nroute < kMaxRoute && std::isfinite(res_[rid].cap)) p.route[p.nroute++] = rid;  // else no constraint
    }
    index_.insert(key, id);
    return id;
  }
  // Pairs stay while idle (a ring uses the same two again and again); when
  // there are many, the idle ones go, so that algorithms that meet every
  // peer in turn (pairwise) hold only the pairs in use at one time.
  void sweep_pairs() {
    for (uint32_t pid = 0; pid < pairs_.size(); ++pid) {
      Pair& p = pairs_[pid];
      if (p.src < 0 || !p.idle()) continue;
      index_.erase(key_of(p.src, p.dst));
      p.src = p.dst = -1;
      free_pairs_.push_back(pid);
    }
    sweep_at_ = std::max(sweep_at_, 2 * index_.size());
  }

  // Starts the pair's next messages while the pair is free: each message
  // waits for the one before it, a large one for its receive, and each for
  // a message slot of its sender. `why` is what led to now.
  // `why_rank` >= 0: `why_in` is that rank's post_chain, of its phase now.
  void try_start(uint32_t pid, const Chain& why_in, int why_rank = -1) {
    // A copy: a step done below may start the rank's next phase, which
    // rewrites the chain `why_in` may be.
    Chain copy;
    if (timed_) copy = why_in;
    const Chain& why = timed_ ? copy : why_in;
    for (;;) {
      if (!error_.is_ok()) return;
      Pair& p = pairs_[pid];
      if (p.busy || p.sends.empty()) break;
      const uint64_t bytes = p.sends.front().count * opt_.elem_bytes;
      if (timed_ && bytes > opt_.eager_bytes && p.recvs.empty()) break;  // rendezvous
      if (!timed_ || bytes == 0) {  // no cost: there at once (the executor skips empty transfers)
        const MsgRef m = p.sends.pop();
        ++msgs_done_;
        step_done(p.src, now_, why);
        land(pid, m, why);
        why_rank = -1;  // that rank may be in its next phase now
        continue;
      }
      start_flow(pid, why, why_rank);
    }
  }

  void post_recv(uint32_t pid, const MsgRef& m) {
    Pair& p = pairs_[pid];
    const RankState& rs = ranks_[static_cast<size_t>(p.dst)];
    if (!p.landed.empty()) {
      const Landed l = p.landed.pop();
      match(pid, m, l.msg, rs.post_chain);  // it was there first: the receive came last
      return;
    }
    p.recvs.push(m);
    try_start(pid, rs.post_chain, p.dst);
  }

  // A message arrives at its receiver now; `why` led to its arrival.
  void land(uint32_t pid, const MsgRef& sent, const Chain& why) {
    Pair& p = pairs_[pid];
    if (p.recvs.empty()) {
      p.landed.push(Landed{sent, why});
      return;
    }
    const MsgRef recv = p.recvs.pop();
    match(pid, recv, sent, why);
  }

  void match(uint32_t pid, const MsgRef& recv, const MsgRef& sent, const Chain& why) {
    const Pair& p = pairs_[pid];
    const int src = p.src, dst = p.dst;
    const bool reduces = recv.kind == StepKind::kRecvReduce;
    const bool ok = recv.count == sent.count &&
                    (recv.count == 0 || (((sent.flags & kPeerReduces) != 0) == reduces &&
                                         ((sent.flags & kAnnounced) != 0) == ((recv.flags & kAnnounced) != 0)));
    if (!ok) {
      const MessageTag tag{sent.count, sent.phase, (sent.flags & kPeerReduces) != 0, (sent.flags & kAnnounced) != 0};
      error_ = step_error(dst, recv.phase, recv.step, [&](const Step& st) {
        Status s = check_receive(dst, recv.phase, st, tag);
        return s.is_ok() ? internal_error(fmt::format("rank {} phase {}: a receive from rank {} does not match its message",
                                                      dst, recv.phase, src))
                         : s;
      });
      return;
    }
    if (timed_ && reduces && recv.count) {
      const double red = static_cast<double>(recv.count) * reduce_us_per_elem_;
      Chain c = why;
      c.add(Limit::kLocal, red);
      step_done(dst, now_ + red, c);
      return;
    }
    step_done(dst, now_, why);
  }

  // ---- chains shared by flows
  uint32_t pool_put(const Chain& c) {
    uint32_t id;
    if (!pool_free_.empty()) {
      id = pool_free_.back();
      pool_free_.pop_back();
      pool_[id] = c;
    } else {
      id = static_cast<uint32_t>(pool_.size());
      pool_.push_back(c);
      pool_refs_.push_back(0);
    }
    pool_refs_[id] = 1;
    return id;
  }
  void pool_release(uint32_t id) {
    if (--pool_refs_[id] == 0) pool_free_.push_back(id);
  }
  // The rank's post chain of its phase now, pooled once for all its flows.
  uint32_t phase_chain(int r) {
    RankState& rs = ranks_[static_cast<size_t>(r)];
    if (rs.pool_id == kNone || rs.pool_phase != rs.phase) {
      if (rs.pool_id != kNone) pool_release(rs.pool_id);
      rs.pool_id = pool_put(rs.post_chain);
      rs.pool_phase = rs.phase;
    }
    ++pool_refs_[rs.pool_id];
    return rs.pool_id;
  }

  // ---- flows (timed only)
  void start_flow(uint32_t pid, const Chain& why, int why_rank) {
    Pair& p = pairs_[pid];
    const MsgRef m = p.sends.pop();
    p.busy = true;
    uint32_t fid;
    if (!free_flows_.empty()) {
      fid = free_flows_.back();
      free_flows_.pop_back();
    } else {
      fid = static_cast<uint32_t>(flows_.size());
      flows_.emplace_back();
    }
    Flow& f = flows_[fid];
    f.pair = pid;
    f.msg = m;
    f.start = why_rank >= 0 ? phase_chain(why_rank) : pool_put(why);
    f.bw.fill(0);
    f.main_dt = 0;
    f.remaining = static_cast<double>(m.count * opt_.elem_bytes);
    f.rate = 0;
    f.last = f.since = now_;
    f.limiter = -1;
    f.lazy = false;
    // The phase's k-th message pays (k - 1) gaps on top of its alpha: the
    // per-message work of the sender before it (the cost model's overlap_us
    // term). As latency, not a later start, so a phase's messages still
    // share bandwidth from one instant (and get priced together).
    RankState& rs = ranks_[static_cast<size_t>(p.src)];
    f.overhead = gap_ * rs.started++;
    f.nres = p.nroute;
    link(fid);
    if (!f.dirty) {  // priced at the end of this instant, with whoever else starts now
      f.dirty = true;
      dirty_flows_.push_back(fid);
    }
  }

  const std::array<uint32_t, kMaxRoute>& res_of(const Flow& f) const { return pairs_[f.pair].route; }
  uint8_t slot_of(const Flow& f, uint32_t rid) const {
    const auto& res = res_of(f);
    uint8_t k = 0;
    while (res[k] != rid) ++k;
    return k;
  }
  void link(uint32_t fid) {
    Flow& f = flows_[fid];
    const auto& route = res_of(f);
    for (uint8_t k = 0; k < f.nres; ++k) {
      Resource& res = res_[route[k]];
      f.prev[k] = kNone;
      f.next[k] = res.head;
      if (res.head != kNone) flows_[res.head].prev[slot_of(flows_[res.head], route[k])] = fid;
      res.head = fid;
      ++res.count;
      mark(route[k]);
    }
    f.linked = true;
  }
  void unlink(uint32_t fid) {
    Flow& f = flows_[fid];
    const auto& route = res_of(f);
    for (uint8_t k = 0; k < f.nres; ++k) {
      const uint32_t rid = route[k];
      Resource& res = res_[rid];
      if (f.prev[k] != kNone) flows_[f.prev[k]].next[slot_of(flows_[f.prev[k]], rid)] = f.next[k];
      else res.head = f.next[k];
      if (f.next[k] != kNone) flows_[f.next[k]].prev[slot_of(flows_[f.next[k]], rid)] = f.prev[k];
      --res.count;
      mark(rid);
    }
    f.linked = false;
  }

  void mark(uint32_t rid) {
    Resource& res = res_[rid];
    if (res.dirty) return;
    res.dirty = true;
    dirty_res_.push_back(rid);
  }

  // Every flow on a resource whose set of flows changed gets its share again,
  // once per instant: a phase that posts many transfers at once costs one
  // pass over each resource's flows, not one per transfer. A lazy flow whose
  // bytes are done leaves its resources first (it only waits out its alpha).
  void flush_rates() {
    for (size_t i = 0; i < dirty_res_.size(); ++i) {  // unlink may mark more
      const uint32_t rid = dirty_res_[i];
      const double share = res_[rid].cap / static_cast<double>(std::max<uint32_t>(res_[rid].count, 1));
      for (uint32_t fid = res_[rid].head; fid != kNone;) {
        Flow& f = flows_[fid];
        const uint32_t nextf = f.next[slot_of(f, rid)];
        if (f.lazy && f.end <= now_) {
          unlink(fid);
        } else if (!f.dirty && (f.lazy || f.rate > share || (f.limiter >= 0 && res_of(f)[static_cast<size_t>(f.limiter)] == rid))) {
          // Only these can change: a flow this resource limits, one it
          // limits now, a lazy one that is no longer alone. The others
          // keep their rate and their events.
          f.dirty = true;
          dirty_flows_.push_back(fid);
        }
        fid = nextf;
      }
    }
    for (uint32_t rid : dirty_res_) res_[rid].dirty = false;
    dirty_res_.clear();
    for (size_t i = 0; i < dirty_flows_.size(); ++i) {
      const uint32_t fid = dirty_flows_[i];
      flows_[fid].dirty = false;
      if (flows_[fid].linked) update_rate(fid);
    }
    dirty_flows_.clear();
  }

  // The time since `since` (up to `until`) joins the flow's chain, as what
  // held it back.
  void account(Flow& f, double until) {
    const double dt = until - f.since;
    f.since = until;
    if (dt <= 0) return;
    Limit kind = Limit::kPath;
    uint32_t what;
    if (f.limiter >= 0) {
      what = res_of(f)[static_cast<size_t>(f.limiter)];
      kind = fab_.kind[what];
    } else {
      const Pair& p = pairs_[f.pair];
      what = static_cast<uint32_t>(key_of(p.src, p.dst));
    }
    f.bw[static_cast<size_t>(kind) - kFirstBandwidthLimit] += dt;
    if (dt > f.main_dt) {
      f.main_dt = static_cast<float>(dt);
      f.main_what = what;
      f.main_kind = kind;
    }
  }

  void update_rate(uint32_t fid) {
    Flow& f = flows_[fid];
    if (now_ > f.last) f.remaining = std::max(0.0, f.remaining - f.rate * (now_ - f.last));
    f.last = now_;
    const Pair& p = pairs_[f.pair];
    double rate = p.path_rate;
    int8_t lim = -1;
    bool shared = false;
    for (uint8_t k = 0; k < f.nres; ++k) {
      const Resource& res = res_[p.route[k]];
      shared = shared || res.count > 1;
      const double share = res.cap / static_cast<double>(res.count);
      if (share < rate) {
        rate = share;
        lim = static_cast<int8_t>(k);
      }
    }
    if (rate == f.rate && shared == !f.lazy) {  // its events stand
      if (lim != f.limiter) {
        account(f, now_);
        f.limiter = lim;
      }
      return;
    }
    account(f, now_);
    f.rate = rate;
    f.limiter = lim;
    f.lazy = !shared;
    f.end = now_ + (std::isinf(rate) ? 0.0 : f.remaining / rate);
    ++f.ver;
    if (f.lazy) push(f.end + p.alpha + f.overhead, EvType::kArrive, fid, f.ver);
    else push(f.end, EvType::kFlowEnd, fid, f.ver);
  }

  void on_flow_end(uint32_t fid, uint32_t ver) {
    Flow& f = flows_[fid];
    if (ver != (f.ver & Event::kVerMask)) return;  // its rate changed since: a later event stands
    account(f, now_);
    f.remaining = 0;
    unlink(fid);
    ++f.ver;
    push(now_ + pairs_[f.pair].alpha + f.overhead, EvType::kArrive, fid, f.ver);
  }

  void on_arrive(uint32_t fid, uint32_t ver) {
    Flow& f = flows_[fid];
    if (ver != (f.ver & Event::kVerMask)) return;  // a lazy flow priced again since
    if (f.linked) unlink(fid);  // lazy: still on its resources
    const double alpha = pairs_[f.pair].alpha;
    account(f, now_ - alpha - f.overhead);
    // Its chain: where it started, its own pieces, its latency.
    Chain why = pool_[f.start];
    pool_release(f.start);
    for (size_t k = 0; k < kNumBandwidthLimits; ++k) why.t[kFirstBandwidthLimit + k] += f.bw[k];
    if (f.main_dt > 0) {
      const auto k = static_cast<size_t>(f.main_kind);
      if (f.main_dt > why.top_t[k]) {
        why.top_t[k] = f.main_dt;
        why.top[k] = f.main_what;
      }
    }
    why.add(Limit::kLatency, alpha);
    if (f.overhead > 0) why.add(Limit::kOverhead, f.overhead);
    ++f.ver;
    const uint32_t pid = f.pair;
    const MsgRef m = f.msg;
    free_flows_.push_back(fid);
    Pair& p = pairs_[pid];
    p.busy = false;
    ++msgs_done_;
    step_done(p.src, now_, why);
    land(pid, m, why);
    try_start(pid, why);
  }

  // ---- errors
  // The rank's full schedule for an error message, when the caller can give it.
  const Step* real_step(int r, uint64_t phase, uint32_t step) {
    if (!opt_.schedule_of) return nullptr;
    if (cached_rank_ != r) {
      auto s = opt_.schedule_of(r);
      if (!s.is_ok()) return nullptr;
      cached_ = std::move(*s);
      cached_rank_ = r;
    }
    if (phase >= cached_.phases.size() || step >= cached_.phases[phase].steps.size()) return nullptr;
    return &cached_.phases[phase].steps[step];
  }
  // The step as the store has it (no buffers).
  Step lite_step(int r, uint64_t phase, uint32_t step) const {
    const auto runs = store_.runs(r);
    uint64_t left = phase;
    size_t k = 0;
    while (k < runs.size() && left >= runs[k].reps) left -= runs[k++].reps;
    Step st;
    if (k == runs.size()) return st;
    const StepLite& l = store_.steps(store_.shape(runs[k].shape))[step];
    st.kind = l.kind;
    st.count = l.count;
    st.peer = store_.peer(r, l);
    st.peer_reduces = l.flags & kPeerReduces;
    st.announced = l.flags & kAnnounced;
    st.overlap = l.flags & kOverlap;
    return st;
  }
  std::string describe_step(int r, uint64_t phase, uint32_t step) {
    if (const Step* s = real_step(r, phase, step)) return describe(*s);
    const Step s = lite_step(r, phase, step);
    switch (s.kind) {
      case StepKind::kSend: return fmt::format("send {} to rank {}", s.count, s.peer);
      case StepKind::kRecv: return fmt::format("recv {} from rank {}", s.count, s.peer);
      case StepKind::kRecvReduce: return fmt::format("recv_reduce {} from rank {}", s.count, s.peer);
      default: return describe(s);
    }
  }
  template <class F>
  Status step_error(int r, uint64_t phase, uint32_t step, F&& check_fn) {
    if (const Step* s = real_step(r, phase, step)) return check_fn(*s);
    return check_fn(lite_step(r, phase, step));
  }

  // The first unfinished transfer of a blocked rank, and the peer it waits on.
  std::optional<std::pair<uint32_t, int>> waiting_on(int r) const {
    const RankState& rs = ranks_[static_cast<size_t>(r)];
    const auto steps = store_.steps(current(rs, r));
    auto queued = [&](const SmallFifo<MsgRef>& q, uint32_t i) {
      return q.any([&](const MsgRef& m) { return m.phase == rs.phase && m.step == i; });
    };
    for (uint32_t i = 0; i < steps.size(); ++i) {
      const StepLite& s = steps[i];
      if (!is_comm_step(s.kind)) continue;
      const int peer = store_.peer(r, s);
      const bool send = s.kind == StepKind::kSend;
      const uint32_t* pid = index_.find(send ? key_of(r, peer) : key_of(peer, r));
      if (pid && queued(send ? pairs_[*pid].sends : pairs_[*pid].recvs, i)) return std::make_pair(i, peer);
    }
    return std::nullopt;
  }

  Status final_check() {
    std::vector<int> blocked;
    for (int r = 0; r < n_; ++r)
      if (!ranks_[static_cast<size_t>(r)].done) blocked.push_back(r);
    if (!blocked.empty()) {
      // Follow "waits on" from the first blocked rank: to a rank that has
      // finished (nothing more will come from it), or round a cycle.
      std::vector<int> chain;
      std::map<int, size_t> seen;
      std::vector<std::string> what;
      int r = blocked.front();
      std::string tail;
      for (;;) {
        if (ranks_[static_cast<size_t>(r)].done) {
          tail = fmt::format("; rank {} has finished", r);
          break;
        }
        if (auto it = seen.find(r); it != seen.end()) {
          std::string cyc;
          for (size_t k = it->second; k < chain.size(); ++k) cyc += fmt::format("{} -> ", chain[k]);
          tail = fmt::format(": a cycle ({}{})", cyc, r);
          break;
        }
        if (what.size() == 8) {
          tail = ", ...";
          break;
        }
        auto w = waiting_on(r);
        if (!w) {
          tail = fmt::format("; rank {} phase {} waits on nothing the simulator can name", r,
                             ranks_[static_cast<size_t>(r)].phase);
          break;
        }
        seen[r] = chain.size();
        chain.push_back(r);
        const uint64_t phase = ranks_[static_cast<size_t>(r)].phase;
        const bool send = store_.steps(current(ranks_[static_cast<size_t>(r)], r))[w->first].kind == StepKind::kSend;
        what.push_back(fmt::format("rank {} phase {} waits on '{}'{}", r, phase, describe_step(r, phase, w->first),
                                   send ? " (over the eager limit: it waits for its receive)" : ""));
        r = w->second;
      }
      std::string msg = fmt::format("deadlock: {} rank(s) blocked; ", blocked.size());
      for (size_t k = 0; k < what.size(); ++k) msg += (k ? ", " : "") + what[k];
      return internal_error(msg + tail);
    }
    // Every rank finished: a message still queued was never received.
    std::optional<std::pair<uint64_t, uint32_t>> first;  // (key, pair)
    for (size_t pid = 0; pid < pairs_.size(); ++pid) {
      const Pair& p = pairs_[pid];
      if (p.src < 0 || (p.sends.empty() && p.landed.empty())) continue;
      const uint64_t key = key_of(p.src, p.dst);
      if (!first || key < first->first) first = std::make_pair(key, static_cast<uint32_t>(pid));
    }
    if (first) {
      const Pair& p = pairs_[first->second];
      const MsgRef& m = p.landed.empty() ? p.sends.front() : p.landed.front().msg;
      return internal_error(fmt::format("rank {} phase {}: '{}' was never received ({} message(s) from rank {} to rank {})",
                                        p.src, m.phase, describe_step(p.src, m.phase, m.step),
                                        p.sends.size() + p.landed.size(), p.src, p.dst));
    }
    return Status::ok();
  }

  const ScheduleStore& store_;
  const Fabric& fab_;
  const SimOptions& opt_;
  const int n_;
  const bool timed_;
  double copy_us_per_elem_ = 0, reduce_us_per_elem_ = 0, gap_ = 0;
  std::vector<RankState> ranks_;
  std::deque<Pair> pairs_;  // stable addresses while new pairs are added
  std::vector<uint32_t> free_pairs_;
  PairIndex index_;
  size_t sweep_at_ = 0;
  std::vector<Resource> res_;
  std::vector<Flow> flows_;
  std::vector<Chain> pool_;
  std::vector<uint32_t> pool_refs_, pool_free_;
  std::vector<uint32_t> free_flows_, dirty_res_, dirty_flows_, route_;
  EventQueue heap_;
  std::deque<uint32_t> now_posts_;
  double now_ = 0;
  uint64_t events_ = 0, msgs_done_ = 0, total_msgs_ = 0;
  Status error_ = Status::ok();
  int cached_rank_ = -1;
  RankSchedule cached_;
};

}  // namespace

Result<SimResult> simulate(const ScheduleStore& store, const Fabric& fabric, const SimOptions& options) {
  if (store.ranks_added() != store.nranks())
    return invalid_argument(fmt::format("simulate: {} of {} ranks' schedules given", store.ranks_added(), store.nranks()));
  if (!options.structure_only) {
    if (fabric.nranks != store.nranks() || !fabric.link || !fabric.route || fabric.kind.size() != fabric.capacity_GBps.size())
      return invalid_argument("simulate: the fabric does not describe these ranks");
  }
  Engine e(store, fabric, options);
  return e.run();
}

Status check(const ScheduleStore& store, SimOptions options) {
  options.structure_only = true;
  Fabric none;
  none.nranks = store.nranks();
  auto r = simulate(store, none, options);
  return r.is_ok() ? Status::ok() : r.status();
}

}  // namespace loom::sim
