// gloo_bench: the perf suite's sweep over Gloo's TCP transport (libgloo-dev),
// for compare.sh. Every Gloo algorithm that implements the collective is
// timed and printed; compare.sh takes the best per size.
//
// usage: loomrun -n N gloo_bench -c allreduce|reduce_scatter|all_gather|broadcast
//            -d STORE_DIR [-s 8,4K,1M] [-n iters] [-w warmup]
// Rank and size come from LOOM_RANK/LOOM_WORLD_SIZE (loomrun) or RANK/WORLD_SIZE;
// GLOO_BENCH_ADDR sets the address Gloo binds (default 127.0.0.1).
// Rendezvous: gloo's FileStore in STORE_DIR (an empty directory per run).
// Output (rank 0): CSV impl,coll,nranks,size,count,time_us,algbw,busbw,wrong,
// impl = "gloo:<algorithm>". Float sum, nccl-tests' size column and busbw
// factors; the data is zero while timing (so in-place algorithms stay
// finite) and rank+1 for the one verification run per size.
#include <gloo/allgather.h>
#include <gloo/allgather_ring.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

int env_int(const char* a, const char* b) {
  const char* v = std::getenv(a);
  if (!v) v = std::getenv(b);
  return v ? std::atoi(v) : -1;
}

size_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  switch (*end) {
    case 'k': case 'K': v *= 1024; ++end; break;
    case 'm': case 'M': v *= 1024 * 1024; ++end; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; ++end; break;
    default: break;
  }
  if (*end == 'B') ++end;
  if (end == s.c_str() || *end != '\0' || v < 0) {
    fprintf(stderr, "gloo_bench: bad size '%s'\n", s.c_str());
    exit(2);
  }
  return static_cast<size_t>(v);
}

// One algorithm, prepared for one size: run() performs one collective.
struct Prepared {
  std::string name;
  std::function<void()> run;
};

struct Bufs {
  std::vector<float> send, recv;
};

using Ctx = std::shared_ptr<gloo::Context>;

void sum_fn(void* c, const void* a, const void* b, size_t n) {
  gloo::sum<float>(c, a, b, n);
}

std::vector<Prepared> prepare(const std::string& coll, const Ctx& ctx, Bufs& b, size_t count) {
  std::vector<Prepared> out;
  const int n = ctx->size;
  float* s = b.send.data();
  float* r = b.recv.data();
  if (coll == "allreduce") {
    for (auto algo : {gloo::AllreduceOptions::Algorithm::RING, gloo::AllreduceOptions::Algorithm::BCUBE}) {
      out.push_back({algo == gloo::AllreduceOptions::Algorithm::RING ? "ring" : "bcube", [=] {
                       gloo::AllreduceOptions opts(ctx);
                       opts.setAlgorithm(algo);
                       opts.setInput(s, count);
                       opts.setOutput(r, count);
                       opts.setReduceFunction(&sum_fn);
                       gloo::allreduce(opts);
                     }});
    }
    // The classic algorithms reduce in place (the receive buffer).
    auto chunked = std::make_shared<gloo::AllreduceRingChunked<float>>(ctx, std::vector<float*>{r}, int(count));
    out.push_back({"ring_chunked", [chunked] { chunked->run(); }});
    auto hd = std::make_shared<gloo::AllreduceHalvingDoubling<float>>(ctx, std::vector<float*>{r}, int(count));
    out.push_back({"halving_doubling", [hd] { hd->run(); }});
  } else if (coll == "reduce_scatter") {
    // In place on the full send vector. Gloo's distribution phase copies this
    // rank's reduced block to the *start* of the vector (offset 0), not to
    // the rank's offset (gloo/reduce_scatter.h, run(): bufferOffset from 0).
    std::vector<int> recv_elems(n, int(count));
    auto rs = std::make_shared<gloo::ReduceScatterHalvingDoubling<float>>(ctx, std::vector<float*>{s},
                                                                          int(count) * n, recv_elems);
    out.push_back({"halving_doubling", [rs] { rs->run(); }});
  } else if (coll == "all_gather") {
    out.push_back({"allgather", [=] {
                     gloo::AllgatherOptions opts(ctx);
                     opts.setInput(s, count);
                     opts.setOutput(r, count * n);
                     gloo::allgather(opts);
                   }});
    auto ring = std::make_shared<gloo::AllgatherRing<float>>(ctx, std::vector<const float*>{s}, r, int(count));
    out.push_back({"ring", [ring] { ring->run(); }});
  } else if (coll == "broadcast") {
    out.push_back({"broadcast", [=] {
                     gloo::BroadcastOptions opts(ctx);
                     opts.setRoot(0);
                     opts.setOutput(r, count);
                     gloo::broadcast(opts);
                   }});
    auto o2a = std::make_shared<gloo::BroadcastOneToAll<float>>(ctx, std::vector<float*>{r}, count, 0, 0);
    out.push_back({"one_to_all", [o2a] { o2a->run(); }});
  }
  return out;
}

// Wrong elements after one run with rank r contributing r+1 everywhere.
long long check(const std::string& coll, const std::string& algo, const Ctx& ctx, Bufs& b, size_t count,
                const std::function<void()>& run) {
  const int n = ctx->size, me = ctx->rank;
  // Every rank must be done with the timed runs (whose sends may still read
  // the buffers) before they are refilled.
  gloo::BarrierOptions before(ctx);
  gloo::barrier(before);
  std::fill(b.send.begin(), b.send.end(), float(me + 1));
  std::fill(b.recv.begin(), b.recv.end(), -1.0f);
  const bool in_place_ar = coll == "allreduce" && (algo == "ring_chunked" || algo == "halving_doubling");
  if (in_place_ar) std::fill(b.recv.begin(), b.recv.begin() + count, float(me + 1));
  if (coll == "broadcast" && me == 0) std::fill(b.recv.begin(), b.recv.begin() + count, 1.0f);
  // ... and every rank must have refilled before anyone starts the checked
  // run: the classic algorithms (AllgatherRing, ...) register the buffers
  // once, so a fast neighbour's first send lands in ours at once and a
  // refill still under way here would overwrite it (the wrong rows of
  // gloo:ring all_gather at 4 and 8 ranks until session 41).
  gloo::BarrierOptions filled(ctx);
  gloo::barrier(filled);
  run();
  long long wrong = 0;
  const float total = float(n * (n + 1) / 2);
  if (coll == "allreduce") {
    for (size_t i = 0; i < count; ++i) wrong += b.recv[i] != total;
  } else if (coll == "reduce_scatter") {
    for (size_t i = 0; i < count; ++i) wrong += b.send[i] != total;  // at offset 0, see prepare()
  } else if (coll == "all_gather") {
    for (size_t i = 0; i < count * n; ++i) wrong += b.recv[i] != float(i / count + 1);
  } else {
    for (size_t i = 0; i < count; ++i) wrong += b.recv[i] != 1.0f;
  }
  gloo::BarrierOptions after(ctx);
  gloo::barrier(after);
  std::fill(b.send.begin(), b.send.end(), 0.0f);
  std::fill(b.recv.begin(), b.recv.end(), 0.0f);
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  std::string coll, store_dir, sizes_arg = "8,4K,64K,1M,4M,16M,64M,256M";
  int iters = 20, warmup = 5, opt;
  while ((opt = getopt(argc, argv, "c:d:s:n:w:")) != -1) {
    switch (opt) {
      case 'c': coll = optarg; break;
      case 'd': store_dir = optarg; break;
      case 's': sizes_arg = optarg; break;
      case 'n': iters = std::atoi(optarg); break;
      case 'w': warmup = std::atoi(optarg); break;
      default: coll.clear(); break;
    }
  }
  const int rank = env_int("LOOM_RANK", "RANK"), n = env_int("LOOM_WORLD_SIZE", "WORLD_SIZE");
  if ((coll != "allreduce" && coll != "reduce_scatter" && coll != "all_gather" && coll != "broadcast") ||
      store_dir.empty() || rank < 0 || n < 1 || iters < 1) {
    fprintf(stderr,
            "usage: loomrun -n N gloo_bench -c allreduce|reduce_scatter|all_gather|broadcast -d STORE_DIR "
            "[-s LIST] [-n N] [-w N]\n");
    return 2;
  }
  std::vector<size_t> sizes;
  size_t pos = 0;
  while (pos <= sizes_arg.size()) {
    size_t comma = sizes_arg.find(',', pos);
    sizes.push_back(parse_size(sizes_arg.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos)));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }

  // GLOO_BENCH_ADDR: the address to bind and advertise (net_compare.sh runs
  // ranks in network namespaces, where loopback does not reach the peers).
  const char* bind_addr = std::getenv("GLOO_BENCH_ADDR");
  gloo::transport::tcp::attr attr(bind_addr && *bind_addr ? bind_addr : "127.0.0.1");
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
  ctx->setTimeout(std::chrono::seconds(600));
  gloo::rendezvous::FileStore store(store_dir);
  ctx->connectFullMesh(store, dev);

  size_t max_bytes = 0;
  for (size_t s : sizes) max_bytes = std::max(max_bytes, s);
  Bufs b;
  b.send.assign(max_bytes / 4 + 16, 0.0f);
  b.recv.assign(max_bytes / 4 + 16, 0.0f);
  if (rank == 0) printf("impl,coll,nranks,size,count,time_us,algbw,busbw,wrong\n");
  for (size_t bytes : sizes) {
    // The per-rank block as nccl-tests (and Loom's *_perf) cut it: a
    // multiple of 16 bytes, so every library's row of a size moves the same bytes.
    const size_t total = bytes / 4, per = (total / size_t(n)) & ~size_t(3);
    const bool whole = coll == "allreduce" || coll == "broadcast";
    const size_t count = whole ? total : per;
    const size_t size_col = whole ? total * 4 : per * n * 4;
    const double factor = coll == "allreduce" ? 2.0 * (n - 1) / n : coll == "broadcast" ? 1.0 : double(n - 1) / n;
    if (count == 0) continue;
    for (auto& p : prepare(coll, ctx, b, count)) {
      for (int i = 0; i < warmup; ++i) p.run();
      // Start the clocks together, as Loom's and the MPI benchmarks do: a
      // rank still in its warm-up would otherwise add its lag to the others'.
      gloo::BarrierOptions start(ctx);
      gloo::barrier(start);
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) p.run();
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
      long long wrong = check(coll, p.name, ctx, b, count, p.run);
      // Average time and total wrong over ranks with Gloo itself.
      double stats[2] = {us, double(wrong)};
      gloo::AllreduceOptions opts(ctx);
      opts.setOutput(stats, 2);
      opts.setReduceFunction([](void* c, const void* x, const void* y, size_t k) { gloo::sum<double>(c, x, y, k); });
      gloo::allreduce(opts);
      us = stats[0] / n;
      const double algbw = size_col / (us * 1e3);
      if (rank == 0)
        printf("gloo:%s,%s,%d,%zu,%zu,%.3f,%.4f,%.4f,%.0f\n", p.name.c_str(), coll.c_str(), n, size_col, count, us,
               algbw, algbw * factor, stats[1]);
      fflush(stdout);
    }
  }
  return 0;
}
