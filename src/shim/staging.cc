#include "shim/staging.h"

#include <condition_variable>
#include <deque>
#include <string>
#include <thread>

#include "core/log.h"

namespace loom::shim {
namespace {

constexpr size_t kMinClass = 4096;

size_t size_class(size_t bytes) {
  size_t c = kMinClass;
  while (c < bytes) c <<= 1;
  return c;
}

// Buffers given back inside a host function after their pool closed: freed
// by the next pool call on a user thread, where CUDA may be called.
struct Graveyard {
  std::mutex mu;
  std::vector<void*> ptrs;
};
Graveyard& graveyard() {
  static auto* g = new Graveyard();  // never destroyed: host functions may run at exit
  return *g;
}

void bury_dead(const cuda::CudaRuntimeApi& rt) {
  std::vector<void*> dead;
  {
    std::lock_guard<std::mutex> lk(graveyard().mu);
    dead.swap(graveyard().ptrs);
  }
  for (void* p : dead) (void)rt.free_host(p);
}

std::string cuda_text(cuda::CudaError e) { return cuda::CudaLoader::get().error_text(e); }

}  // namespace

StagingLease::~StagingLease() { pool_->give_back(ptr_, class_); }

Result<std::shared_ptr<StagingLease>> StagingPool::take(size_t bytes) {
  bury_dead(rt_);
  const size_t cls = size_class(bytes);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return invalid_usage("staging pool used after its communicator was destroyed");
    auto& list = idle_[cls];
    if (!list.empty()) {
      void* p = list.back();
      list.pop_back();
      return std::make_shared<StagingLease>(shared_from_this(), p, cls);
    }
  }
  void* p = nullptr;
  if (cuda::CudaError e = rt_.malloc_host(&p, cls); e != cuda::kCudaSuccess || p == nullptr)
    return cuda_error("cudaMallocHost(" + std::to_string(cls) + " bytes) for a staging buffer failed: " +
                          cuda_text(e));
  std::lock_guard<std::mutex> lk(mu_);
  ++allocated_;
  return std::make_shared<StagingLease>(shared_from_this(), p, cls);
}

void StagingPool::give_back(void* ptr, size_t size_class) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!closed_) {
    idle_[size_class].push_back(ptr);
    return;
  }
  --allocated_;
  std::lock_guard<std::mutex> glk(graveyard().mu);
  graveyard().ptrs.push_back(ptr);
}

void StagingPool::close() {
  std::vector<void*> idle;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return;
    closed_ = true;
    for (auto& [cls, list] : idle_) idle.insert(idle.end(), list.begin(), list.end());
    idle_.clear();
    allocated_ -= idle.size();
  }
  for (void* p : idle) (void)rt_.free_host(p);
  bury_dead(rt_);
}

size_t StagingPool::allocated() const {
  std::lock_guard<std::mutex> lk(mu_);
  return allocated_;
}

StagingRef::~StagingRef() {
  if (pool_) pool_->close();
}

std::shared_ptr<StagingPool> StagingRef::get(const cuda::CudaRuntimeApi& rt) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!pool_) pool_ = std::make_shared<StagingPool>(rt);
  return pool_;
}

Result<void*> StagePlan::map(const void* p, size_t bytes, bool read, bool write) {
  if (bytes == 0 || p == nullptr) return const_cast<void*>(p);
  const auto* b = static_cast<const std::byte*>(p);
  // Inside a range already staged: the same copy (in-place calls).
  for (const Region& r : regions_) {
    if (b >= r.dev && b + bytes <= r.dev + r.bytes) {
      std::byte* h = r.lease->data() + (b - r.dev);
      if (read) in_.push_back({h, p, bytes});
      if (write) out_.push_back({const_cast<std::byte*>(b), h, bytes});
      return static_cast<void*>(h);
    }
    if (b < r.dev + r.bytes && r.dev < b + bytes)
      return invalid_argument("buffers overlap without one containing the other");
  }
  cuda::CudaPointerAttributes a;
  if (rt_.pointer_get_attributes(&a, p) != cuda::kCudaSuccess || a.type != cuda::CudaMemoryType::kDevice)
    return const_cast<void*>(p);  // host, managed or unregistered memory: used directly
  static std::once_flag logged;
  std::call_once(logged, [] {
    LOOM_INFO(kLogInit, "CUDA device buffers are staged through pinned host memory (cudaMemcpyAsync on the "
                        "caller's stream before and after each op); there is no GPU-direct path");
  });
  LOOM_ASSIGN_OR_RETURN(std::shared_ptr<StagingLease> lease, pool_->take(bytes));
  std::byte* h = lease->data();
  regions_.push_back({b, bytes, std::move(lease)});
  if (read) in_.push_back({h, p, bytes});
  if (write) out_.push_back({const_cast<std::byte*>(b), h, bytes});
  return static_cast<void*>(h);
}

Status StagePlan::enqueue_copy_in(cuda::CudaStream stream) {
  for (const Copy& c : in_) {
    cuda::CudaError e = rt_.memcpy_async(c.dst, c.src, c.bytes, cuda::kCudaMemcpyDefault, stream);
    if (e != cuda::kCudaSuccess) return cuda_error("cudaMemcpyAsync to a staging buffer failed: " + cuda_text(e));
  }
  return Status::ok();
}

Status StagePlan::enqueue_copy_out(cuda::CudaStream stream) {
  for (const Copy& c : out_) {
    cuda::CudaError e = rt_.memcpy_async(c.dst, c.src, c.bytes, cuda::kCudaMemcpyDefault, stream);
    if (e != cuda::kCudaSuccess)
      return cuda_error("cudaMemcpyAsync from a staging buffer failed: " + cuda_text(e));
  }
  return Status::ok();
}

namespace {
void drop_kept(void* arg) { delete static_cast<std::shared_ptr<void>*>(arg); }
}  // namespace

Status keep_until_passed(const cuda::CudaRuntimeApi& rt, cuda::CudaStream stream, std::shared_ptr<void> keep) {
  auto* arg = new std::shared_ptr<void>(std::move(keep));
  cuda::CudaError e = rt.launch_host_func(stream, &drop_kept, arg);
  if (e == cuda::kCudaSuccess) return Status::ok();
  // The stream may still use the memory: keep it (leaked) rather than reuse
  // memory a copy may still be writing.
  LOOM_WARN(kLogColl, "cudaLaunchHostFunc to release staging memory failed ({}); the memory is leaked", cuda_text(e));
  return cuda_error("cudaLaunchHostFunc failed: " + cuda_text(e));
}

Status StagePlan::enqueue_release(cuda::CudaStream stream, std::shared_ptr<StagePlan> self) {
  return keep_until_passed(rt_, stream, std::move(self));
}

namespace {

// Threads for run_off_stream: one per job running at once, kept for reuse.
class OffStreamPool {
 public:
  void post(std::function<void()> job) {
    std::lock_guard<std::mutex> lk(mu_);
    jobs_.push_back(std::move(job));
    if (idle_ < jobs_.size()) {
      ++idle_;  // the new thread counts as idle until it takes a job
      std::thread([this] { work(); }).detach();
    }
    cv_.notify_one();
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return !jobs_.empty(); });
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      --idle_;
      lk.unlock();
      job();
      lk.lock();
      ++idle_;
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  size_t idle_ = 0;
};

}  // namespace

void run_off_stream(std::function<void()> job) {
  static auto* pool = new OffStreamPool();  // never destroyed: its threads are detached
  pool->post(std::move(job));
}

}  // namespace loom::shim
