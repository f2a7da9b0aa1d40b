// cma_probe: what one cross-process copy of S bytes costs when the owner of
// the source has just written it ("dirty") or left it alone since the last
// read ("clean"), by process_vm_readv (the single copy Loom and the MPIs use
// between processes) and by memcpy out of shared memory (the FIFO's second
// copy).
//
// Process A (core 0) owns the source; process B (core 1) copies it, once per
// round, after A's turn: A rewrites the source (dirty) or does nothing
// (clean), then hands over. B's copy alone is timed. The nccl-tests loop is
// the clean case (its input never changes); a training step is the dirty one.
// The gap is why LOOM_SHM_SINGLE_COPY_PLAIN_BYTES defaults to 256 KiB
// (performance.md Run 11).
//
// Usage: cma_probe [--sizes 16K,64K,256K,1M] [--rounds N]
// Output: CSV size,source,method,us,gbps (source clean|dirty, method
// readv|shm); readv rows are absent where process_vm_readv is not permitted.
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "core/config.h"

namespace {

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))), &set);
  sched_setaffinity(0, sizeof set, &set);  // best effort
}

struct Shared {
  std::atomic<long> turn{0};  // 2k+1: B's turn in round k; 2k+2: A's
  std::atomic<int> failed{0};
  double us = 0;              // B's result
  uint64_t src_addr = 0;
  int src_pid = 0;
};

// One measurement: `rounds` copies of n bytes, the source rewritten by A
// before each (dirty) or not (clean). Returns B's mean microseconds per copy.
double measure(size_t n, bool dirty, bool readv, int rounds, std::byte* priv, std::byte* shm, Shared* sh) {
  new (sh) Shared();
  sh->src_addr = reinterpret_cast<uint64_t>(priv);
  sh->src_pid = getpid();
  std::byte* src = readv ? priv : shm;
  std::memset(src, 1, n);
  // The child must not inherit unwritten stdout (a pipe is fully buffered):
  // whatever flushes it there prints the rows again (seen under TSan).
  fflush(stdout);
  pid_t b = fork();
  if (b < 0) return -1;
  if (b == 0) {
    pin(1);
    auto* dst = static_cast<std::byte*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096));
    std::memset(dst, 0, n);
    double total = 0;
    for (int i = 0; i < rounds; ++i) {
      while (sh->turn.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      auto t0 = std::chrono::steady_clock::now();
      if (readv) {
        iovec here{dst, n}, there{reinterpret_cast<void*>(sh->src_addr), n};
        if (process_vm_readv(sh->src_pid, &here, 1, &there, 1, 0) != static_cast<ssize_t>(n)) sh->failed.store(1);
      } else {
        std::memcpy(dst, shm, n);
        asm volatile("" ::: "memory");
      }
      total += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      sh->turn.store(2 * i + 2, std::memory_order_release);
    }
    sh->us = total / rounds;
    std::free(dst);
    _exit(0);
  }
  prctl(PR_SET_PTRACER, b, 0, 0, 0);  // Yama: let the child read us
  pin(0);
  for (int i = 0; i < rounds; ++i) {
    if (dirty) std::memset(src, 0x30 + (i & 7), n);
    sh->turn.store(2 * i + 1, std::memory_order_release);
    while (sh->turn.load(std::memory_order_acquire) != 2 * i + 2) {
    }
  }
  waitpid(b, nullptr, 0);
  return sh->failed.load() ? -1 : sh->us;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> sizes = {16 << 10, 64 << 10, 256 << 10, 1 << 20};
  int rounds = 2000;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--sizes" && i + 1 < argc) {
      if (!loom::parse_bytes_list(argv[++i], &sizes) || sizes.empty()) {
        fprintf(stderr, "cma_probe: bad size list '%s'\n", argv[i]);
        return 2;
      }
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = atoi(argv[++i]);
      if (rounds < 1) {
        fprintf(stderr, "cma_probe: --rounds must be at least 1\n");
        return 2;
      }
    } else {
      fprintf(stderr, "usage: cma_probe [--sizes 16K,64K,256K,1M] [--rounds N]\n");
      return a == "-h" || a == "--help" ? 0 : 2;
    }
  }
  size_t largest = 4096;
  for (size_t s : sizes) largest = std::max(largest, (s + 4095) / 4096 * 4096);
  auto* priv = static_cast<std::byte*>(std::aligned_alloc(4096, largest));
  auto* shm = static_cast<std::byte*>(mmap(nullptr, largest, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  auto* sh = static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (!priv || shm == MAP_FAILED || sh == MAP_FAILED) {
    fprintf(stderr, "cma_probe: cannot allocate %zu bytes\n", largest);
    return 1;
  }
  printf("size,source,method,us,gbps\n");
  for (size_t s : sizes) {
    if (s == 0) continue;
    for (bool dirty : {false, true}) {
      for (bool readv : {true, false}) {
        double us = measure(s, dirty, readv, rounds, priv, shm, sh);
        if (us <= 0) continue;  // process_vm_readv refused
        printf("%zu,%s,%s,%.3f,%.3f\n", s, dirty ? "dirty" : "clean", readv ? "readv" : "shm", us,
               static_cast<double>(s) / us / 1e3);
        fflush(stdout);
      }
    }
  }
  std::free(priv);
  munmap(shm, largest);
  munmap(sh, sizeof(Shared));
  return 0;
}
