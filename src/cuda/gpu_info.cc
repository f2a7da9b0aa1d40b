#include "cuda/gpu_info.h"

#include <cstdio>
#include <cstring>

namespace loom::cuda {
namespace {

// NVML_NVLINK_MAX_LINKS is 18 in today's headers; future parts may have more.
// The sweep stops at the first link NVML calls out of range.
constexpr unsigned kMaxLinksProbed = 64;

std::string nvml_error(const NvmlApi& api, NvmlReturn r) {
  const char* t = api.error_string != nullptr ? api.error_string(r) : nullptr;
  return std::string(t != nullptr ? t : "NVML error") + " (" + std::to_string(r) + ")";
}

std::string busid_of(const NvmlPciInfo& pci) {
  // Prefer the bus id text; fall back to the numeric fields.
  char buf[sizeof pci.bus_id + 1] = {};
  std::memcpy(buf, pci.bus_id, sizeof pci.bus_id);
  std::string s = normalize_gpu_busid(buf);
  if (!s.empty()) return s;
  char num[32];
  std::snprintf(num, sizeof num, "%04x:%02x:%02x.0", pci.domain, pci.bus, pci.device);
  return num;
}

void add_link(GpuInfo& g, const std::string& busid, bool nvswitch) {
  for (NvLinkPeer& p : g.links) {
    if (p.busid == busid) {
      ++p.count;
      return;
    }
  }
  g.links.push_back({busid, 1, nvswitch});
}

}  // namespace

std::string normalize_gpu_busid(const char* text) {
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  char tail = 0;
  if (text == nullptr || std::sscanf(text, "%x:%x:%x.%x%c", &domain, &bus, &dev, &fn, &tail) != 4) return "";
  if (domain > 0xffff || bus > 0xff || dev > 0x1f || fn > 7) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", domain, bus, dev, fn);
  return buf;
}

GpuQuery query_gpus(const CudaLoader& loader) {
  GpuQuery q;
  const NvmlApi* api = loader.nvml();
  if (api == nullptr) return q;
  unsigned n = 0;
  if (NvmlReturn r = api->device_get_count(&n); r != kNvmlSuccess) {
    q.notes.push_back("nvmlDeviceGetCount: " + nvml_error(*api, r));
    return q;
  }
  std::vector<NvmlDevice> handles;
  for (unsigned i = 0; i < n; ++i) {
    NvmlDevice d = nullptr;
    NvmlPciInfo pci{};
    NvmlReturn r = api->device_get_handle_by_index(i, &d);
    if (r == kNvmlSuccess) r = api->device_get_pci_info(d, &pci);
    if (r != kNvmlSuccess) {
      q.notes.push_back("NVML GPU " + std::to_string(i) + " skipped: " + nvml_error(*api, r));
      continue;
    }
    GpuInfo g;
    g.busid = busid_of(pci);
    g.dev = static_cast<int>(i);
    g.pci_device_id = pci.pci_device_id;
    int major = 0, minor = 0;
    if (api->device_get_cuda_compute_capability(d, &major, &minor) == kNvmlSuccess) g.sm = major * 10 + minor;
    q.gpus.push_back(std::move(g));
    handles.push_back(d);
  }
  // CUDA's device order (what users pass to cudaSetDevice and what NCCL's
  // <gpu dev> means) can differ from NVML's (CUDA_VISIBLE_DEVICES,
  // CUDA_DEVICE_ORDER): match by bus id when the runtime is there. GPUs the
  // runtime does not see keep NVML's index, offset past the CUDA ones.
  if (const CudaRuntimeApi* rt = loader.runtime()) {
    for (GpuInfo& g : q.gpus) g.dev += loader.device_count();
    for (int d = 0; d < loader.device_count(); ++d) {
      char buf[64] = {};
      if (rt->device_get_pci_bus_id(buf, sizeof buf, d) != kCudaSuccess) continue;
      std::string b = normalize_gpu_busid(buf);
      for (GpuInfo& g : q.gpus) {
        if (g.busid != b) continue;
        g.dev = d;
        int major = 0, minor = 0;
        if (rt->device_get_attribute(&major, kCudaDevAttrComputeCapabilityMajor, d) == kCudaSuccess &&
            rt->device_get_attribute(&minor, kCudaDevAttrComputeCapabilityMinor, d) == kCudaSuccess)
          g.sm = major * 10 + minor;
      }
    }
  }
  for (size_t i = 0; i < q.gpus.size(); ++i) {
    GpuInfo& g = q.gpus[i];
    for (unsigned link = 0; link < kMaxLinksProbed; ++link) {
      int state = 0;
      NvmlReturn r = api->device_get_nvlink_state(handles[i], link, &state);
      if (r == kNvmlErrorInvalidArgument) break;  // past the last link
      if (r != kNvmlSuccess || state != kNvmlFeatureEnabled) continue;  // not supported / down
      NvmlPciInfo remote{};
      if (api->device_get_nvlink_remote_pci_info(handles[i], link, &remote) != kNvmlSuccess) continue;
      std::string peer = busid_of(remote);
      bool is_gpu = false;
      int type = -1;
      if (api->device_get_nvlink_remote_device_type != nullptr &&
          api->device_get_nvlink_remote_device_type(handles[i], link, &type) == kNvmlSuccess) {
        if (type != kNvmlNvLinkRemoteGpu && type != kNvmlNvLinkRemoteSwitch) continue;  // IBM NPU, unknown
        is_gpu = type == kNvmlNvLinkRemoteGpu;
      } else {
        // Older NVML: a far end that is one of our GPUs is a GPU, anything else a switch.
        for (const GpuInfo& o : q.gpus) is_gpu = is_gpu || o.busid == peer;
      }
      add_link(g, peer, !is_gpu);
    }
  }
  return q;
}

}  // namespace loom::cuda
