// The simulator's pending events, in time order (simulator.cc's engine).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <queue>
#include <vector>

namespace loom::sim {

enum class EvType : uint8_t { kPost, kFlowEnd, kArrive };
struct Event {
  double t;
  uint32_t id;
  uint32_t tagged;  // the type in the top 2 bits, a flow's version below
  EvType type() const { return static_cast<EvType>(tagged >> 30); }
  uint32_t ver() const { return tagged & kVerMask; }
  static constexpr uint32_t kVerMask = (1u << 30) - 1;
};

// The pending events by time: a radix heap (Ahuja, Mehlhorn, Orlin, Tarjan),
// which a discrete-event simulation may use since no event is ever due
// before the last one taken. Times are non-negative doubles, ordered as
// their bit patterns. A push is an append; a take moves each event down a
// bucket at most 64 times in all, with no comparisons to mispredict (a
// binary heap's sifting was a third of the run time at 1024 ranks).
// Looking at the earliest event (top) moves the heap's base up to it; an
// event pushed after that below the base (the rates of this instant, due
// before the next event) waits in a small binary heap taken first.
class EventQueue {
 public:
  bool empty() const { return size_ == 0; }
  void push(const Event& e) {
    const uint64_t k = key(e.t);
    if (k < last_) low_.push(Item{k, e});
    else buckets_[bucket(k)].push_back({k, e});
    ++size_;
  }
  // The earliest event (empty() must be false).
  const Event& top() {
    if (!low_.empty()) return low_.top().e;
    if (buckets_[0].empty()) refill();
    return buckets_[0].back().e;
  }
  void pop() {
    --size_;
    if (!low_.empty()) return low_.pop();
    if (buckets_[0].empty()) refill();
    buckets_[0].pop_back();
  }

 private:
  struct Item {
    uint64_t k;
    Event e;
    bool operator>(const Item& o) const { return k > o.k; }
  };
  static uint64_t key(double t) {
    uint64_t k;
    std::memcpy(&k, &t, sizeof k);
    return k;
  }
  size_t bucket(uint64_t k) const { return k == last_ ? 0 : 64 - static_cast<size_t>(__builtin_clzll(k ^ last_)); }
  void refill() {
    size_t i = 1;
    while (buckets_[i].empty()) ++i;
    uint64_t m = UINT64_MAX;
    for (const Item& it : buckets_[i]) m = std::min(m, it.k);
    last_ = m;
    for (const Item& it : buckets_[i]) buckets_[bucket(it.k)].push_back(it);
    buckets_[i].clear();
  }
  std::array<std::vector<Item>, 65> buckets_;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> low_;
  uint64_t last_ = 0;
  size_t size_ = 0;
};

}  // namespace loom::sim
