// Run-time access to the CUDA runtime and NVML, without a build-time
// dependency on either.
//
// Loom builds and runs where CUDA is absent, so nothing here includes a CUDA
// header or links a CUDA library: the libraries are opened with dlopen on
// first use and the few types Loom needs are declared below in our own words.
// Their layout and values are checked against NVIDIA's headers by
// tests/gpu/mock/cuda_abi_check.cc wherever those headers are installed.
//
// Which library:
//   CUDA runtime  LOOM_CUDART_LIBRARY, else libcudart.so.13, .so.12, .so
//   NVML          LOOM_NVML_LIBRARY, else libnvidia-ml.so.1
// A missing library, a missing function, or a runtime that sees no device
// (the toolkit installed on a machine without a GPU or driver) all mean "no
// CUDA": never an error. What was found, or why not, is logged once at INFO
// under INIT and is available as runtime_status() / nvml_status().
#pragma once

#include <cstddef>
#include <string>

namespace loom::cuda {

// ---- CUDA runtime ABI (cuda_runtime_api.h, driver_types.h) ----------------
using CudaError = int;            // cudaError_t: an int-sized enum, 0 = success
using CudaStream = struct CudaStreamOpaque*;  // cudaStream_t (a CUstream_st*)
using CudaHostFn = void (*)(void* user_data);  // cudaHostFn_t
inline constexpr CudaError kCudaSuccess = 0;
inline constexpr int kCudaDevAttrComputeCapabilityMajor = 75;  // cudaDeviceAttr values
inline constexpr int kCudaDevAttrComputeCapabilityMinor = 76;

// cudaMemoryType
enum class CudaMemoryType : int { kUnregistered = 0, kHost = 1, kDevice = 2, kManaged = 3 };

// struct cudaPointerAttributes as of CUDA 13 (CUDA 11/12 lack `reserved` and
// write only the first 24 bytes, so the larger struct is safe with both).
struct CudaPointerAttributes {
  CudaMemoryType type = CudaMemoryType::kUnregistered;
  int device = 0;
  void* device_pointer = nullptr;
  void* host_pointer = nullptr;
  long reserved[8] = {};
};

struct CudaRuntimeApi {
  CudaError (*get_device_count)(int* count) = nullptr;
  CudaError (*device_get_attribute)(int* value, int attr, int device) = nullptr;
  CudaError (*device_get_pci_bus_id)(char* bus_id, int len, int device) = nullptr;
  CudaError (*pointer_get_attributes)(CudaPointerAttributes* attr, const void* ptr) = nullptr;
  CudaError (*launch_host_func)(CudaStream stream, CudaHostFn fn, void* user_data) = nullptr;
  const char* (*get_error_string)(CudaError err) = nullptr;
  // Optional: without them the runtime still loads, but device buffers cannot
  // be staged through host memory (the shim refuses them then).
  CudaError (*memcpy_async)(void* dst, const void* src, size_t bytes, int kind, CudaStream stream) = nullptr;
  CudaError (*malloc_host)(void** ptr, size_t bytes) = nullptr;
  CudaError (*free_host)(void* ptr) = nullptr;
  // Optional, from the driver (cuStreamWaitValue32_v2; looked up in the
  // runtime library, then libcuda.so.1): holds a stream until a 32-bit word
  // in mapped host memory reaches a value, so a stream can wait for host work
  // without a blocking host function.
  int (*stream_wait_value32)(CudaStream stream, unsigned long long addr, unsigned value, unsigned flags) = nullptr;
  // Optional: device memory for ncclMemAlloc / ncclMemFree (NCCL's
  // ncclMemAlloc returns GPU memory; without these Loom hands out host memory).
  CudaError (*malloc_device)(void** ptr, size_t bytes) = nullptr;  // cudaMalloc
  CudaError (*free_device)(void* ptr) = nullptr;                   // cudaFree
  // Optional: cudaGetDevice, the calling thread's current device (what
  // NCCL's ncclCommInitRank* records and ncclCommCuDevice reports).
  CudaError (*get_device)(int* device) = nullptr;
  // Optional: cudaStreamIsCapturing (status: 0 none, 1 active, 2 invalidated).
  CudaError (*stream_is_capturing)(CudaStream stream, int* status) = nullptr;
  bool can_stage() const { return memcpy_async != nullptr && malloc_host != nullptr && free_host != nullptr; }
};
inline constexpr int kCudaMemcpyDefault = 4;      // cudaMemcpyKind: direction from the pointers (UVA)
inline constexpr unsigned kCuStreamWaitValueGeq = 0;  // CUstreamWaitValue_flags

// ---- NVML ABI (nvml.h) -----------------------------------------------------
using NvmlReturn = int;  // nvmlReturn_t, 0 = success
using NvmlDevice = struct NvmlDeviceOpaque*;  // nvmlDevice_t
inline constexpr NvmlReturn kNvmlSuccess = 0;
inline constexpr NvmlReturn kNvmlErrorInvalidArgument = 2;
inline constexpr NvmlReturn kNvmlErrorNotSupported = 3;
inline constexpr int kNvmlFeatureEnabled = 1;       // nvmlEnableState_t
inline constexpr int kNvmlNvLinkRemoteGpu = 0;      // nvmlIntNvLinkDeviceType_t
inline constexpr int kNvmlNvLinkRemoteSwitch = 2;

// nvmlPciInfo_t (the v3 layout used by nvmlDeviceGetPciInfo_v3 and
// nvmlDeviceGetNvLinkRemotePciInfo_v2).
struct NvmlPciInfo {
  char bus_id_legacy[16];  // "0000:18:00.0"
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pci_device_id;     // device id << 16 | vendor id
  unsigned pci_subsystem_id;
  char bus_id[32];         // "00000000:18:00.0"
};

struct NvmlApi {
  NvmlReturn (*init)() = nullptr;  // nvmlInit_v2
  const char* (*error_string)(NvmlReturn r) = nullptr;
  NvmlReturn (*device_get_count)(unsigned* count) = nullptr;  // _v2
  NvmlReturn (*device_get_handle_by_index)(unsigned index, NvmlDevice* dev) = nullptr;  // _v2
  NvmlReturn (*device_get_pci_info)(NvmlDevice dev, NvmlPciInfo* pci) = nullptr;  // _v3
  NvmlReturn (*device_get_cuda_compute_capability)(NvmlDevice dev, int* major, int* minor) = nullptr;
  NvmlReturn (*device_get_nvlink_state)(NvmlDevice dev, unsigned link, int* state) = nullptr;
  NvmlReturn (*device_get_nvlink_remote_pci_info)(NvmlDevice dev, unsigned link, NvmlPciInfo* pci) = nullptr;  // _v2
  // Optional (older drivers lack it): what is at the far end of a link.
  NvmlReturn (*device_get_nvlink_remote_device_type)(NvmlDevice dev, unsigned link, int* type) = nullptr;
};

// ---- the loader -------------------------------------------------------------
struct LoaderPaths {
  std::string cudart;  // empty: LOOM_CUDART_LIBRARY, else the default names
  std::string nvml;    // empty: LOOM_NVML_LIBRARY, else libnvidia-ml.so.1
};

class CudaLoader {
 public:
  // The process-wide loader, created (and the libraries opened) on first call;
  // thread-safe. Libraries stay loaded until exit: CUDA and NVML do not
  // support being unloaded and reloaded within a process.
  static const CudaLoader& get();

  // A separate loader (tests load a mock next to the process-wide one).
  explicit CudaLoader(const LoaderPaths& paths);
  ~CudaLoader() = default;
  CudaLoader(const CudaLoader&) = delete;
  CudaLoader& operator=(const CudaLoader&) = delete;

  // The runtime's functions when it loaded and sees at least one device; else null.
  const CudaRuntimeApi* runtime() const { return runtime_ok_ ? &rt_ : nullptr; }
  int device_count() const { return device_count_; }
  // NVML's functions when it loaded and initialised; else null.
  const NvmlApi* nvml() const { return nvml_ok_ ? &nvml_ : nullptr; }
  // "libcudart.so.13: 8 device(s)" or why there is no CUDA; likewise for NVML.
  const std::string& runtime_status() const { return runtime_status_; }
  const std::string& nvml_status() const { return nvml_status_; }
  // Text of a runtime error code ("cudaErrorNoDevice (100)").
  std::string error_text(CudaError e) const;

 private:
  void load_runtime(const std::string& path);
  void load_nvml(const std::string& path);

  CudaRuntimeApi rt_;
  NvmlApi nvml_;
  bool runtime_ok_ = false;
  bool nvml_ok_ = false;
  int device_count_ = 0;
  std::string runtime_status_, nvml_status_;
};

}  // namespace loom::cuda
