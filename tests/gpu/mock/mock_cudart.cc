// A mock libcudart.so with the functions Loom resolves (src/cuda/cuda_loader.cc)
// plus what tests need to drive it: streams that really run their work in
// order on a worker thread each, "device" allocations, and
// loom_mock_stream_enqueue_copy to put a delayed memory copy on a stream,
// cudaMemcpyAsync / cudaMallocHost / cudaFreeHost (with allocation counters)
// and cuStreamWaitValue32_v2 for the shim's staging of device buffers: those
// only in the build with LOOM_MOCK_STAGING (loom_mock_cudart_staging); the
// plain build is a runtime without them.
// The device list is that of LOOM_MOCK_GPUS (mock_gpus.h).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "cuda/cuda_loader.h"
#include "mock_gpus.h"

using loom::cuda::CudaError;
using loom::cuda::CudaHostFn;
using loom::cuda::CudaMemoryType;
using loom::cuda::CudaPointerAttributes;
using loom::cuda::CudaStream;

namespace {

constexpr CudaError kInvalidValue = 1;
constexpr CudaError kInvalidDevice = 101;
constexpr CudaError kNoDevice = 100;

const loom::mock::MockMachine& machine() {
  static loom::mock::MockMachine m = loom::mock::mock_machine();
  return m;
}

// One stream: a FIFO of tasks run by its own thread, in order.
class MockStream {
 public:
  // blocking: created by cudaStreamCreate (or WithFlags without
  // cudaStreamNonBlocking), so the legacy default stream's work waits for it.
  explicit MockStream(bool blocking = true) : blocking_(blocking), worker_([this] { run(); }) {}
  bool blocking() const { return blocking_; }
  ~MockStream() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void enqueue(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      tasks_.push_back(std::move(task));
      ++enqueued_;
    }
    cv_.notify_all();
  }
  void synchronize() {
    std::unique_lock<std::mutex> lk(mu_);
    const uint64_t target = enqueued_;
    cv_.wait(lk, [&] { return finished_ >= target; });
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stop_ and drained
      std::function<void()> t = std::move(tasks_.front());
      tasks_.pop_front();
      lk.unlock();
      t();
      lk.lock();
      ++finished_;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  uint64_t enqueued_ = 0, finished_ = 0;
  bool stop_ = false;
  const bool blocking_;
  std::thread worker_;
};

std::mutex g_mu;
// Held shared by cudaMemcpy while it waits for other threads' streams, and
// exclusively by cudaStreamDestroy before it deletes one.
std::shared_mutex g_destroy_mu;
std::map<CudaStream, MockStream*>& streams() {
  static std::map<CudaStream, MockStream*> s;
  return s;
}
std::map<uintptr_t, size_t>& device_ranges() {  // start -> bytes
  static std::map<uintptr_t, size_t> r;
  return r;
}

// The legacy default stream (null handle) is a stream of its own here.
MockStream* stream_of(CudaStream s) {
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = streams().find(s);
  if (it != streams().end()) return it->second;
  if (s != nullptr) return nullptr;
  auto* d = new MockStream();  // lives until exit, like CUDA's default stream
  streams()[nullptr] = d;
  return d;
}

}  // namespace

std::map<CudaStream, int>& capturing() {  // per stream, for cudaStreamIsCapturing
  static std::map<CudaStream, int> m;
  return m;
}

extern "C" {

CudaError cudaGetDeviceCount(int* count) {
  if (!machine().valid || machine().gpus.empty()) {
    *count = 0;
    return kNoDevice;
  }
  *count = static_cast<int>(machine().gpus.size());
  return 0;
}

CudaError cudaDeviceGetAttribute(int* value, int attr, int device) {
  if (device < 0 || static_cast<size_t>(device) >= machine().gpus.size()) return kInvalidDevice;
  const int sm = machine().gpus[static_cast<size_t>(device)].sm;
  if (attr == loom::cuda::kCudaDevAttrComputeCapabilityMajor) *value = sm / 10;
  else if (attr == loom::cuda::kCudaDevAttrComputeCapabilityMinor) *value = sm % 10;
  else return kInvalidValue;
  return 0;
}

CudaError cudaDeviceGetPCIBusId(char* bus_id, int len, int device) {
  if (device < 0 || static_cast<size_t>(device) >= machine().gpus.size()) return kInvalidDevice;
  // CUDA writes the 8-digit domain form, like NVML's busId.
  std::snprintf(bus_id, static_cast<size_t>(len), "%s", machine().gpus[static_cast<size_t>(device)].busid.c_str());
  return 0;
}

CudaError cudaPointerGetAttributes(CudaPointerAttributes* attr, const void* ptr) {
  if (attr == nullptr) return kInvalidValue;
  *attr = CudaPointerAttributes{};
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = device_ranges().upper_bound(p);
  if (it != device_ranges().begin()) {
    --it;
    if (p < it->first + it->second) {
      attr->type = CudaMemoryType::kDevice;
      attr->device_pointer = const_cast<void*>(ptr);
      return 0;
    }
  }
  attr->type = CudaMemoryType::kUnregistered;  // plain host memory (CUDA 11+)
  attr->device = -2;
  return 0;
}

CudaError cudaLaunchHostFunc(CudaStream stream, CudaHostFn fn, void* user_data) {
  MockStream* s = stream_of(stream);
  if (s == nullptr || fn == nullptr) return kInvalidValue;
  s->enqueue([fn, user_data] { fn(user_data); });
  return 0;
}

const char* cudaGetErrorString(CudaError e) {
  switch (e) {
    case 0: return "cudaSuccess";
    case kInvalidValue: return "cudaErrorInvalidValue";
    case kNoDevice: return "cudaErrorNoDevice";
    case kInvalidDevice: return "cudaErrorInvalidDevice";
    default: return "cudaErrorUnknown";
  }
}

CudaError cudaStreamCreateWithFlags(CudaStream* out, unsigned flags) {
  auto* s = new MockStream((flags & 1u) == 0);  // 1 = cudaStreamNonBlocking
  auto handle = reinterpret_cast<CudaStream>(s);
  std::lock_guard<std::mutex> lk(g_mu);
  streams()[handle] = s;
  *out = handle;
  return 0;
}

CudaError cudaStreamCreate(CudaStream* out) { return cudaStreamCreateWithFlags(out, 0); }

CudaError cudaStreamSynchronize(CudaStream stream) {
  MockStream* s = stream_of(stream);
  if (s == nullptr) return kInvalidValue;
  s->synchronize();
  return 0;
}

CudaError cudaStreamDestroy(CudaStream stream) {
  MockStream* s = nullptr;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = streams().find(stream);
    if (stream == nullptr || it == streams().end()) return kInvalidValue;
    s = it->second;
    streams().erase(it);
  }
  std::unique_lock<std::shared_mutex> no_waiters(g_destroy_mu);
  delete s;  // runs what is still queued, then joins the worker
  return 0;
}

// "Device" memory: host memory the mock reports as cudaMemoryTypeDevice.
CudaError cudaMalloc(void** p, size_t bytes) {
  *p = std::malloc(bytes == 0 ? 1 : bytes);
  if (*p == nullptr) return 2;  // cudaErrorMemoryAllocation
  std::lock_guard<std::mutex> lk(g_mu);
  device_ranges()[reinterpret_cast<uintptr_t>(*p)] = bytes == 0 ? 1 : bytes;
  return 0;
}

CudaError cudaFree(void* p) {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    device_ranges().erase(reinterpret_cast<uintptr_t>(p));
  }
  std::free(p);
  return 0;
}

// The calling thread's current device, as CUDA keeps it (per host thread).
static thread_local int t_current_device = 0;

CudaError cudaSetDevice(int device) {
  if (device < 0 || static_cast<size_t>(device) >= machine().gpus.size()) return kInvalidDevice;
  t_current_device = device;
  return 0;
}

CudaError cudaGetDevice(int* device) {
  if (device == nullptr) return kInvalidValue;
  *device = t_current_device;
  return 0;
}

#ifdef LOOM_MOCK_STAGING
// Enqueued on the stream's worker; `kind` is ignored (every "device" pointer
// is host memory here), which cudaMemcpyDefault also leaves to the pointers.
CudaError cudaMemcpyAsync(void* dst, const void* src, size_t bytes, int kind, CudaStream stream) {
  MockStream* s = stream_of(stream);
  if (s == nullptr || kind < 0 || kind > 4) return kInvalidValue;
  s->enqueue([=] { std::memcpy(dst, src, bytes); });
  return 0;
}

// Pinned host memory: counted, so tests see the shim's staging pool reuse
// and free its buffers.
std::atomic<long> g_host_live{0}, g_host_total{0};

CudaError cudaMallocHost(void** p, size_t bytes) {
  *p = std::malloc(bytes == 0 ? 1 : bytes);
  if (*p == nullptr) return 2;
  g_host_live.fetch_add(1);
  g_host_total.fetch_add(1);
  return 0;
}

CudaError cudaFreeHost(void* p) {
  if (p == nullptr) return 0;
  g_host_live.fetch_sub(1);
  std::free(p);
  return 0;
}

// What tests/gpu/test_cuda_real.cc also calls, so that it runs against
// this mock too (ctest gpu/test_cuda_real_mock): one device, memset on the
// stream, a synchronous copy.

CudaError cudaMemsetAsync(void* dst, int value, size_t bytes, CudaStream stream) {
  MockStream* s = stream_of(stream);
  if (s == nullptr) return kInvalidValue;
  s->enqueue([=] { std::memset(dst, value, bytes); });
  return 0;
}

// A synchronous copy runs on the legacy default stream, which first waits
// for the work queued on every blocking stream of the device, other threads'
// streams included (as CUDA does): with ranks as threads of one process, a
// rank's cudaMemcpy then waits for a peer's collective that waits for this
// rank. Streams created after this call started are not waited for.
CudaError cudaMemcpy(void* dst, const void* src, size_t bytes, int kind) {
  if (kind < 0 || kind > 4) return kInvalidValue;
  std::shared_lock<std::shared_mutex> keep_alive(g_destroy_mu);
  std::vector<MockStream*> wait;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    for (auto& [h, st] : streams())
      if (h != nullptr && st->blocking()) wait.push_back(st);
  }
  for (MockStream* st : wait) st->synchronize();
  std::memcpy(dst, src, bytes);
  return 0;
}

long loom_mock_host_allocs_live() { return g_host_live.load(); }
long loom_mock_host_allocs_total() { return g_host_total.load(); }

// cuStreamWaitValue32_v2 (driver API, looked up in the runtime library
// first): the stream's worker polls the word until it reaches `value`
// (flags 0 = GEQ, cyclic as CUDA's; the only form Loom uses). LOOM_MOCK_WAIT_VALUE_FAILS=1
// makes it fail (CUDA_ERROR_NOT_SUPPORTED), for the host-function fallback.
int cuStreamWaitValue32_v2(CudaStream stream, unsigned long long addr, unsigned value, unsigned flags) {
  const char* fails = std::getenv("LOOM_MOCK_WAIT_VALUE_FAILS");
  if (fails != nullptr && fails[0] == '1') return 801;
  MockStream* s = stream_of(stream);
  if (s == nullptr || flags != 0 || addr == 0) return 1;
  auto* word = reinterpret_cast<unsigned*>(static_cast<uintptr_t>(addr));
  s->enqueue([word, value] {
    std::atomic_ref<unsigned> w(*word);
    // GEQ as CUDA defines it: cyclic, (int32_t)(*addr - value) >= 0.
    while (static_cast<int32_t>(w.load(std::memory_order_acquire) - value) < 0)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  });
  return 0;
}
#endif

// cudaStreamIsCapturing: what loom_mock_stream_set_capturing set (0: none).
CudaError cudaStreamIsCapturing(CudaStream stream, int* status) {
  if (status == nullptr || stream_of(stream) == nullptr) return kInvalidValue;
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = capturing().find(stream);
  *status = it == capturing().end() ? 0 : it->second;
  return 0;
}
// Test-only: pretend the stream is (1) or is not (0) being captured.
CudaError loom_mock_stream_set_capturing(CudaStream stream, int status) {
  if (stream_of(stream) == nullptr) return kInvalidValue;
  std::lock_guard<std::mutex> lk(g_mu);
  capturing()[stream] = status;
  return 0;
}

// Test-only: after the stream's prior work, sleep delay_ms, then copy
// `bytes` from src to dst (read when the copy runs, like cudaMemcpyAsync).
CudaError loom_mock_stream_enqueue_copy(CudaStream stream, void* dst, const void* src, size_t bytes,
                                        int delay_ms) {
  MockStream* s = stream_of(stream);
  if (s == nullptr) return kInvalidValue;
  s->enqueue([=] {
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    std::memcpy(dst, src, bytes);
  });
  return 0;
}

}  // extern "C"
