// Helper threads of a rank (the communicator's engine, the diagnostics
// hub's watchdog and query server) share the rank's core when ranks are
// pinned. A new thread starts on its creator's core and, left alone, first
// runs whenever the kernel next preempts the creator: a scheduler trace of a
// 2-rank all_reduce_perf showed the engine's first run inside the first timed
// loop (performance.md Run 47; the rest of those first calls' slowness was
// the flight recorder's clock, Run 48). start_thread_asleep returns once the
// new thread has run up to its first sleep.
#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <utility>

namespace loom {

// The calling thread's kernel thread id.
long current_thread_id();

// Yields the calling thread's core until thread `tid` of this process is off
// the run queue (/proc/self/task/TID/stat says so), at most 100 times; returns
// at once where /proc cannot be read.
void yield_until_asleep(long tid);

// Waits (yielding, up to 1 s) until `slot` holds a thread id; returns it, or
// 0 if it never came.
long wait_for_thread_id(const std::atomic<long>& slot);

// Starts `fn` on a new thread and returns it once that thread has run up to
// its first sleep (fn should block soon: wait on a condition, sleep, poll).
// `tid`, if given, receives the thread's kernel id (0 if it did not start
// within a second).
template <class Fn>
std::thread start_thread_asleep(Fn fn, long* tid = nullptr) {
  auto slot = std::make_shared<std::atomic<long>>(0);
  std::thread t([slot, fn = std::move(fn)]() mutable {
    slot->store(current_thread_id(), std::memory_order_release);
    fn();
  });
  const long id = wait_for_thread_id(*slot);
  if (id != 0) yield_until_asleep(id);
  if (tid) *tid = id;
  return t;
}

}  // namespace loom
