#include "schedule_store.h"

#include <algorithm>

namespace loom::sim {
namespace {

uint64_t mix(uint64_t h) {  // splitmix64's finaliser
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

uint64_t hash_steps(const std::vector<StepLite>& v) {
  uint64_t h = mix(v.size());
  for (const StepLite& s : v)
    h = mix(h ^ s.count) + mix((static_cast<uint64_t>(s.rel_peer) << 16) | (static_cast<uint64_t>(s.kind) << 8) | s.flags);
  return h;
}

}  // namespace

ScheduleStore::ScheduleStore(int nranks) : nranks_(nranks) {}

uint32_t ScheduleStore::intern(const std::vector<StepLite>& v) {
  // The phase before is the likeliest match (a ring's steps repeat).
  if (!runs_.empty() && runs_.size() > rank_begin_.back()) {
    const PhaseShape& last = shapes_[runs_.back().shape];
    if (last.nsteps == v.size() && std::equal(v.begin(), v.end(), steps_.begin() + last.first)) return runs_.back().shape;
  }
  for (uint64_t h = hash_steps(v);; h = mix(h + 1)) {  // a collision probes on
    auto it = index_.find(h);
    if (it == index_.end()) {
      PhaseShape p;
      p.first = static_cast<uint32_t>(steps_.size());
      p.nsteps = static_cast<uint32_t>(v.size());
      for (const StepLite& s : v) {
        if (is_comm_step(s.kind)) {
          ++p.ncomm;
          if (s.kind == StepKind::kSend) ++p.nsends;
        }
        else if (s.flags & kOverlap) p.overlap_elems += s.count;
        else if (s.kind == StepKind::kReduce) p.reduce_elems += s.count;
        else p.copy_elems += s.count;
      }
      steps_.insert(steps_.end(), v.begin(), v.end());
      shapes_.push_back(p);
      const auto id = static_cast<uint32_t>(shapes_.size() - 1);
      index_.emplace(h, id);
      return id;
    }
    const PhaseShape& p = shapes_[it->second];
    if (p.nsteps == v.size() && std::equal(v.begin(), v.end(), steps_.begin() + p.first)) return it->second;
  }
}

void ScheduleStore::add_rank(const RankSchedule& s, int repeat) {
  const int rank = ranks_added();
  for (int it = 0; it < repeat; ++it) {
    for (const Phase& ph : s.phases) {
      scratch_.clear();
      for (const Step& st : ph.steps) {
        StepLite l;
        l.count = st.count;
        l.kind = st.kind;
        l.flags = static_cast<uint8_t>((st.overlap ? kOverlap : 0) | (st.peer_reduces ? kPeerReduces : 0) |
                                       (st.announced ? kAnnounced : 0));
        if (is_comm_step(st.kind)) {
          ++transfers_;
          l.rel_peer = st.peer < 0 || st.peer >= nranks_ || st.peer == rank
                           ? kBadPeer
                           : static_cast<uint32_t>((st.peer - rank + nranks_) % nranks_);
        }
        scratch_.push_back(l);
      }
      const uint32_t id = intern(scratch_);
      if (runs_.size() > rank_begin_.back() && runs_.back().shape == id && runs_.back().reps < UINT32_MAX) ++runs_.back().reps;
      else runs_.push_back({id, 1});
      ++phases_;
    }
  }
  rank_begin_.push_back(runs_.size());
}

size_t ScheduleStore::memory_bytes() const {
  return steps_.capacity() * sizeof(StepLite) + shapes_.capacity() * sizeof(PhaseShape) + runs_.capacity() * sizeof(Run) +
         rank_begin_.capacity() * sizeof(uint64_t) + index_.size() * (sizeof(uint64_t) + sizeof(uint32_t) + 24) +
         index_.bucket_count() * sizeof(void*);
}

}  // namespace loom::sim
