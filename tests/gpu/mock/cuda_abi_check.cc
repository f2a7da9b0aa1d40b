// Loom's own declarations of the CUDA runtime / NVML ABI (src/cuda/cuda_loader.h)
// against NVIDIA's headers. Built only where cuda_runtime_api.h is installed
// (tests/gpu/mock/CMakeLists.txt); the NVML part only where nvml.h is too.
// Everything is checked at compile time; the program just reports success.
#include <cuda_runtime_api.h>
#include <driver_types.h>

#include <cstddef>
#include <cstdio>
#include <type_traits>

#include "cuda/cuda_loader.h"

namespace lc = loom::cuda;

// Scalars and handles.
static_assert(sizeof(cudaError_t) == sizeof(lc::CudaError));
static_assert(cudaSuccess == lc::kCudaSuccess);
static_assert(sizeof(cudaStream_t) == sizeof(lc::CudaStream));
static_assert(cudaDevAttrComputeCapabilityMajor == lc::kCudaDevAttrComputeCapabilityMajor);
static_assert(cudaDevAttrComputeCapabilityMinor == lc::kCudaDevAttrComputeCapabilityMinor);
static_assert(sizeof(cudaDeviceAttr) == sizeof(int));

// cudaMemoryType values.
static_assert(cudaMemoryTypeUnregistered == static_cast<int>(lc::CudaMemoryType::kUnregistered));
static_assert(cudaMemoryTypeHost == static_cast<int>(lc::CudaMemoryType::kHost));
static_assert(cudaMemoryTypeDevice == static_cast<int>(lc::CudaMemoryType::kDevice));
static_assert(cudaMemoryTypeManaged == static_cast<int>(lc::CudaMemoryType::kManaged));
static_assert(sizeof(cudaMemoryType) == sizeof(lc::CudaMemoryType));

// struct cudaPointerAttributes: ours must be at least as large (the runtime
// writes the whole struct) and agree on every field Loom reads.
static_assert(sizeof(lc::CudaPointerAttributes) >= sizeof(cudaPointerAttributes));
static_assert(offsetof(cudaPointerAttributes, type) == offsetof(lc::CudaPointerAttributes, type));
static_assert(offsetof(cudaPointerAttributes, device) == offsetof(lc::CudaPointerAttributes, device));
static_assert(offsetof(cudaPointerAttributes, devicePointer) == offsetof(lc::CudaPointerAttributes, device_pointer));
static_assert(offsetof(cudaPointerAttributes, hostPointer) == offsetof(lc::CudaPointerAttributes, host_pointer));
#if CUDART_VERSION >= 13000
static_assert(sizeof(lc::CudaPointerAttributes) == sizeof(cudaPointerAttributes));
#endif

// Function signatures as NVIDIA declares them; Loom's pointers use int for
// the enums and opaque pointers for the handles (sizes checked above).
static_assert(std::is_same_v<decltype(&cudaGetDeviceCount), cudaError_t (*)(int*)>);
static_assert(std::is_same_v<decltype(&cudaDeviceGetAttribute), cudaError_t (*)(int*, cudaDeviceAttr, int)>);
static_assert(std::is_same_v<decltype(&cudaDeviceGetPCIBusId), cudaError_t (*)(char*, int, int)>);
static_assert(std::is_same_v<decltype(&cudaPointerGetAttributes),
                             cudaError_t (*)(cudaPointerAttributes*, const void*)>);
static_assert(std::is_same_v<decltype(&cudaLaunchHostFunc), cudaError_t (*)(cudaStream_t, cudaHostFn_t, void*)>);
static_assert(std::is_same_v<decltype(&cudaGetErrorString), const char* (*)(cudaError_t)>);
static_assert(std::is_same_v<decltype(&cudaStreamIsCapturing), cudaError_t (*)(cudaStream_t, cudaStreamCaptureStatus*)>);
static_assert(sizeof(cudaStreamCaptureStatus) == sizeof(int) && cudaStreamCaptureStatusNone == 0);
static_assert(std::is_same_v<cudaHostFn_t, void (*)(void*)>);
// The optional staging entries (kind is cudaMemcpyKind, an int-sized enum).
static_assert(std::is_same_v<decltype(&cudaMemcpyAsync),
                             cudaError_t (*)(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t)>);
static_assert(sizeof(cudaMemcpyKind) == sizeof(int));
static_assert(cudaMemcpyDefault == lc::kCudaMemcpyDefault);
static_assert(std::is_same_v<decltype(&cudaFreeHost), cudaError_t (*)(void*)>);
static_assert(std::is_same_v<decltype(static_cast<cudaError_t (*)(void**, size_t)>(&cudaMallocHost)),
                             cudaError_t (*)(void**, size_t)>);
// ncclMemAlloc / ncclMemFree's entries.
static_assert(std::is_same_v<decltype(static_cast<cudaError_t (*)(void**, size_t)>(&cudaMalloc)),
                             cudaError_t (*)(void**, size_t)>);
static_assert(std::is_same_v<decltype(&cudaFree), cudaError_t (*)(void*)>);
// ncclCommInitRank*'s current device.
static_assert(std::is_same_v<decltype(&cudaGetDevice), cudaError_t (*)(int*)>);
#if defined(__has_include)
#if __has_include(<cuda.h>)
#include <cuda.h>
// cuStreamWaitValue32_v2: CUresult, CUstream (== cudaStream_t), CUdeviceptr, cuuint32_t.
static_assert(std::is_same_v<decltype(&cuStreamWaitValue32_v2),
                             CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int)>);
static_assert(sizeof(CUresult) == sizeof(int));
static_assert(sizeof(CUdeviceptr) == sizeof(unsigned long long));
static_assert(sizeof(cuuint32_t) == sizeof(unsigned));
static_assert(CU_STREAM_WAIT_VALUE_GEQ == lc::kCuStreamWaitValueGeq);
#endif
#endif
static_assert(std::is_same_v<lc::CudaHostFn, void (*)(void*)>);

#if defined(__has_include)
#if __has_include(<nvml.h>)
#include <nvml.h>
#define LOOM_CHECKED_NVML 1
static_assert(sizeof(nvmlReturn_t) == sizeof(lc::NvmlReturn));
static_assert(NVML_SUCCESS == lc::kNvmlSuccess);
static_assert(NVML_ERROR_INVALID_ARGUMENT == lc::kNvmlErrorInvalidArgument);
static_assert(NVML_ERROR_NOT_SUPPORTED == lc::kNvmlErrorNotSupported);
static_assert(NVML_FEATURE_ENABLED == lc::kNvmlFeatureEnabled);
static_assert(NVML_NVLINK_DEVICE_TYPE_GPU == lc::kNvmlNvLinkRemoteGpu);
static_assert(NVML_NVLINK_DEVICE_TYPE_SWITCH == lc::kNvmlNvLinkRemoteSwitch);
static_assert(sizeof(nvmlEnableState_t) == sizeof(int));
static_assert(sizeof(nvmlIntNvLinkDeviceType_t) == sizeof(int));
static_assert(sizeof(nvmlPciInfo_t) == sizeof(lc::NvmlPciInfo));
static_assert(offsetof(nvmlPciInfo_t, busIdLegacy) == offsetof(lc::NvmlPciInfo, bus_id_legacy));
static_assert(offsetof(nvmlPciInfo_t, domain) == offsetof(lc::NvmlPciInfo, domain));
static_assert(offsetof(nvmlPciInfo_t, bus) == offsetof(lc::NvmlPciInfo, bus));
static_assert(offsetof(nvmlPciInfo_t, device) == offsetof(lc::NvmlPciInfo, device));
static_assert(offsetof(nvmlPciInfo_t, pciDeviceId) == offsetof(lc::NvmlPciInfo, pci_device_id));
static_assert(offsetof(nvmlPciInfo_t, pciSubSystemId) == offsetof(lc::NvmlPciInfo, pci_subsystem_id));
static_assert(offsetof(nvmlPciInfo_t, busId) == offsetof(lc::NvmlPciInfo, bus_id));
static_assert(std::is_same_v<decltype(&nvmlDeviceGetPciInfo_v3), nvmlReturn_t (*)(nvmlDevice_t, nvmlPciInfo_t*)>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetNvLinkState),
                             nvmlReturn_t (*)(nvmlDevice_t, unsigned, nvmlEnableState_t*)>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetNvLinkRemotePciInfo_v2),
                             nvmlReturn_t (*)(nvmlDevice_t, unsigned, nvmlPciInfo_t*)>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetNvLinkRemoteDeviceType),
                             nvmlReturn_t (*)(nvmlDevice_t, unsigned, nvmlIntNvLinkDeviceType_t*)>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetCudaComputeCapability), nvmlReturn_t (*)(nvmlDevice_t, int*, int*)>);
#endif
#endif

int main() {
#ifdef LOOM_CHECKED_NVML
  std::printf("CUDA runtime (CUDART_VERSION %d) and NVML declarations match\n", CUDART_VERSION);
#else
  std::printf("CUDA runtime (CUDART_VERSION %d) declarations match; nvml.h not installed, NVML not checked\n",
              CUDART_VERSION);
#endif
  return 0;
}
