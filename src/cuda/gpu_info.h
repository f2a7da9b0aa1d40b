// The GPUs of this host as NVML (and the CUDA runtime, when present) see
// them: PCI bus id, CUDA device index, compute capability and NVLink peers.
// Topology discovery (src/topology/discover.cc) turns this into NCCL-format
// <gpu> / <nvlink> elements.
#pragma once

#include <string>
#include <vector>

#include "cuda/cuda_loader.h"

namespace loom::cuda {

struct NvLinkPeer {
  std::string busid;     // normalized "dddd:bb:dd.f" of the far end
  int count = 0;         // active links to it
  bool nvswitch = false; // the far end is an NVSwitch, not a GPU
};

struct GpuInfo {
  std::string busid;     // normalized "dddd:bb:dd.f"
  int dev = -1;          // CUDA device index; NVML index when the runtime is absent
  int sm = 0;            // compute capability x10 (90 = H100); 0 unknown
  unsigned pci_device_id = 0;  // device id << 16 | vendor id
  std::vector<NvLinkPeer> links;  // in order of first appearance
};

struct GpuQuery {
  std::vector<GpuInfo> gpus;   // in NVML order
  std::vector<std::string> notes;  // per-GPU problems, for the log
};

// Empty when NVML is not available (loader.nvml() == null).
GpuQuery query_gpus(const CudaLoader& loader);

// "00000000:18:00.0" / "0000:18:00.0" -> "0000:18:00.0"; empty if malformed.
std::string normalize_gpu_busid(const char* text);

}  // namespace loom::cuda
