// The shim's staged device-buffer path and topology discovery against the
// real CUDA runtime and a real GPU: two ranks as threads on device 0, device
// buffers from cudaMalloc, stream order through cudaMemsetAsync /
// cudaMemcpyAsync on the caller's stream. Skipped (with the loader's reason)
// where no runtime sees a device. Nothing links CUDA: the runtime is opened
// with dlopen, like src/cuda/cuda_loader.cc does. Also prints (does not
// assert) staged allreduce bus bandwidth for the record.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_loader.h"
#include "cuda/gpu_info.h"
#include "nccl.h"
#include "topology/discover.h"

namespace {

using loom::cuda::CudaLoader;

constexpr int kRanks = 2;
constexpr int kD2D = 3, kH2D = 1, kD2H = 2;  // cudaMemcpyKind
constexpr unsigned kCudaStreamNonBlocking = 1;

// The runtime functions the test itself needs, from the library the shim uses.
struct Rt {
  void* lib = nullptr;
  int (*set_device)(int) = nullptr;
  int (*malloc_dev)(void**, size_t) = nullptr;
  int (*free_dev)(void*) = nullptr;
  int (*memset_async)(void*, int, size_t, cudaStream_t) = nullptr;
  int (*memcpy)(void*, const void*, size_t, int) = nullptr;
  int (*memcpy_async)(void*, const void*, size_t, int, cudaStream_t) = nullptr;
  int (*stream_create)(cudaStream_t*, unsigned) = nullptr;  // cudaStreamCreateWithFlags
  int (*stream_sync)(cudaStream_t) = nullptr;
  int (*stream_destroy)(cudaStream_t) = nullptr;
  int (*device_count)(int*) = nullptr;
  int (*pci_bus_id)(char*, int, int) = nullptr;
  int (*attribute)(int*, int, int) = nullptr;
  std::string why;  // empty when usable

  Rt() {
    const CudaLoader& loader = CudaLoader::get();
    if (loader.runtime() == nullptr) {
      why = "no usable CUDA runtime / GPU: " + loader.runtime_status();
      return;
    }
    std::vector<std::string> names;
    if (const char* p = std::getenv("LOOM_CUDART_LIBRARY"); p != nullptr && *p != '\0') names = {p};
    else names = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
    for (const auto& n : names)
      if ((lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    if (lib == nullptr) {
      why = "cannot dlopen the CUDA runtime";
      return;
    }
    bool ok = true;
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (fn == nullptr) {
        ok = false;
        why += std::string(why.empty() ? "missing " : ", ") + name;
      }
    };
    get(set_device, "cudaSetDevice");
    get(malloc_dev, "cudaMalloc");
    get(free_dev, "cudaFree");
    get(memset_async, "cudaMemsetAsync");
    get(memcpy, "cudaMemcpy");
    get(memcpy_async, "cudaMemcpyAsync");
    get(stream_create, "cudaStreamCreateWithFlags");
    get(stream_sync, "cudaStreamSynchronize");
    get(stream_destroy, "cudaStreamDestroy");
    get(device_count, "cudaGetDeviceCount");
    get(pci_bus_id, "cudaDeviceGetPCIBusId");
    get(attribute, "cudaDeviceGetAttribute");
    if (ok && !loader.runtime()->can_stage()) why = "the runtime cannot stage device buffers";
  }
  bool usable() const { return why.empty(); }
};

Rt& rt() {
  static Rt r;
  return r;
}

#define SKIP_WITHOUT_GPU() \
  if (!rt().usable()) GTEST_SKIP() << rt().why

// Runs body(rank, comm, stream) on kRanks threads, one communicator each on device 0.
void with_ranks(const std::function<void(int, ncclComm_t, cudaStream_t)>& body) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> ts;
  for (int r = 0; r < kRanks; ++r)
    ts.emplace_back([&, r] {
      ASSERT_EQ(rt().set_device(0), 0);
      ncclComm_t c = nullptr;
      ASSERT_EQ(ncclCommInitRank(&c, kRanks, id, r), ncclSuccess) << ncclGetLastError(nullptr);
      cudaStream_t s = nullptr;
      // Non-blocking: the ranks are threads sharing one device, and the
      // legacy default stream (cudaMemcpy in Dev::read) waits for every
      // blocking stream of the device, so a rank reading its result would
      // wait for a peer's next collective, which waits for this rank.
      ASSERT_EQ(rt().stream_create(&s, kCudaStreamNonBlocking), 0);
      body(r, c, s);
      EXPECT_EQ(rt().stream_sync(s), 0);
      // A stream-ordered op that failed (a timeout) shows here even where
      // the data it left happens to be right.
      ncclResult_t async = ncclInternalError;
      EXPECT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
      EXPECT_EQ(async, ncclSuccess) << "rank " << r << ": " << ncclGetLastError(c);
      EXPECT_EQ(rt().stream_destroy(s), 0);
      EXPECT_EQ(ncclCommDestroy(c), ncclSuccess) << ncclGetLastError(c);
    });
  for (auto& t : ts) t.join();
}

struct Dev {
  void* p = nullptr;
  size_t bytes;
  explicit Dev(size_t b) : bytes(b) { EXPECT_EQ(rt().malloc_dev(&p, b), 0); }
  ~Dev() { (void)rt().free_dev(p); }
  int* i() const { return static_cast<int*>(p); }
  std::vector<int> read() const {
    std::vector<int> h(bytes / sizeof(int));
    EXPECT_EQ(rt().memcpy(h.data(), p, bytes, kD2H), 0);
    return h;
  }
  void write(const std::vector<int>& h) { EXPECT_EQ(rt().memcpy(p, h.data(), h.size() * sizeof(int), kH2D), 0); }
};

// cudaMemsetAsync(byte b) makes every int32 b * 0x01010101.
constexpr int pattern(int byte) { return byte * 0x01010101; }

TEST(CudaReal, AllReduceIsOrderedOnTheStream) {
  SKIP_WITHOUT_GPU();
  const size_t n = 1 << 20;
  with_ranks([&](int r, ncclComm_t c, cudaStream_t s) {
    Dev send(n * 4), recv(n * 4), after(n * 4);
    send.write(std::vector<int>(n, -1));  // stale until the memset on the stream
    ASSERT_EQ(rt().memset_async(send.p, r + 1, n * 4, s), 0);
    ASSERT_EQ(ncclAllReduce(send.p, recv.p, n, ncclInt32, ncclSum, c, s), ncclSuccess) << ncclGetLastError(c);
    ASSERT_EQ(rt().memcpy_async(after.p, recv.p, n * 4, kD2D, s), 0);
    ASSERT_EQ(rt().stream_sync(s), 0);
    std::vector<int> h = after.read();
    EXPECT_EQ(h[0], pattern(1) + pattern(2));
    EXPECT_EQ(h[n - 1], pattern(1) + pattern(2));
    // In place, twice in a row without a sync in between.
    ASSERT_EQ(ncclAllReduce(recv.p, recv.p, n, ncclInt32, ncclSum, c, s), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(recv.p, recv.p, n, ncclInt32, ncclSum, c, s), ncclSuccess);
    ASSERT_EQ(rt().stream_sync(s), 0);
    h = recv.read();
    EXPECT_EQ(h[n / 2], 4 * (pattern(1) + pattern(2)));
  });
}

// ncclMemAlloc returns device memory, as NVIDIA's does: CUDA writes it, a
// collective runs on it, ncclMemFree gives it back to cudaFree.
TEST(CudaReal, MemAllocIsDeviceMemory) {
  SKIP_WITHOUT_GPU();
  const size_t n = 1 << 18;
  with_ranks([&](int r, ncclComm_t c, cudaStream_t s) {
    void* p = nullptr;
    ASSERT_EQ(ncclMemAlloc(&p, n * 4), ncclSuccess) << ncclGetLastError(nullptr);
    loom::cuda::CudaPointerAttributes a;
    ASSERT_EQ(CudaLoader::get().runtime()->pointer_get_attributes(&a, p), 0);
    EXPECT_EQ(a.type, loom::cuda::CudaMemoryType::kDevice);
    ASSERT_EQ(rt().memset_async(p, r + 1, n * 4, s), 0);
    ASSERT_EQ(ncclAllReduce(p, p, n, ncclInt32, ncclSum, c, s), ncclSuccess) << ncclGetLastError(c);
    ASSERT_EQ(rt().stream_sync(s), 0);
    std::vector<int> h(n);
    ASSERT_EQ(rt().memcpy(h.data(), p, n * 4, kD2H), 0);
    EXPECT_EQ(h[0], pattern(1) + pattern(2));
    EXPECT_EQ(h[n - 1], pattern(1) + pattern(2));
    EXPECT_EQ(ncclMemFree(p), ncclSuccess) << ncclGetLastError(nullptr);
  });
}

TEST(CudaReal, AllGatherReduceScatterBroadcast) {
  SKIP_WITHOUT_GPU();
  const size_t n = 100000;
  with_ranks([&](int r, ncclComm_t c, cudaStream_t s) {
    Dev small(n * 4), big(n * 4 * kRanks);
    ASSERT_EQ(rt().memset_async(small.p, 10 + r, n * 4, s), 0);
    ASSERT_EQ(ncclAllGather(small.p, big.p, n, ncclInt32, c, s), ncclSuccess) << ncclGetLastError(c);
    ASSERT_EQ(rt().stream_sync(s), 0);
    std::vector<int> h = big.read();
    for (int b = 0; b < kRanks; ++b) {
      EXPECT_EQ(h[b * n], pattern(10 + b)) << "block " << b;
      EXPECT_EQ(h[b * n + n - 1], pattern(10 + b)) << "block " << b;
    }
    // ReduceScatter of the gathered data: block r summed over ranks.
    ASSERT_EQ(ncclReduceScatter(big.p, small.p, n, ncclInt32, ncclSum, c, s), ncclSuccess);
    ASSERT_EQ(rt().stream_sync(s), 0);
    h = small.read();
    EXPECT_EQ(h[0], kRanks * pattern(10 + r));
    EXPECT_EQ(h[n - 1], kRanks * pattern(10 + r));
    // Broadcast from rank 1, in place.
    ASSERT_EQ(rt().memset_async(small.p, 30 + r, n * 4, s), 0);
    ASSERT_EQ(ncclBroadcast(small.p, small.p, n, ncclInt32, 1, c, s), ncclSuccess);
    ASSERT_EQ(rt().stream_sync(s), 0);
    h = small.read();
    EXPECT_EQ(h[0], pattern(31));
    EXPECT_EQ(h[n - 1], pattern(31));
  });
}

TEST(CudaReal, SendRecvInAGroup) {
  SKIP_WITHOUT_GPU();
  const size_t n = 65536;
  with_ranks([&](int r, ncclComm_t c, cudaStream_t s) {
    Dev send(n * 4), recv(n * 4);
    ASSERT_EQ(rt().memset_async(send.p, 50 + r, n * 4, s), 0);
    const int peer = 1 - r;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclSend(send.p, n, ncclInt32, peer, c, s), ncclSuccess);
    ASSERT_EQ(ncclRecv(recv.p, n, ncclInt32, peer, c, s), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(c);
    ASSERT_EQ(rt().stream_sync(s), 0);
    std::vector<int> h = recv.read();
    EXPECT_EQ(h[0], pattern(50 + peer));
    EXPECT_EQ(h[n - 1], pattern(50 + peer));
  });
}

TEST(CudaReal, TopologyMatchesTheRuntime) {
  SKIP_WITHOUT_GPU();
  int count = 0;
  ASSERT_EQ(rt().device_count(&count), 0);
  loom::topo::DiscoverOptions opt;
  opt.cuda = &CudaLoader::get();
  auto r = loom::topo::discover_topology(opt);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const auto& g = r.value().graph;
  if (CudaLoader::get().nvml() == nullptr) GTEST_SKIP() << "no NVML: " << CudaLoader::get().nvml_status();
  ASSERT_EQ(g.count(loom::topo::NodeType::kGpu), count);
  for (int id : g.nodes_of(loom::topo::NodeType::kGpu)) {
    const auto& node = g.nodes[static_cast<size_t>(id)];
    ASSERT_GE(node.index, 0);
    char bus[64] = {};
    ASSERT_EQ(rt().pci_bus_id(bus, sizeof bus, node.index), 0);
    EXPECT_EQ(node.busid, loom::cuda::normalize_gpu_busid(bus)) << "device " << node.index;
    int major = 0, minor = 0;
    ASSERT_EQ(rt().attribute(&major, loom::cuda::kCudaDevAttrComputeCapabilityMajor, node.index), 0);
    ASSERT_EQ(rt().attribute(&minor, loom::cuda::kCudaDevAttrComputeCapabilityMinor, node.index), 0);
    EXPECT_EQ(node.sm, major * 10 + minor) << "device " << node.index;
    std::printf("GPU %d %s sm%d\n", node.index, node.busid.c_str(), node.sm);
  }
}

// Seconds per call of `one(i)` with `iters` calls queued on `s`, after a
// warm-up as deep as the timed queue (staging once took a pinned buffer per
// call in flight; the pool's growth is not what is timed).
double seconds_per_call(int iters, cudaStream_t s, const std::function<void(int)>& one) {
  for (int i = 0; i < iters; ++i) one(i);
  EXPECT_EQ(rt().stream_sync(s), 0);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) one(i);
  EXPECT_EQ(rt().stream_sync(s), 0);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

// Not a check: staged allreduce bus bandwidth (2 (p-1)/p * bytes / time),
// beside what its parts cost alone on the same ranks and stream, to see where
// staging's time goes:
//   copies      device -> pinned host and back (both ranks at once)
//   host op     the allreduce on one pinned host buffer (no staging)
//   host op x N the same, rotating over as many pinned buffers as calls in
//               flight (the staging pool holds one buffer per call in flight)
//   by hand     what staging does, written by the caller: copy out, the
//               allreduce on a pinned buffer, copy in, all on the stream
//   staged sync staged, the stream synchronized after every call
TEST(CudaReal, PrintStagedAllReduceBusBandwidth) {
  SKIP_WITHOUT_GPU();
  const auto& lrt = *CudaLoader::get().runtime();
  enum { kStaged, kCopies, kHost, kHostRot, kByHand, kStagedSync, kCases };
  const char* names[kCases] = {"staged", "copies", "host op", "host op xN", "by hand", "staged sync"};
  for (size_t bytes : {size_t{1} << 20, size_t{16} << 20, size_t{256} << 20}) {
    const int iters = bytes >= (size_t{256} << 20) ? 5 : 20;
    double secs[kCases][kRanks] = {};
    with_ranks([&](int r, ncclComm_t c, cudaStream_t s) {
      Dev buf(bytes);
      std::vector<void*> pinned(static_cast<size_t>(iters));
      for (void*& p : pinned) {
        ASSERT_EQ(lrt.malloc_host(&p, bytes), 0);
        std::memset(p, 0, bytes);
      }
      ASSERT_EQ(rt().memset_async(buf.p, 0, bytes, s), 0);
      const size_t n = bytes / 4;
      auto timed = [&](int which, const std::function<void(int)>& one) {
        secs[which][r] = seconds_per_call(iters, s, one);
      };
      auto allreduce = [&](void* p) { ASSERT_EQ(ncclAllReduce(p, p, n, ncclFloat32, ncclSum, c, s), ncclSuccess); };
      timed(kStaged, [&](int) { allreduce(buf.p); });
      timed(kCopies, [&](int) {
        ASSERT_EQ(rt().memcpy_async(pinned[0], buf.p, bytes, kD2H, s), 0);
        ASSERT_EQ(rt().memcpy_async(buf.p, pinned[0], bytes, kH2D, s), 0);
      });
      timed(kHost, [&](int) { allreduce(pinned[0]); });
      timed(kHostRot, [&](int i) { allreduce(pinned[static_cast<size_t>(i)]); });
      timed(kByHand, [&](int i) {
        void* h = pinned[static_cast<size_t>(i)];
        ASSERT_EQ(rt().memcpy_async(h, buf.p, bytes, kD2H, s), 0);
        allreduce(h);
        ASSERT_EQ(rt().memcpy_async(buf.p, h, bytes, kH2D, s), 0);
      });
      timed(kStagedSync, [&](int) {
        allreduce(buf.p);
        ASSERT_EQ(rt().stream_sync(s), 0);
      });
      ASSERT_EQ(rt().stream_sync(s), 0);
      for (void* p : pinned) EXPECT_EQ(lrt.free_host(p), 0);
    });
    double t[kCases];
    for (int k = 0; k < kCases; ++k) t[k] = std::max(secs[k][0], secs[k][1]);
    const double busbw = 2.0 * (kRanks - 1) / kRanks * static_cast<double>(bytes) / t[kStaged] / 1e9;
    std::printf("staged allreduce, 2 ranks, %zu MiB: %.3f ms, busbw %.2f GB/s | ms:", bytes >> 20, t[kStaged] * 1e3,
                busbw);
    for (int k = 1; k < kCases; ++k) std::printf(" %s %.3f%s", names[k], t[k] * 1e3, k + 1 < kCases ? "," : "\n");
  }
}

// Not a check: what a stream-ordered call costs where the data is small
// (microseconds per call, calls queued): an empty host function (CUDA's own
// dispatch, two per staged call), the allreduce on a pinned host buffer
// ordered on the stream (no copies), staged, and staged with the stream
// synchronised after each call. LOOM_ENGINE_SPIN_US makes the threads that
// wait for an op's start and end poll before they sleep.
TEST(CudaReal, PrintStreamOrderedLatency) {
  SKIP_WITHOUT_GPU();
  const auto& lrt = *CudaLoader::get().runtime();
  enum { kHostFn, kHostOp, kStaged, kStagedSync, kCases };
  for (size_t bytes : {size_t{8}, size_t{64} << 10, size_t{1} << 20}) {
    const int iters = bytes >= (size_t{1} << 20) ? 50 : 200;
    double secs[kCases][kRanks] = {};
    with_ranks([&](int r, ncclComm_t c, cudaStream_t s) {
      Dev buf(bytes);
      void* pinned = nullptr;
      ASSERT_EQ(lrt.malloc_host(&pinned, bytes), 0);
      std::memset(pinned, 0, bytes);
      ASSERT_EQ(rt().memset_async(buf.p, 0, bytes, s), 0);
      const size_t n = bytes / 4;
      auto allreduce = [&](void* p) { ASSERT_EQ(ncclAllReduce(p, p, n, ncclFloat32, ncclSum, c, s), ncclSuccess); };
      secs[kHostFn][r] = seconds_per_call(iters, s, [&](int) {
        ASSERT_EQ(lrt.launch_host_func(reinterpret_cast<loom::cuda::CudaStream>(s), [](void*) {}, nullptr), 0);
      });
      secs[kHostOp][r] = seconds_per_call(iters, s, [&](int) { allreduce(pinned); });
      secs[kStaged][r] = seconds_per_call(iters, s, [&](int) { allreduce(buf.p); });
      secs[kStagedSync][r] = seconds_per_call(iters, s, [&](int) {
        allreduce(buf.p);
        ASSERT_EQ(rt().stream_sync(s), 0);
      });
      EXPECT_EQ(lrt.free_host(pinned), 0);
    });
    double t[kCases];
    for (int k = 0; k < kCases; ++k) t[k] = std::max(secs[k][0], secs[k][1]) * 1e6;
    std::printf("stream-ordered allreduce, 2 ranks, %zu B: us per call: empty host function %.1f, host op on pinned "
                "%.1f, staged %.1f, staged sync %.1f\n",
                bytes, t[kHostFn], t[kHostOp], t[kStaged], t[kStagedSync]);
  }
}

}  // namespace
