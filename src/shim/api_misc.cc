// Version, error strings, async errors, queries, memory allocation, buffer
// registration and memory windows.
#include <cstdlib>
#include <string>

#include "cuda/cuda_loader.h"
#include "loom/memory.h"
#include "shim/alias.h"
#include "shim/shim.h"

using namespace loom;
using namespace loom::shim;

namespace {

constexpr size_t kAllocAlignment = NCCL_WIN_REQUIRED_ALIGNMENT;

Result<ncclWindow_vidmem*> add_registration(ncclComm* c, void* buff, size_t size, int flags,
                                            bool window) {
  auto reg = std::make_unique<ncclWindow_vidmem>();
  reg->buff = buff;
  reg->size = size;
  reg->flags = flags;
  reg->window = window;
  ncclWindow_vidmem* handle = reg.get();
  std::lock_guard<std::mutex> lock(c->mu);
  c->registrations.emplace(handle, std::move(reg));
  return handle;
}

Status remove_registration(ncclComm* c, void* handle, bool window) {
  std::lock_guard<std::mutex> lock(c->mu);
  auto it = c->registrations.find(handle);
  if (it == c->registrations.end() || it->second->window != window) {
    const std::string what = std::string(window ? "window" : "registration handle") +
                             " is not registered with this communicator";
    // NCCL's ncclCommDeregister: an unknown handle is a usage error.
    return window ? invalid_argument(what) : invalid_usage(what);
  }
  c->registrations.erase(it);
  return Status::ok();
}

}  // namespace

extern "C" ncclResult_t pncclGetVersion(int* version) {
  return guard("ncclGetVersion", nullptr, [&]() -> Status {
    if (version == nullptr) return invalid_argument("version is NULL");
    *version = NCCL_VERSION_CODE;
    return Status::ok();
  });
}

extern "C" const char* pncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled CUDA error (see ncclGetLastError)";
    case ncclSystemError: return "system error: an OS call failed (see ncclGetLastError)";
    case ncclInternalError: return "internal error in Loom (please report it)";
    case ncclInvalidArgument: return "invalid argument (see ncclGetLastError)";
    case ncclInvalidUsage: return "invalid usage (see ncclGetLastError)";
    case ncclRemoteError: return "remote error: a peer failed, aborted or did not answer";
    case ncclInProgress: return "operation in progress";
    case ncclNumResults: break;
  }
  return "unknown result code";
}

extern "C" const char* pncclGetLastError(ncclComm_t comm) {
  try {
    return last_error(comm);
  } catch (...) {
    return "";
  }
}

extern "C" void pncclResetDebugInit() {
  // Loom reads its logging settings once; there is nothing to reset.
}

extern "C" ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  return guard("ncclCommGetAsyncError", comm, [&]() -> Status {
    LOOM_RETURN_IF_ERROR(check_handle(comm));
    if (asyncError == nullptr) return invalid_argument("asyncError is NULL");
    if (comm->ready.valid()) {
      if (comm->ready.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        *asyncError = ncclInProgress;
        return Status::ok();
      }
      Status s = comm->ready.get();
      if (!s.is_ok()) {
        record_error(comm, s);
        *asyncError = to_nccl(s.code());
        return Status::ok();
      }
    }
    // A non-blocking split/shrink of this communicator still runs: the
    // parent is in progress too, as in NCCL (the job is launched on it).
    if (child_job_running(comm)) {
      *asyncError = ncclInProgress;
      return Status::ok();
    }
    Status s = poll(comm);
    if (!s.is_ok() && s.code() != StatusCode::kInProgress) record_error(comm, s);
    *asyncError = to_nccl(s.code());
    return Status::ok();
  });
}

namespace {
// A comm the queries may answer for, as NCCL's (ncclCommEnsureReady): not
// while a non-blocking creation runs, nor once it failed (its error).
Result<ncclComm*> queryable_comm(ncclComm* comm) {
  LOOM_RETURN_IF_ERROR(creation_finished(comm));
  LOOM_ASSIGN_OR_RETURN(ncclComm * c, live_comm(comm));
  std::lock_guard<std::mutex> lock(c->mu);
  if (!c->async_error.is_ok()) return c->async_error;
  return c;
}
}  // namespace

extern "C" ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  return guard("ncclCommCount", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, queryable_comm(comm));
    if (count == nullptr) return invalid_argument("count is NULL");
    *count = c->nranks;
    return Status::ok();
  });
}

extern "C" ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  return guard("ncclCommCuDevice", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, queryable_comm(comm));
    if (device == nullptr) return invalid_argument("device is NULL");
    *device = c->cuda_dev;  // host communicators report device 0 (or InitAll's devlist)
    return Status::ok();
  });
}

extern "C" ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  return guard("ncclCommUserRank", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, queryable_comm(comm));
    if (rank == nullptr) return invalid_argument("rank is NULL");
    *rank = c->rank;
    return Status::ok();
  });
}

extern "C" ncclResult_t pncclMemAlloc(void** ptr, size_t size) {
  return guard("ncclMemAlloc", nullptr, [&]() -> Status {
    apply_nccl_env();  // it may be the first call, and it logs (loading CUDA)
    if (ptr == nullptr) return invalid_argument("ptr is NULL");
    // NCCL (allocator.cc) hands a size of 0 to cudaMalloc, which succeeds
    // with a NULL pointer; so does this. Regression: it was
    // ncclInvalidArgument (NcclCompat.MemAllocOfZeroBytesGivesNull).
    if (size == 0) {
      *ptr = nullptr;
      return Status::ok();
    }
    // NCCL's ncclMemAlloc returns GPU memory, and CUDA programs (PyTorch's
    // NCCL memory pool) write to it from kernels: where a CUDA runtime sees
    // a device, device memory from cudaMalloc on the current device.
    const cuda::CudaLoader& cl = cuda::CudaLoader::get();
    if (const cuda::CudaRuntimeApi* rt = cl.runtime(); rt != nullptr && rt->malloc_device != nullptr) {
      void* p = nullptr;
      const cuda::CudaError e = rt->malloc_device(&p, size);
      if (e != cuda::kCudaSuccess)
        return cuda_error("cudaMalloc(" + std::to_string(size) + " bytes) failed: " + cl.error_text(e));
      *ptr = p;
      return Status::ok();
    }
    // Without CUDA, host memory from loom::mem_alloc: page-aligned (so it
    // satisfies NCCL_WIN_REQUIRED_ALIGNMENT) and mappable by the peers of
    // this host, which then read it without process_vm_readv
    // (include/loom/memory.h). Where shared-memory files are not available,
    // ordinary aligned memory.
    static_assert(kAllocAlignment <= 4096);
    if (Result<void*> r = mem_alloc(size); r.is_ok()) {
      *ptr = *r;
      return Status::ok();
    }
    void* p = nullptr;
    int err = posix_memalign(&p, kAllocAlignment, size);
    if (err != 0) return system_error("ncclMemAlloc(" + std::to_string(size) + ")", err);
    *ptr = p;
    return Status::ok();
  });
}

extern "C" ncclResult_t pncclMemFree(void* ptr) {
  return guard("ncclMemFree", nullptr, [&]() -> Status {
    apply_nccl_env();
    if (ptr == nullptr) return Status::ok();
    const cuda::CudaLoader& cl = cuda::CudaLoader::get();
    if (const cuda::CudaRuntimeApi* rt = cl.runtime(); rt != nullptr && rt->free_device != nullptr) {
      cuda::CudaPointerAttributes a;
      if (rt->pointer_get_attributes(&a, ptr) == cuda::kCudaSuccess && a.type == cuda::CudaMemoryType::kDevice) {
        const cuda::CudaError e = rt->free_device(ptr);
        if (e != cuda::kCudaSuccess)
          return cuda_error("cudaFree failed: " + cl.error_text(e));
        return Status::ok();
      }
    }
    if (!mem_free(ptr).is_ok()) std::free(ptr);  // ncclMemAlloc's fallback
    return Status::ok();
  });
}

extern "C" ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size,
                                          void** handle) {
  return guard("ncclCommRegister", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, live_comm(comm));
    if (handle == nullptr) return invalid_argument("handle is NULL");
    if (buff == nullptr && size > 0) return invalid_argument("buff is NULL");
    // Host buffers need no pinning on the shm path; the handle is bookkeeping.
    LOOM_ASSIGN_OR_RETURN(ncclWindow_vidmem * reg, add_registration(c, buff, size, 0, false));
    *handle = reg;
    return Status::ok();
  });
}

extern "C" ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle) {
  return guard("ncclCommDeregister", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, live_comm(comm));
    // NULL is what ncclCommRegister hands out when it skips a buffer (NCCL
    // does for host memory): deregistering it succeeds, as in NCCL.
    if (handle == nullptr) return Status::ok();
    return remove_registration(c, handle, false);
  });
}

extern "C" ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                                ncclWindow_t* win, int winFlags) {
  return guard("ncclCommWindowRegister", comm, [&]() -> Status {
    // As NCCL (dev_runtime.cc): *win is NULL unless registration succeeds,
    // and flags this library does not act on are accepted (a newer header's
    // flags, e.g. strict ordering, must not fail the call).
    if (win != nullptr) *win = nullptr;
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, live_comm(comm));
    if (win == nullptr) return invalid_argument("win is NULL");
    if (buff == nullptr || size == 0) return invalid_argument("window buffer is NULL or empty");
    if ((winFlags & NCCL_WIN_COLL_SYMMETRIC) &&
        reinterpret_cast<uintptr_t>(buff) % NCCL_WIN_REQUIRED_ALIGNMENT != 0)
      return invalid_argument("symmetric window buffer must be aligned to " +
                              std::to_string(NCCL_WIN_REQUIRED_ALIGNMENT) + " bytes");
    LOOM_ASSIGN_OR_RETURN(ncclWindow_vidmem * w, add_registration(c, buff, size, winFlags, true));
    *win = w;
    return Status::ok();
  });
}

extern "C" ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return guard("ncclCommWindowDeregister", comm, [&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(ncclComm * c, live_comm(comm));
    // NULL (a window that was never registered): nothing to do, as NCCL.
    if (win == nullptr) return Status::ok();
    return remove_registration(c, win, true);
  });
}

// pncclResetDebugInit is deprecated in the header; naming it is intended.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
LOOM_NCCL_ALIAS(ncclGetVersion)
LOOM_NCCL_ALIAS(ncclGetErrorString)
LOOM_NCCL_ALIAS(ncclGetLastError)
LOOM_NCCL_ALIAS(ncclResetDebugInit)
LOOM_NCCL_ALIAS(ncclCommGetAsyncError)
LOOM_NCCL_ALIAS(ncclCommCount)
LOOM_NCCL_ALIAS(ncclCommCuDevice)
LOOM_NCCL_ALIAS(ncclCommUserRank)
LOOM_NCCL_ALIAS(ncclMemAlloc)
LOOM_NCCL_ALIAS(ncclMemFree)
LOOM_NCCL_ALIAS(ncclCommRegister)
LOOM_NCCL_ALIAS(ncclCommDeregister)
LOOM_NCCL_ALIAS(ncclCommWindowRegister)
LOOM_NCCL_ALIAS(ncclCommWindowDeregister)
