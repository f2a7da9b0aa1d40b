#include "shim/staging.h"

#include <atomic>
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

StagingLease::~StagingLease() { pool_->give_back(*this); }

bool flag_reached(const uint32_t* word, uint32_t value) {
  std::atomic_ref<uint32_t> w(*const_cast<uint32_t*>(word));
  return static_cast<int32_t>(w.load(std::memory_order_acquire) - value) >= 0;
}

void FlagTicket::done() const {
  if (pool != nullptr) pool->flag_done(ticket);
}

Result<std::shared_ptr<StagingLease>> StagingPool::take(size_t bytes, uintptr_t stream) {
  bury_dead(rt_);
  const size_t cls = size_class(bytes);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return invalid_usage("staging pool used after its communicator was destroyed");
    auto from = [&](std::vector<void*>& list) -> std::shared_ptr<StagingLease> {
      void* p = list.back();
      list.pop_back();
      Buf& b = bufs_.at(p);
      b.taker = ++next_taker_;
      if (b.pending == 0) b.stream = stream;
      return std::make_shared<StagingLease>(shared_from_this(), p, b.taker);
    };
    if (stream != 0) {
      auto it = stream_idle_.find({stream, cls});
      if (it != stream_idle_.end() && !it->second.empty()) return from(it->second);
    }
    auto& list = idle_[cls];
    if (!list.empty()) return from(list);
  }
  void* p = nullptr;
  if (cuda::CudaError e = rt_.malloc_host(&p, cls); e != cuda::kCudaSuccess || p == nullptr)
    return cuda_error("cudaMallocHost(" + std::to_string(cls) + " bytes) for a staging buffer failed: " +
                          cuda_text(e));
  std::lock_guard<std::mutex> lk(mu_);
  ++allocated_;
  Buf& b = bufs_[p];
  b.size_class = cls;
  b.stream = stream;
  b.taker = ++next_taker_;
  return std::make_shared<StagingLease>(shared_from_this(), p, b.taker);
}

void StagingPool::hand_to_stream(StagingLease& lease) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = bufs_.find(lease.ptr_);
  if (it == bufs_.end() || it->second.taker != lease.taker_ || lease.handed_) return;
  Buf& b = it->second;
  if (b.stream == 0) return;  // no stream to order it: back to everyone when the lease goes
  ++b.pending;
  b.taker = 0;
  lease.handed_ = true;
  stream_idle_[{b.stream, b.size_class}].push_back(lease.ptr_);
}

void StagingPool::make_idle(void* ptr, size_t size_class) {
  if (!closed_) {
    idle_[size_class].push_back(ptr);
    return;
  }
  bufs_.erase(ptr);
  --allocated_;
  std::lock_guard<std::mutex> glk(graveyard().mu);
  graveyard().ptrs.push_back(ptr);
}

void StagingPool::give_back(StagingLease& lease) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = bufs_.find(lease.ptr_);
  if (it == bufs_.end()) return;
  Buf& b = it->second;
  if (lease.handed_) {
    // The stream has passed this lease's copies. Still waiting in its
    // stream's list (not taken again) and nothing else pending: everyone's.
    if (--b.pending > 0 || b.taker != 0) return;
    auto& list = stream_idle_[{b.stream, b.size_class}];
    std::erase(list, lease.ptr_);
    if (list.empty()) stream_idle_.erase({b.stream, b.size_class});
  } else {
    if (b.taker != lease.taker_) return;
    b.taker = 0;
    if (b.pending > 0) {  // dropped unused while an earlier call's copies are still on its stream
      stream_idle_[{b.stream, b.size_class}].push_back(lease.ptr_);
      return;
    }
  }
  make_idle(lease.ptr_, b.size_class);
}

Result<FlagTicket> StagingPool::next_flag_ticket() {
  std::shared_ptr<StagingLease> lease;
  {
    std::lock_guard<std::mutex> lk(mu_);
    lease = flag_;
  }
  if (lease == nullptr) {
    LOOM_ASSIGN_OR_RETURN(lease, take(sizeof(uint32_t)));
    auto* word = reinterpret_cast<uint32_t*>(lease->data());
    unsigned long long addr = reinterpret_cast<uintptr_t>(word);
    cuda::CudaPointerAttributes a;
    if (rt_.pointer_get_attributes(&a, word) == cuda::kCudaSuccess && a.device_pointer != nullptr)
      addr = reinterpret_cast<uintptr_t>(a.device_pointer);
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return invalid_usage("staging pool used after its communicator was destroyed");
    if (flag_ == nullptr) {  // (else another thread made one first: this lease goes back)
      flag_ = lease;
      flag_word_ = word;
      flag_device_address_ = addr;
      std::atomic_ref<uint32_t>(*word).store(static_cast<uint32_t>(done_upto_), std::memory_order_release);
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (closed_ || flag_ == nullptr) return invalid_usage("staging pool used after its communicator was destroyed");
  FlagTicket t;
  t.pool = shared_from_this();
  t.lease = flag_;
  t.word = flag_word_;
  t.device_address = flag_device_address_;
  t.ticket = ++last_ticket_;
  return t;
}

// Called by a ticket's holder, whose lease keeps the word allocated (also
// after close(): the last ops of a destroyed comm still release their streams).
void StagingPool::flag_done(uint64_t ticket) {
  std::lock_guard<std::mutex> lk(mu_);
  if (ticket != done_upto_ + 1) {
    done_early_.insert(ticket);
    return;
  }
  done_upto_ = ticket;
  while (!done_early_.empty() && *done_early_.begin() == done_upto_ + 1) {
    done_upto_ = *done_early_.begin();
    done_early_.erase(done_early_.begin());
  }
  std::atomic_ref<uint32_t>(*flag_word_).store(static_cast<uint32_t>(done_upto_), std::memory_order_release);
}

void StagingPool::set_next_ticket_for_test(uint64_t t) {
  std::lock_guard<std::mutex> lk(mu_);
  last_ticket_ = done_upto_ = t - 1;
  if (flag_word_ != nullptr)
    std::atomic_ref<uint32_t>(*flag_word_).store(static_cast<uint32_t>(done_upto_), std::memory_order_release);
}

void StagingPool::close() {
  std::vector<void*> idle;
  std::shared_ptr<StagingLease> flag;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return;
    closed_ = true;
    flag.swap(flag_);
    for (auto& [cls, list] : idle_) idle.insert(idle.end(), list.begin(), list.end());
    idle_.clear();
    for (void* p : idle) bufs_.erase(p);
    allocated_ -= idle.size();
  }
  // Buffers in a stream's list are still pending there: freed when the last
  // lease on them goes. The flag word likewise, when no stream op holds it.
  flag.reset();
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
  LOOM_ASSIGN_OR_RETURN(std::shared_ptr<StagingLease> lease, pool_->take(bytes, stream_));
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

void StagePlan::hand_to_stream() {
  for (Region& r : regions_) pool_->hand_to_stream(*r.lease);
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
