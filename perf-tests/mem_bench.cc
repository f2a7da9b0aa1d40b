// mem_bench: the machine's memcpy and 2-input reduction bandwidth, and the
// memory model of a 2-rank shared-memory allreduce built from them.
//
// Model (issue 6): each of the 2 ranks reduces half of the vector (reads its
// half and the peer's half, writes the result), then copies the peer's
// reduced half. For S bytes: t(S) = t_reduce(S/2) + t_memcpy(S/2); the
// ranks work in parallel, so algbw = S / t(S), and busbw = algbw for 2 ranks
// (nccl-tests' factor 2(n-1)/n = 1). No implementation moves less memory.
//
// Usage: mem_bench [--sizes 8,4K,...] [--min-time SECONDS]
// Output: CSV on stdout: size,memcpy_gbps,reduce_gbps,model_busbw_gbps
// (decimal GB/s of bytes written; best of 5 batches of >= min-time each).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/config.h"
#include "kernels/host_reduce.h"

namespace {

using Clock = std::chrono::steady_clock;

// Seconds per call of fn, best of `batches` batches of at least min_time.
template <typename Fn>
double best_seconds(Fn fn, double min_time, int batches = 5) {
  double best = 1e30;
  for (int b = 0; b < batches; ++b) {
    long reps = 0;
    auto t0 = Clock::now();
    double el = 0;
    do {
      fn();
      ++reps;
      el = std::chrono::duration<double>(Clock::now() - t0).count();
    } while (el < min_time);
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

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> sizes = {8, 4096, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20};
  double min_time = 0.02;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::string list = argv[++i];
      size_t pos = 0;
      while (pos <= list.size()) {
        size_t comma = list.find(',', pos);
        std::string item = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        uint64_t v;
        if (!loom::parse_bytes(item, &v)) {
          fprintf(stderr, "mem_bench: bad size '%s'\n", item.c_str());
          return 2;
        }
        sizes.push_back(v);
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else if (a == "--min-time" && i + 1 < argc) {
      min_time = atof(argv[++i]);
    } else {
      fprintf(stderr, "usage: mem_bench [--sizes 8,4K,1M,...] [--min-time SECONDS]\n");
      return a == "-h" || a == "--help" ? 0 : 2;
    }
  }
  size_t largest = *std::max_element(sizes.begin(), sizes.end());
  size_t half_max = std::max<size_t>(largest / 2, 4);
  std::byte* a = touched(half_max);
  std::byte* b = touched(half_max);
  std::byte* dst = touched(half_max);
  printf("size,memcpy_gbps,reduce_gbps,model_busbw_gbps\n");
  for (size_t s : sizes) {
    // Half of the vector, in whole floats (at least one).
    size_t half = std::max<size_t>(s / 2 / 4, 1) * 4;
    double t_copy = best_seconds([&] { std::memcpy(dst, a, half); asm volatile("" ::: "memory"); }, min_time);
    double t_red = best_seconds(
        [&] {
          loom::kernels::reduce2(dst, a, b, half / 4, loom::DataType::kFloat32, loom::RedOp::kSum);
          asm volatile("" ::: "memory");
        },
        min_time);
    double copy_gbps = half / t_copy / 1e9, red_gbps = half / t_red / 1e9;
    double model = static_cast<double>(s) / (t_copy + t_red) / 1e9;
    printf("%zu,%.3f,%.3f,%.3f\n", s, copy_gbps, red_gbps, model);
    fflush(stdout);
  }
  free(a);
  free(b);
  free(dst);
  return 0;
}
