// A mock libnvidia-ml.so with only the functions Loom resolves
// (src/cuda/cuda_loader.cc), describing the machine of LOOM_MOCK_GPUS
// (mock_gpus.h). Types are Loom's own declarations of NVML's ABI.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "cuda/cuda_loader.h"
#include "mock_gpus.h"

using loom::cuda::NvmlDevice;
using loom::cuda::NvmlPciInfo;
using loom::cuda::NvmlReturn;
using loom::mock::MockMachine;

namespace {

constexpr NvmlReturn kUninitialized = 1;

MockMachine& machine() {
  static MockMachine m = loom::mock::mock_machine();
  return m;
}
bool g_init = false;

// Handles are 1-based indices disguised as pointers.
loom::mock::MockGpu* gpu_of(NvmlDevice d) {
  auto i = reinterpret_cast<uintptr_t>(d);
  if (i == 0 || i > machine().gpus.size()) return nullptr;
  return &machine().gpus[i - 1];
}

void fill_pci(NvmlPciInfo* p, const std::string& busid, unsigned bus, unsigned device_id) {
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->bus_id, sizeof p->bus_id, "%s", busid.c_str());
  std::snprintf(p->bus_id_legacy, sizeof p->bus_id_legacy, "%s", busid.c_str() + 4);
  p->bus = bus;
  p->pci_device_id = device_id;
}

}  // namespace

extern "C" {

NvmlReturn nvmlInit_v2() {
  if (!machine().valid) return 9;  // NVML_ERROR_DRIVER_NOT_LOADED: a bad LOOM_MOCK_GPUS
  g_init = true;
  return 0;
}

NvmlReturn nvmlShutdown() {
  g_init = false;
  return 0;
}

const char* nvmlErrorString(NvmlReturn r) {
  switch (r) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 9: return "Driver Not Loaded";
    default: return "Unknown Error";
  }
}

NvmlReturn nvmlDeviceGetCount_v2(unsigned* count) {
  if (!g_init) return kUninitialized;
  *count = static_cast<unsigned>(machine().gpus.size());
  return 0;
}

NvmlReturn nvmlDeviceGetHandleByIndex_v2(unsigned index, NvmlDevice* dev) {
  if (!g_init) return kUninitialized;
  if (index >= machine().gpus.size()) return loom::cuda::kNvmlErrorInvalidArgument;
  *dev = reinterpret_cast<NvmlDevice>(static_cast<uintptr_t>(index) + 1);
  return 0;
}

NvmlReturn nvmlDeviceGetPciInfo_v3(NvmlDevice dev, NvmlPciInfo* pci) {
  auto* g = gpu_of(dev);
  if (g == nullptr) return loom::cuda::kNvmlErrorInvalidArgument;
  fill_pci(pci, g->busid, g->bus, g->pci_device_id);
  return 0;
}

NvmlReturn nvmlDeviceGetCudaComputeCapability(NvmlDevice dev, int* major, int* minor) {
  auto* g = gpu_of(dev);
  if (g == nullptr) return loom::cuda::kNvmlErrorInvalidArgument;
  *major = g->sm / 10;
  *minor = g->sm % 10;
  return 0;
}

// Links past the GPU's last one (but below 18) exist and are down, as on a
// part with fewer links than NVML_NVLINK_MAX_LINKS; beyond that: out of range.
NvmlReturn nvmlDeviceGetNvLinkState(NvmlDevice dev, unsigned link, int* state) {
  auto* g = gpu_of(dev);
  if (g == nullptr) return loom::cuda::kNvmlErrorInvalidArgument;
  size_t max = std::max<size_t>(loom::mock::kMockLinksPerGpu, g->links.size());
  if (link >= max) return loom::cuda::kNvmlErrorInvalidArgument;
  if (machine().nswitches == 0 && g->links.empty()) return loom::cuda::kNvmlErrorNotSupported;
  *state = link < g->links.size() ? loom::cuda::kNvmlFeatureEnabled : 0;
  return 0;
}

NvmlReturn nvmlDeviceGetNvLinkRemotePciInfo_v2(NvmlDevice dev, unsigned link, NvmlPciInfo* pci) {
  auto* g = gpu_of(dev);
  if (g == nullptr || link >= g->links.size()) return loom::cuda::kNvmlErrorInvalidArgument;
  const loom::mock::MockLink& l = g->links[link];
  if (l.to_switch) {
    fill_pci(pci, loom::mock::mock_switch_busid(l.peer), 5u + static_cast<unsigned>(l.peer), 0x22a310deu);
  } else {
    const loom::mock::MockGpu& p = machine().gpus[static_cast<size_t>(l.peer)];
    fill_pci(pci, p.busid, p.bus, p.pci_device_id);
  }
  return 0;
}

NvmlReturn nvmlDeviceGetNvLinkRemoteDeviceType(NvmlDevice dev, unsigned link, int* type) {
  auto* g = gpu_of(dev);
  if (g == nullptr || link >= g->links.size()) return loom::cuda::kNvmlErrorInvalidArgument;
  *type = g->links[link].to_switch ? loom::cuda::kNvmlNvLinkRemoteSwitch : loom::cuda::kNvmlNvLinkRemoteGpu;
  return 0;
}

}  // extern "C"
