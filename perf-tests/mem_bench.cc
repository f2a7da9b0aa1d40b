// mem_bench: the machine's memcpy and 2-input reduction bandwidth, and the
// memory model of a 2-rank shared-memory allreduce built from them.
//
// Model (issue 6): each of the 2 ranks reduces half of the vector (reads its
// half and the peer's half, writes the result), then copies the peer's
// reduced half. For S bytes: t(S) = t_reduce(S/2) + t_memcpy(S/2); the
// ranks work in parallel, so algbw = S / t(S), and busbw = algbw for 2 ranks
// (nccl-tests' factor 2(n-1)/n = 1). No implementation moves less memory.
//
// xcopy: the rate of a copy between two address spaces (process_vm_readv,
// the single copy every shared-memory library here uses for large messages)
// while both cores copy at once, as they do in every symmetric collective: two
// processes each read S bytes of the other's memory, started together, and
// the slower one's rate is reported. No user buffer can be read in place by
// another process, so a byte that must reach another rank's private buffer
// costs at least one such copy (or two memcpys through shared memory).
// compare.sh builds its copy bound from these rates (performance.md). Like
// the other columns, a row of size S measures S/2 bytes: what each rank of a
// 2-rank collective moves.
//
// c2c: the rate of a copy out of memory another core has just written (the
// second copy of a message through shared memory, or any read of a peer's
// fresh data): both processes write S/2 bytes into their own shared buffer,
// meet at a barrier, then each copies the other's buffer into private memory;
// only that copy is timed, and the slower process's rate is reported. The
// lines come from the writer's cache (or memory), not the reader's own: here
// 1 MiB reads at about 35 GB/s against memcpy's 72 in one core's cache.
//
// Footprint: a collective touches more memory per call than one copy does
// (a 2-rank out-of-place allreduce of S bytes: a send and a receive buffer of
// S in each process, 2 S per core), and the rates fall once that leaves a
// cache (here memcpy of 32 MiB: 12.3 GB/s reusing one buffer pair, 6.4 GB/s
// cycling through two, the 2 S per core of a 64 MiB allreduce). --footprints F1,F2,... measures every size again for
// each factor F > 0: each kind's calls cycle through as many buffer sets as
// fit in F x S bytes per core (memcpy S per set, reduce 1.5 S, xcopy S in
// each of its two processes), at least one; never more than F x S, so the
// rates are not taken from a larger working set than the one asked for.
// These rows run memcpy and reduce in two processes at once, each on its own
// sets, as the cores of a collective work at once and share the last-level
// cache and the memory bus (one core alone cycling 128 MiB still finds part
// of it in the shared cache). F = 0 (the default) reuses one set on one
// core. Each array stays within kPoolCap bytes (fewer sets beyond that).
//
// --latency instead measures the core-to-core round trip: two threads pinned to
// the first two CPUs this process may run on pass a counter back and forth
// through two cache lines (each waits for the other's store, then answers),
// the exchange under every small message between two ranks. Its time says
// which phase a shared host is in (here 8 B allreduce latencies move about 2x
// with it); compare.sh records it at the start and end of a run.
// Output: cpus,round_trip_min_ns,round_trip_median_ns (of 9 batches; "nan"
// with fewer than two CPUs).
//
// Usage: mem_bench [--sizes 8,4K,...] [--min-time SECONDS] [--footprints 0,4]
//        mem_bench --latency
// Output: CSV on stdout: size,memcpy_gbps,reduce_gbps,model_busbw_gbps,xcopy_gbps,footprint,c2c_gbps
// (decimal GB/s of bytes written; best of 5 batches of >= min-time each;
// xcopy is "nan" where process_vm_readv is not permitted; footprint: the
// factor F of the row, 0 = one buffer set; c2c is "nan" without a second
// process).
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/config.h"
#include "kernels/host_reduce.h"

namespace {

using Clock = std::chrono::steady_clock;

// Seconds per call of fn, best of 5 batches of at least min_time;
// before_batch runs ahead of each batch (untimed).
// fn(k) runs call number k of the batch; a batch makes at least min_reps
// calls (a full cycle through the buffer sets).
template <typename Fn, typename Before = void (*)()>
double best_seconds(Fn fn, double min_time, Before before_batch = [] {}, long min_reps = 1) {
  double best = 1e30;
  for (int b = 0; b < 5; ++b) {
    before_batch();
    long reps = 0;
    auto t0 = Clock::now();
    double el = 0;
    do {
      fn(reps);
      ++reps;
      el = std::chrono::duration<double>(Clock::now() - t0).count();
    } while (el < min_time || reps < min_reps);
    best = std::min(best, el / static_cast<double>(reps));
  }
  return best;
}

std::byte* touched(size_t bytes) {
  size_t n = std::max<size_t>((bytes + 4095) / 4096 * 4096, 4096);
  auto* p = static_cast<std::byte*>(std::aligned_alloc(4096, n));
  if (!p) {
    fprintf(stderr, "mem_bench: cannot allocate %zu bytes\n", n);
    exit(1);
  }
  std::memset(p, 0, n);  // zero floats: the reduction stays finite
  return p;
}

// Two processes (this one and a forked child) that copy from each other's
// memory at the same moment. Shared control block: a sense-reversing barrier
// and the sizes/results of each round.
enum Kind { kXcopy, kMemcpy, kReduce, kC2c };

struct XCtl {
  std::atomic<int> arrived{0};
  std::atomic<int> sense{0};
  std::atomic<int> quit{0};
  int kind = kXcopy;  // what the round measures, in both processes at once
  size_t bytes = 0;
  int sets = 1;  // buffer sets each process cycles through (footprint)
  double min_time = 0;
  std::atomic<int> more{0};  // kC2c: process 0 says whether the batch goes on
  double seconds[2] = {0, 0};  // per process, best batch, seconds per copy
  int failed[2] = {0, 0};
};

void barrier(XCtl* c, int* local_sense) {
  *local_sense = 1 - *local_sense;
  if (c->arrived.fetch_add(1) == 1) {
    c->arrived.store(0);
    c->sense.store(*local_sense);
  } else {
    while (c->sense.load() != *local_sense) sched_yield();
  }
}

// The buffers of one process (the same addresses in both: fork; each
// process's own pages once written).
struct Bufs {
  std::byte *a, *b, *dst;  // memcpy dst <- a; reduce dst <- a + b
  std::byte *xsrc, *xdst;  // xcopy: the peer reads our xsrc into its xdst
  std::byte* shared[2];    // c2c: process i writes shared[i] (MAP_SHARED, both see both)
};

// Call k of a memcpy or reduce measurement, on set k mod sets (sets lie n
// bytes apart): dst <- a, or dst <- a + b (floats).
void local_call(int kind, const Bufs& m, size_t n, long sets, long k) {
  const size_t o = static_cast<size_t>(k % sets) * n;
  if (kind == kMemcpy) std::memcpy(m.dst + o, m.a + o, n);
  else loom::kernels::reduce2(m.dst + o, m.a + o, m.b + o, n / 4, loom::DataType::kFloat32, loom::RedOp::kSum);
  asm volatile("" ::: "memory");
}

// One round, in both processes at once, call k on set k mod sets (sets lie n
// bytes apart); each batch of best_seconds starts together on both sides.
// kXcopy: read n bytes of the peer's xsrc into our xdst (after a failure the
// batches still pass the barrier, copying nothing); kMemcpy / kReduce: each
// process on its own buffers, so every core works at once, as in a
// collective, and shares the caches and memory as it does.
// kC2c: call k writes our shared set k (untimed), meets the peer, copies the
// peer's shared set k into our dst (timed), meets it again (the next write
// must not overwrite what the peer still reads). Both sides make the same
// number of calls: process 0 decides when a batch ends.
double c2c_seconds(XCtl* c, int me, const Bufs& m, int* sense) {
  const long sets = c->sets;
  const size_t n = c->bytes;
  double best = 1e30;
  for (int b = 0; b < 5; ++b) {
    barrier(c, sense);
    const auto start = Clock::now();
    double timed = 0;
    long reps = 0;
    for (;;) {
      const size_t o = static_cast<size_t>(reps % sets) * n;
      std::memcpy(m.shared[me] + o, m.a + o, n);
      barrier(c, sense);
      const auto t0 = Clock::now();
      std::memcpy(m.dst + o, m.shared[1 - me] + o, n);
      asm volatile("" ::: "memory");
      timed += std::chrono::duration<double>(Clock::now() - t0).count();
      ++reps;
      if (me == 0)
        c->more.store(std::chrono::duration<double>(Clock::now() - start).count() < c->min_time || reps < sets);
      barrier(c, sense);
      if (!c->more.load()) break;
    }
    best = std::min(best, timed / static_cast<double>(reps));
  }
  return best;
}

void round(XCtl* c, int me, pid_t peer, const Bufs& m, int* sense) {
  const int sets = c->sets;
  const size_t n = c->bytes;
  if (c->kind == kC2c) {
    c->seconds[me] = c2c_seconds(c, me, m, sense);
    barrier(c, sense);  // both results are in
    return;
  }
  auto at = [&](std::byte* base, long k) { return base + static_cast<size_t>(k % sets) * n; };
  if (c->kind == kXcopy) std::memset(m.xsrc, me + 1, n * static_cast<size_t>(sets));  // written after the fork
  c->seconds[me] = best_seconds(
      [&](long k) {
        if (c->kind != kXcopy) return local_call(c->kind, m, n, sets, k);
        if (c->failed[me]) return;
        iovec here{at(m.xdst, k), n}, there{at(m.xsrc, k), n};
        if (process_vm_readv(peer, &here, 1, &there, 1, 0) != static_cast<ssize_t>(n)) c->failed[me] = 1;
      },
      c->min_time, [&] { barrier(c, sense); }, sets);
  barrier(c, sense);  // both results are in
}

// The child: rounds until told to quit.
// a_bytes / b_bytes / dst_bytes: the arrays' sizes. The child writes them
// all first: after fork() they are the parent's pages (copy-on-write), and
// the footprint rows, "every core on its own sets", would otherwise read one
// physical source from both processes (the shared cache and DRAM saw it once).
void child_main(XCtl* c, const Bufs& m, size_t a_bytes, size_t b_bytes, size_t dst_bytes) {
  std::memset(m.a, 0, a_bytes);
  std::memset(m.b, 0, b_bytes);
  std::memset(m.dst, 0, dst_bytes);
  int sense = 0;
  for (;;) {
    barrier(c, &sense);  // a round (or quit) was posted
    if (c->quit.load()) return;
    round(c, 1, getppid(), m, &sense);
  }
}

}  // namespace

// Bytes one buffer array may take (sets x half); beyond it, fewer sets.
constexpr size_t kPoolCap = size_t{1} << 30;

// The core-to-core round trip (--latency): see the top of the file.
bool pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

int latency_main() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0)
    for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c)
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  printf("cpus,round_trip_min_ns,round_trip_median_ns\n");
  if (cpus.size() < 2) {
    printf("-,nan,nan\n");
    return 0;
  }
  struct alignas(64) Line {
    std::atomic<long> v{0};
  };
  static Line ping, pong;  // one cache line each: each side writes only its own
  constexpr long kTrips = 20000;
  constexpr int kBatches = 9;
  const long total = kTrips * (kBatches + 1);  // the first batch warms up
  std::thread partner([&] {
    pin_to(cpus[1]);
    for (long i = 1; i <= total; ++i) {
      while (ping.v.load(std::memory_order_acquire) != i) {
      }
      pong.v.store(i, std::memory_order_release);
    }
  });
  if (!pin_to(cpus[0])) fprintf(stderr, "mem_bench: cannot pin to CPU %d; the round trip may be within one\n", cpus[0]);
  std::vector<double> ns;
  long i = 0;
  for (int b = 0; b <= kBatches; ++b) {
    const auto t0 = Clock::now();
    for (long k = 0; k < kTrips; ++k) {
      ++i;
      ping.v.store(i, std::memory_order_release);
      while (pong.v.load(std::memory_order_acquire) != i) {
      }
    }
    const double el = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
    if (b > 0) ns.push_back(el / kTrips);
  }
  partner.join();
  std::sort(ns.begin(), ns.end());
  printf("%d-%d,%.1f,%.1f\n", cpus[0], cpus[1], ns.front(), ns[ns.size() / 2]);
  return 0;
}

// Buffer sets of `per_set` bytes that fit in factor x size bytes (at least
// one), within the pool cap for arrays of `half` bytes per set; factor 0: one.
long sets_for(double factor, size_t size, size_t per_set, size_t half) {
  if (factor <= 0) return 1;
  long want = static_cast<long>(std::floor(factor * static_cast<double>(size) / static_cast<double>(per_set) + 1e-9));
  long cap = static_cast<long>(kPoolCap / std::max<size_t>(half, 1));
  return std::clamp(want, 1L, std::max(cap, 1L));
}

int main(int argc, char** argv) {
  std::vector<size_t> sizes = {8, 4096, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20};
  std::vector<double> footprints = {0};
  double min_time = 0.02;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--sizes" && i + 1 < argc) {
      if (!loom::parse_bytes_list(argv[++i], &sizes)) {
        fprintf(stderr, "mem_bench: bad size list '%s'\n", argv[i]);
        return 2;
      }
    } else if (a == "--latency") {
      return latency_main();
    } else if (a == "--min-time" && i + 1 < argc) {
      min_time = atof(argv[++i]);
    } else if (a == "--footprints" && i + 1 < argc) {
      footprints.clear();
      std::string list = argv[++i];
      for (size_t pos = 0; pos <= list.size();) {
        size_t comma = std::min(list.find(',', pos), list.size());
        char* end = nullptr;
        std::string item = list.substr(pos, comma - pos);
        double f = std::strtod(item.c_str(), &end);
        if (item.empty() || *end != '\0' || !(f >= 0) || f > 1024) {
          fprintf(stderr, "mem_bench: bad footprint list '%s' (factors 0-1024, comma separated)\n", list.c_str());
          return 2;
        }
        footprints.push_back(f);
        pos = comma + 1;
      }
    } else {
      fprintf(stderr, "usage: mem_bench [--sizes 8,4K,1M,...] [--min-time SECONDS] [--footprints 0,4,...] | --latency\n");
      return a == "-h" || a == "--help" ? 0 : 2;
    }
  }
  // Arrays of the largest half times the most sets any row asks for.
  size_t half_max = 4, copy_pool = 4, red_pool = 4, x_pool = 4;
  for (size_t s : sizes) {
    const size_t half = std::max<size_t>(s / 2 / 4, 1) * 4;
    half_max = std::max(half_max, half);
    for (double f : footprints) {
      copy_pool = std::max(copy_pool, half * static_cast<size_t>(sets_for(f, s, 2 * half, half)));
      red_pool = std::max(red_pool, half * static_cast<size_t>(sets_for(f, s, 3 * half, half)));
      x_pool = std::max(x_pool, half * static_cast<size_t>(sets_for(f, s, 2 * half, half)));
    }
  }
  const size_t a_bytes = std::max(copy_pool, red_pool), b_bytes = red_pool, dst_bytes = std::max(copy_pool, red_pool);
  std::byte* a = touched(a_bytes);
  std::byte* b = touched(b_bytes);
  std::byte* dst = touched(dst_bytes);
  // The cross-process copy: a child shares the control block; both keep
  // buffers of the largest half times its sets (the child's are its own
  // copy-on-write pages, rewritten before each round).
  std::byte* xsrc = touched(x_pool);
  std::byte* xdst = touched(x_pool);
  auto* ctl = static_cast<XCtl*>(mmap(nullptr, sizeof(XCtl), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  // c2c: one shared array per process, as large as the cross-process pool.
  const size_t shared_bytes = (x_pool + 4095) / 4096 * 4096;
  void* shared = mmap(nullptr, 2 * shared_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  std::byte* sh[2] = {nullptr, nullptr};
  if (shared != MAP_FAILED) {
    sh[0] = static_cast<std::byte*>(shared);
    sh[1] = sh[0] + shared_bytes;
    std::memset(sh[0], 0, 2 * shared_bytes);  // fault every page in before the fork
  }
  pid_t child = -1;
  if (ctl != MAP_FAILED) {
    new (ctl) XCtl();
    ctl->min_time = min_time;
    child = fork();
    if (child == 0) {
      child_main(ctl, Bufs{a, b, dst, xsrc, xdst, {sh[0], sh[1]}}, a_bytes, b_bytes, dst_bytes);
      _exit(0);
    }
    // Yama (ptrace_scope 1) lets a parent read its child but not the reverse
    // unless the parent names it.
    if (child > 0) prctl(PR_SET_PTRACER, child, 0, 0, 0);
  }
  int xsense = 0;
  // Both processes at once: the slower one's seconds per call (NaN without a
  // child, or when process_vm_readv failed).
  const Bufs mine{a, b, dst, xsrc, xdst, {sh[0], sh[1]}};
  auto both_seconds = [&](int kind, size_t n, long sets) {
    if (child <= 0 || (kind == kC2c && !sh[0])) return std::nan("");
    ctl->kind = kind;
    ctl->bytes = n;
    ctl->sets = static_cast<int>(sets);
    barrier(ctl, &xsense);
    round(ctl, 0, child, mine, &xsense);
    if (kind == kXcopy && (ctl->failed[0] || ctl->failed[1])) return std::nan("");
    return std::max(ctl->seconds[0], ctl->seconds[1]);
  };
  printf("size,memcpy_gbps,reduce_gbps,model_busbw_gbps,xcopy_gbps,footprint,c2c_gbps\n");
  for (double f : footprints) {
    for (size_t s : sizes) {
      // Half of the vector, in whole floats (at least one).
      const size_t half = std::max<size_t>(s / 2 / 4, 1) * 4;
      const long cs = sets_for(f, s, 2 * half, half), rs = sets_for(f, s, 3 * half, half),
                 xs = sets_for(f, s, 2 * half, half);
      double t_copy = 0, t_red = 0;
      if (f > 0 && child > 0) {  // (a failed fork leaves these rows one-core)
        // Footprint rows: every core at once, each on its own sets.
        t_copy = both_seconds(kMemcpy, half, cs);
        t_red = both_seconds(kReduce, half, rs);
      } else {
        t_copy = best_seconds([&](long k) { local_call(kMemcpy, mine, half, 1, k); }, min_time);
        t_red = best_seconds([&](long k) { local_call(kReduce, mine, half, 1, k); }, min_time);
      }
      double copy_gbps = half / t_copy / 1e9, red_gbps = half / t_red / 1e9;
      double model = static_cast<double>(s) / (t_copy + t_red) / 1e9;
      const double xt = both_seconds(kXcopy, half, xs);  // the same half, like the other columns
      const double x = std::isnan(xt) ? xt : half / xt / 1e9;
      const double ct = both_seconds(kC2c, half, xs);  // the same sets as xcopy: S/2 shared + S/2 private
      const double cc = std::isnan(ct) ? ct : half / ct / 1e9;
      printf("%zu,%.3f,%.3f,%.3f,%.3f,%g,%.3f\n", s, copy_gbps, red_gbps, model, x, f, cc);
      fflush(stdout);
    }
  }
  if (child > 0) {
    ctl->quit.store(1);
    barrier(ctl, &xsense);
    waitpid(child, nullptr, 0);
  }
  free(a);
  free(b);
  free(dst);
  free(xsrc);
  free(xdst);
  if (sh[0]) munmap(sh[0], 2 * shared_bytes);
  return 0;
}
