#include "cuda/cuda_loader.h"

#include <dlfcn.h>

#include <vector>

#include "core/config.h"
#include "core/log.h"

namespace loom::cuda {
namespace {

// Resolves `name` into `fn`; appends it to `missing` when absent.
template <typename Fn>
void resolve(void* lib, const char* name, Fn& fn, std::string& missing) {
  fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (fn == nullptr) missing += missing.empty() ? name : std::string(", ") + name;
}

// dlopen the first candidate that loads; `tried` collects each failure.
void* open_first(const std::vector<std::string>& names, std::string& opened, std::string& tried) {
  for (const std::string& n : names) {
    // RTLD_LOCAL: CUDA's symbols must not leak into the global namespace,
    // where they could shadow an application's own CUDA.
    if (void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      opened = n;
      return h;
    }
    const char* e = dlerror();
    tried += (tried.empty() ? "" : "; ") + (e != nullptr ? std::string(e) : n + ": not found");
  }
  return nullptr;
}

}  // namespace

const CudaLoader& CudaLoader::get() {
  static const CudaLoader loader(LoaderPaths{});
  return loader;
}

CudaLoader::CudaLoader(const LoaderPaths& paths) {
  load_runtime(paths.cudart);
  load_nvml(paths.nvml);
  LOOM_INFO(kLogInit, "CUDA runtime: {}", runtime_status_);
  LOOM_INFO(kLogInit, "NVML: {}", nvml_status_);
}

std::string CudaLoader::error_text(CudaError e) const {
  std::string s = "CUDA error " + std::to_string(e);
  if (rt_.get_error_string != nullptr) {
    if (const char* t = rt_.get_error_string(e)) s = std::string(t) + " (" + std::to_string(e) + ")";
  }
  return s;
}

void CudaLoader::load_runtime(const std::string& path) {
  std::vector<std::string> names;
  std::string override_path = path.empty() ? env_string("LOOM_CUDART_LIBRARY", "") : path;
  if (!override_path.empty()) names = {override_path};
  else names = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  std::string opened, tried;
  void* lib = open_first(names, opened, tried);
  if (lib == nullptr) {
    runtime_status_ = "not loaded, so no CUDA (" + tried + ")";
    return;
  }
  std::string missing;
  resolve(lib, "cudaGetDeviceCount", rt_.get_device_count, missing);
  resolve(lib, "cudaDeviceGetAttribute", rt_.device_get_attribute, missing);
  resolve(lib, "cudaDeviceGetPCIBusId", rt_.device_get_pci_bus_id, missing);
  resolve(lib, "cudaPointerGetAttributes", rt_.pointer_get_attributes, missing);
  resolve(lib, "cudaLaunchHostFunc", rt_.launch_host_func, missing);
  resolve(lib, "cudaGetErrorString", rt_.get_error_string, missing);
  if (!missing.empty()) {
    runtime_status_ = opened + " lacks " + missing + "; not used";
    return;
  }
  std::string optional_missing;
  resolve(lib, "cudaMemcpyAsync", rt_.memcpy_async, optional_missing);
  resolve(lib, "cudaMallocHost", rt_.malloc_host, optional_missing);
  resolve(lib, "cudaFreeHost", rt_.free_host, optional_missing);
  std::string no_device_alloc;  // only ncclMemAlloc uses these; it falls back to host memory
  resolve(lib, "cudaMalloc", rt_.malloc_device, no_device_alloc);
  resolve(lib, "cudaFree", rt_.free_device, no_device_alloc);
  if (!no_device_alloc.empty()) rt_.malloc_device = nullptr, rt_.free_device = nullptr;
  std::string no_current_device;  // ncclCommCuDevice then says 0
  resolve(lib, "cudaGetDevice", rt_.get_device, no_current_device);
  std::string no_capture_query;  // without it a captured call cannot be told apart
  resolve(lib, "cudaStreamIsCapturing", rt_.stream_is_capturing, no_capture_query);
  rt_.stream_wait_value32 = reinterpret_cast<decltype(rt_.stream_wait_value32)>(dlsym(lib, "cuStreamWaitValue32_v2"));
  if (rt_.stream_wait_value32 == nullptr) {
    // The driver API lives in libcuda.so.1, which every CUDA runtime itself loads.
    if (void* drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL))
      rt_.stream_wait_value32 = reinterpret_cast<decltype(rt_.stream_wait_value32)>(dlsym(drv, "cuStreamWaitValue32_v2"));
  }
  int n = 0;
  CudaError e = rt_.get_device_count(&n);
  if (e != kCudaSuccess || n <= 0) {
    // The toolkit without a driver or a device: CUDA is installed, not usable.
    runtime_status_ = opened + " loaded but sees no device (" +
                      (e != kCudaSuccess ? error_text(e) : std::string("0 devices")) + "); no CUDA";
    return;
  }
  device_count_ = n;
  runtime_ok_ = true;
  runtime_status_ = opened + ": " + std::to_string(n) + " device(s)";
  if (!optional_missing.empty()) runtime_status_ += " (no " + optional_missing + ": device buffers refused)";
  if (rt_.stream_wait_value32 == nullptr) runtime_status_ += " (no cuStreamWaitValue32_v2: streams wait in host functions)";
}

void CudaLoader::load_nvml(const std::string& path) {
  std::string override_path = path.empty() ? env_string("LOOM_NVML_LIBRARY", "") : path;
  std::vector<std::string> names = {override_path.empty() ? std::string("libnvidia-ml.so.1") : override_path};
  std::string opened, tried;
  void* lib = open_first(names, opened, tried);
  if (lib == nullptr) {
    nvml_status_ = "not loaded, so no GPU details in the topology (" + tried + ")";
    return;
  }
  std::string missing;
  resolve(lib, "nvmlInit_v2", nvml_.init, missing);
  resolve(lib, "nvmlErrorString", nvml_.error_string, missing);
  resolve(lib, "nvmlDeviceGetCount_v2", nvml_.device_get_count, missing);
  resolve(lib, "nvmlDeviceGetHandleByIndex_v2", nvml_.device_get_handle_by_index, missing);
  resolve(lib, "nvmlDeviceGetPciInfo_v3", nvml_.device_get_pci_info, missing);
  resolve(lib, "nvmlDeviceGetCudaComputeCapability", nvml_.device_get_cuda_compute_capability, missing);
  resolve(lib, "nvmlDeviceGetNvLinkState", nvml_.device_get_nvlink_state, missing);
  resolve(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2", nvml_.device_get_nvlink_remote_pci_info, missing);
  if (!missing.empty()) {
    nvml_status_ = opened + " lacks " + missing + "; not used";
    return;
  }
  std::string optional_missing;
  resolve(lib, "nvmlDeviceGetNvLinkRemoteDeviceType", nvml_.device_get_nvlink_remote_device_type, optional_missing);
  NvmlReturn r = nvml_.init();
  if (r != kNvmlSuccess) {
    const char* t = nvml_.error_string(r);
    nvml_status_ = opened + " loaded but nvmlInit failed (" + (t != nullptr ? t : "?") + ", " +
                   std::to_string(r) + "); no GPU details";
    return;
  }
  unsigned n = 0;
  if (nvml_.device_get_count(&n) != kNvmlSuccess) n = 0;
  nvml_ok_ = true;
  nvml_status_ = opened + ": " + std::to_string(n) + " GPU(s)";
  if (!optional_missing.empty()) nvml_status_ += " (no " + optional_missing + ": NVLink peers told apart by bus id)";
}

}  // namespace loom::cuda
