// hang_demo --case NAME: injects one hang or failure so loom-doctor can be
// seen at work. Run under loomrun with LOOM_DUMP_DIR (and a short
// LOOM_TIMEOUT), then `loom-doctor analyze $LOOM_DUMP_DIR`; or, for the live
// cases, `loom-doctor status` while it runs. Every case first runs a few good
// allreduces so the recorder has history.
//
//   case              ranks  what happens
//   missing-rank      4      ranks 0,1 allreduce on comm {0,1,2}; rank 2 calls an op on comm {2,3} instead
//   coll-mismatch     >=2    the last rank calls broadcast(root=1) where the others call allreduce
//   arg-mismatch      >=2    the last rank calls allreduce with half the count
//   sendrecv-peer     3      rank 0 sends to 1, rank 1 receives from 2, rank 2 receives from 1
//   sendrecv-size     2      rank 0 sends 1024 floats, rank 1 receives 512
//   rank-died         >=2    the last rank is killed (SIGKILL) before op #5
//   straggler         >=2    the last rank sleeps --lag-ms before every allreduce (runs --seconds)
//   user-code         >=2    the last rank never calls op #5 (sleeps in "user code")
//   p2p-deadlock      2      both ranks send 4 MiB to each other, then receive (no group)
//   cross-comm        2      rank 0 allreduce on 'world', rank 1 on its split
//
// hang_demo --bench-overhead [BATCHES] [ITERS] (no loomrun) measures what the
// flight recorder and the fingerprints cost on 8-byte allreduce.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm.h"

namespace {

using loom::Comm;
using loom::DataType;
using loom::RedOp;
using loom::Status;

int g_lag_ms = 100;
double g_seconds = 12;

Status done(loom::Result<loom::Work> w) { return w.is_ok() ? w->wait() : w.status(); }

Status allreduce(Comm& c, std::vector<float>& buf, size_t count) {
  return done(c.allreduce(buf.data(), buf.data(), count, DataType::kFloat32, RedOp::kSum));
}

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

int fail(const char* what, const Status& st) {
  fprintf(stderr, "hang_demo: %s: %s\n", what, st.to_string().c_str());
  return 1;
}

int run(const std::string& c, Comm& world) {
  const int r = world.rank(), n = world.size(), last = n - 1;
  std::vector<float> buf(1 << 20, 1.0f);
  // A rank "in user code" sleeps well past everyone's deadline; loomrun ends it.
  const double long_sleep = 120;
  for (int i = 0; i < 5; ++i)
    if (Status st = allreduce(world, buf, 4096); !st.is_ok()) return fail("warm-up", st);

  if (c == "coll-mismatch") {
    Status st = r == last ? done(world.broadcast(buf.data(), buf.data(), 4096, DataType::kFloat32, 1))
                          : allreduce(world, buf, 4096);
    return st.is_ok() ? 0 : fail(c.c_str(), st);
  }
  if (c == "arg-mismatch") {
    Status st = allreduce(world, buf, r == last ? 2048 : 4096);
    return st.is_ok() ? 0 : fail(c.c_str(), st);
  }
  if (c == "rank-died") {
    if (r == last) raise(SIGKILL);
    Status st = allreduce(world, buf, 1 << 20);
    return st.is_ok() ? 0 : fail(c.c_str(), st);
  }
  if (c == "user-code") {
    if (r == last) {
      fprintf(stderr, "hang_demo: rank %d: stuck in user code\n", r);
      sleep_s(long_sleep);
      return 0;
    }
    Status st = allreduce(world, buf, 4096);
    return st.is_ok() ? 0 : fail(c.c_str(), st);
  }
  if (c == "straggler") {
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(g_seconds);
    while (std::chrono::steady_clock::now() < end) {
      if (r == last) std::this_thread::sleep_for(std::chrono::milliseconds(g_lag_ms));
      if (Status st = allreduce(world, buf, 4096); !st.is_ok()) return fail(c.c_str(), st);
    }
    return 0;
  }
  if (c == "sendrecv-peer") {
    if (n != 3) return fail(c.c_str(), loom::invalid_argument("needs 3 ranks"));
    const size_t big = 4 << 20;  // larger than a FIFO: a blocking send waits for its receiver
    std::vector<float> b(big);
    Status st;
    if (r == 0) st = done(world.send(b.data(), big, DataType::kFloat32, 1));
    if (r == 1) st = done(world.recv(b.data(), big, DataType::kFloat32, 2));
    if (r == 2) st = done(world.recv(b.data(), big, DataType::kFloat32, 1));
    return st.is_ok() ? 0 : fail(c.c_str(), st);
  }
  if (c == "sendrecv-size") {
    Status st;
    if (r == 0) st = done(world.send(buf.data(), 1024, DataType::kFloat32, 1));
    if (r == 1) st = done(world.recv(buf.data(), 512, DataType::kFloat32, 0));
    if (r == 0 && st.is_ok()) {
      // The small send fit in the FIFO; the failure reaches rank 0 as an async error.
      sleep_s(long_sleep);
    }
    return st.is_ok() ? 0 : fail(c.c_str(), st);
  }
  if (c == "p2p-deadlock") {
    const size_t big = 4 << 20;
    std::vector<float> s(big), d(big);
    const int peer = 1 - r;
    Status st = done(world.send(s.data(), big, DataType::kFloat32, peer));
    if (st.is_ok()) st = done(world.recv(d.data(), big, DataType::kFloat32, peer));
    return st.is_ok() ? 0 : fail(c.c_str(), st);
  }
  if (c == "cross-comm") {
    auto split = world.split(0, r);
    if (!split.is_ok()) return fail("split", split.status());
    Status st = r == 0 ? allreduce(world, buf, 4096) : allreduce(**split, buf, 4096);
    return st.is_ok() ? 0 : fail(c.c_str(), st);
  }
  if (c == "missing-rank") {
    if (n != 4) return fail(c.c_str(), loom::invalid_argument("needs 4 ranks"));
    auto front = world.split(r < 3 ? 1 : -1, r);  // ranks {0,1,2}
    auto back = world.split(r >= 2 ? 2 : -1, r);  // ranks {2,3}
    if (!front.is_ok() || !back.is_ok()) return fail("split", front.is_ok() ? back.status() : front.status());
    Status st;
    if (r < 2) st = allreduce(**front, buf, 4096);
    if (r == 2) st = allreduce(**back, buf, 4096);  // should have joined 'front' first
    if (r == 3) sleep_s(long_sleep);
    return st.is_ok() ? 0 : fail(c.c_str(), st);
  }
  if (c == "ok") return 0;
  fprintf(stderr, "hang_demo: unknown case '%s'\n", c.c_str());
  return 2;
}

// --bench-overhead: 2 ranks as threads; 8-byte allreduce latency with the
// flight recorder + fingerprints on and off, interleaved in batches (the
// minimum batch filters a busy machine's noise).
int bench_overhead(int batches, int iters) {
  struct Mode {
    const char* name;
    const char* fingerprint;
    const char* trace;
  };
  const Mode modes[] = {{"recorder + fingerprints:", "1", "1024"},
                        {"fingerprints only:", "1", "0"},
                        {"recorder only:", "0", "1024"},
                        {"neither:", "0", "0"}};
  constexpr int kModes = 4;
  std::vector<std::unique_ptr<Comm>> comms[kModes];
  for (int m = 0; m < kModes; ++m) {
    setenv("LOOM_FINGERPRINT", modes[m].fingerprint, 1);
    setenv("LOOM_TRACE_BUFFER_SIZE", modes[m].trace, 1);
    setenv("LOOM_DIAG_ADDR", "off", 1);
    auto c = Comm::init_all(2);
    if (!c.is_ok()) return fail("init_all", c.status());
    comms[m] = std::move(c).value();
  }
  std::vector<double> us[kModes];
  auto body = [&](int r) {
    float x[2] = {1, 2};
    for (int b = 0; b < batches; ++b)
      for (int m = 0; m < kModes; ++m) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i)
          if (!done(comms[m][r]->allreduce(x, x, 2, DataType::kFloat32, RedOp::kSum)).is_ok()) return;
        double t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
        if (r == 0) us[m].push_back(t);
      }
  };
  std::thread t1(body, 1);
  body(0);
  t1.join();
  const double base = *std::min_element(us[kModes - 1].begin(), us[kModes - 1].end());
  printf("8-byte allreduce, 2 ranks as threads, %d interleaved batches of %d (min and median batch mean):\n", batches,
         iters);
  for (int m = 0; m < kModes; ++m) {
    auto v = us[m];
    std::sort(v.begin(), v.end());
    printf("  %-26s min %.3f us  median %.3f us  (%+.1f%% vs neither, by min)\n", modes[m].name, v.front(),
           v[v.size() / 2], 100.0 * (v.front() - base) / base);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string c;
  if (argc >= 2 && !strcmp(argv[1], "--bench-overhead")) {
    // Whole positive numbers (regression: 0 or "abc" batches read an empty
    // vector's minimum: a segfault; 0 iterations divided by zero).
    auto count = [](const char* s, long* out) {
      char* end = nullptr;
      long v = strtol(s, &end, 10);
      if (end == s || *end != '\0' || v < 1 || v > 100000000) return false;
      *out = v;
      return true;
    };
    long batches = 30, iters = 2000;
    if ((argc >= 3 && !count(argv[2], &batches)) || (argc >= 4 && !count(argv[3], &iters)) || argc > 4) {
      fprintf(stderr, "usage: hang_demo --bench-overhead [BATCHES [ITERATIONS]]   (whole numbers >= 1)\n");
      return 2;
    }
    return bench_overhead(static_cast<int>(batches), static_cast<int>(iters));
  }
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--case") && i + 1 < argc) c = argv[++i];
    else if (!strcmp(argv[i], "--lag-ms") && i + 1 < argc) g_lag_ms = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) g_seconds = atof(argv[++i]);
    else {
      fprintf(stderr,
              "usage: hang_demo --case NAME [--lag-ms MS] [--seconds S]   (run under loomrun; see the file's header)\n");
      return 2;
    }
  }
  auto comm = Comm::init_from_env();
  if (!comm.is_ok()) return fail("init", comm.status());
  int rc = run(c, **comm);
  fprintf(stderr, "hang_demo: rank %d done (%d)\n", (*comm)->rank(), rc);
  // A failed communicator is abandoned, not destroyed: destroy() would wait
  // for its queue.
  return rc;
}
