#pragma once

// How a rank writes memory that ranks on other cores read next: ordinary
// (cached) stores or streaming (non-temporal) stores, chosen from the rate
// the writer's own cached copies reach. One per shm connection for its FIFO
// steps (shm_connection.cc), one per executor for the copies into scratch that
// peers read through a mapping (a staged broadcast or all_gather block).
//
// A FIFO line the sender writes was last read by the receiver, so the store
// has to take it back from the receiver's cache first. When the two cores
// share a last-level cache that is a cache hit and cached stores win (the
// receiver then reads the bytes from that cache too). When they do not (two
// sockets, two dies, or a VM whose vCPUs the host moves apart), every line
// costs a cross-die round trip the core waits for, and a 256 KiB step that
// takes 10 us runs for 100. Streaming stores do not fetch the line.
// Measured on the reference VM, whose vCPUs sit on one L3 in one phase and
// apart in another (core-to-core round trip 96 ns / 486 ns; performance.md
// Run 43), 2-rank allreduce, us out of place / in place, cached -> streaming:
// apart 1 MiB 489-571 / 476-518 -> 95-102 / 92-97, 4 MiB 2014-2158 /
// 1955-2077 -> 377-394 / 316-335, 16 MiB 6221-7200 / 7950-8382 -> 2180-2555 /
// 1476-1649; together 1 MiB 62-65 / 57-59 -> 119-120 / 112-115, 4 MiB
// 288-300 / 198 -> 475-520 / 426-479. The cached copies' rate separates the
// two: together 25-27 GB/s (99% of 256 KiB steps above 8 GB/s), apart 2.4
// GB/s (99% below 4 GB/s).
//
// So: cached until kSlowSteps timed steps in a row run below kSlowGBps, then
// streaming. While streaming, a probe copies kProbeSteps steps cached and
// goes back to cached stores if the last of them runs at kSlowGBps or more.
// Not the first: the first cached step after streaming ones measured fast
// even between far cores (11-14 GB/s, the following ones 2-3), and a probe
// judged on it, or on the first 64 KiB of one, switched back every time.
// Steps are timed from 16 KiB: a 64 KiB allreduce (32 KiB steps) ran
// 33-35 us cached between far cores, 10-11 streaming (Open MPI 45).
// The first probe kFirstProbeNs after the switch, then at intervals doubling
// to kMaxProbeNs while the probes find the peer far. A false switch (the
// first-touch page faults of a new buffer make a few copies slow) so costs
// about a millisecond of streaming; a probe of a far peer ~0.3 ms, one in
// 64 ms once settled (0.5%).

#include <cstddef>
#include <cstdint>

namespace loom {

class SharedStores {
 public:
  enum class Policy { kAuto, kCached, kStreaming };

  // Steps from this size are timed, probed and may stream; smaller ones
  // (small messages, whose copies are too short to time) stay cached.
  static constexpr size_t kMeasureBytes = 16 << 10;
  static constexpr double kSlowGBps = 6.0;
  static constexpr int kSlowSteps = 3;
  static constexpr int kProbeSteps = 3;
  static constexpr int64_t kFirstProbeNs = 1'000'000;
  static constexpr int64_t kMaxProbeNs = 64'000'000;

  explicit SharedStores(Policy p = Policy::kAuto) : policy_(p) {}

  // Whether the sender reads the clock around this step (auto policy, a
  // step worth timing, or a probe that may be due).
  bool timed(size_t n) const { return policy_ == Policy::kAuto && n >= kMeasureBytes; }

  // How many leading bytes of an n-byte step go through cached stores; the
  // rest stream. now_ns: the clock at the step's start (read when timed(n)).
  size_t cached_bytes(size_t n, int64_t now_ns) {
    switch (policy_) {
      case Policy::kCached: return n;
      case Policy::kStreaming: return n < kMeasureBytes ? n : 0;
      case Policy::kAuto: break;
    }
    if (!streaming_ || n < kMeasureBytes) return n;
    if (probe_left_ > 0 || now_ns >= next_probe_ns_) {
      if (probe_left_ == 0) probe_left_ = kProbeSteps;
      return n;
    }
    return 0;
  }

  // After a timed step: its cached part's bytes and copy time. Measurements
  // of steps that were not timed(n) are ignored, as are streamed ones.
  void record(size_t cached, int64_t copy_ns, int64_t now_ns) {
    if (policy_ != Policy::kAuto || cached < kMeasureBytes) return;
    const bool slow = static_cast<double>(cached) < kSlowGBps * static_cast<double>(copy_ns);  // bytes/ns = GB/s
    last_gbps_ = copy_ns > 0 ? static_cast<double>(cached) / static_cast<double>(copy_ns) : 0;
    if (streaming_) {
      if (probe_left_ == 0 || --probe_left_ > 0) return;
      ++probes_;
      if (slow) {
        probe_gap_ns_ = probe_gap_ns_ * 2 > kMaxProbeNs ? kMaxProbeNs : probe_gap_ns_ * 2;
        next_probe_ns_ = now_ns + probe_gap_ns_;
      } else {
        streaming_ = false;
        slow_run_ = 0;
        ++switches_;
      }
      return;
    }
    slow_run_ = slow ? slow_run_ + 1 : 0;
    if (slow_run_ >= kSlowSteps) {
      streaming_ = true;
      probe_gap_ns_ = kFirstProbeNs;
      next_probe_ns_ = now_ns + probe_gap_ns_;
      ++switches_;
    }
  }

  // Copies n bytes in pieces of at most `piece` bytes, each by the stores
  // chosen for it (cached_bytes), timing the cached ones (record). Returns
  // how many pieces streamed (in part).
  size_t copy(std::byte* dst, const std::byte* src, size_t n, size_t piece);

  // The policy LOOM_SHM_STREAM_STORES asks for.
  static Policy configured();

  bool streaming() const { return policy_ == Policy::kStreaming || (policy_ == Policy::kAuto && streaming_); }
  double last_gbps() const { return last_gbps_; }
  uint64_t switches() const { return switches_; }
  uint64_t probes() const { return probes_; }

 private:
  Policy policy_;
  bool streaming_ = false;
  int probe_left_ = 0;  // cached steps left of the probe under way
  int slow_run_ = 0;
  int64_t next_probe_ns_ = 0;
  int64_t probe_gap_ns_ = kFirstProbeNs;
  double last_gbps_ = 0;
  uint64_t switches_ = 0;
  uint64_t probes_ = 0;
};

}  // namespace loom
