// The machine the mock NVML and mock CUDA runtime pretend to be, from
// LOOM_MOCK_GPUS = "<n>:<fabric>[:<sm>]":
//   nvswitch  each GPU has 18 NVLinks spread over 4 NVSwitches (DGX H100 style;
//             sm 90 unless given)
//   mesh      every pair of GPUs has 4 direct NVLinks (sm 80 unless given)
//   none      no NVLink (PCIe only; sm 80 unless given)
// Unset: "8:nvswitch". Bus ids are 0000:<0x10 + 0x10*i>:00.0 for GPU i and
// 0000:0<5+s>:00.0 for NVSwitch s; NVML and CUDA list GPUs in the same order.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace loom::mock {

struct MockLink {
  bool to_switch = false;
  int peer = -1;  // GPU index or switch index
};

struct MockGpu {
  std::string busid;  // "00000000:10:00.0" (NVML's 8-digit domain form)
  unsigned bus = 0;
  int sm = 0;
  unsigned pci_device_id = 0;
  std::vector<MockLink> links;
};

struct MockMachine {
  std::vector<MockGpu> gpus;
  int nswitches = 0;
  bool valid = true;
};

inline constexpr int kMockLinksPerGpu = 18;  // NVML_NVLINK_MAX_LINKS today
inline constexpr int kMockSwitches = 4;
inline constexpr int kMockMeshLinksPerPair = 4;

inline std::string mock_switch_busid(int s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "00000000:%02x:00.0", 5 + s);
  return buf;
}

inline MockMachine mock_machine() {
  MockMachine m;
  const char* env = std::getenv("LOOM_MOCK_GPUS");
  std::string spec = env != nullptr && *env != '\0' ? env : "8:nvswitch";
  int n = 0, sm = 0;
  char fabric[32] = {};
  int got = std::sscanf(spec.c_str(), "%d:%31[a-z]:%d", &n, fabric, &sm);
  std::string f = fabric;
  if (got < 2 || n < 0 || n > 15 || (f != "nvswitch" && f != "mesh" && f != "none")) {
    m.valid = false;
    return m;
  }
  if (got < 3) sm = f == "nvswitch" ? 90 : 80;
  m.nswitches = f == "nvswitch" ? kMockSwitches : 0;
  for (int i = 0; i < n; ++i) {
    MockGpu g;
    g.bus = 0x10u + 0x10u * static_cast<unsigned>(i);
    char buf[32];
    std::snprintf(buf, sizeof buf, "00000000:%02x:00.0", g.bus);
    g.busid = buf;
    g.sm = sm;
    g.pci_device_id = (sm >= 90 ? 0x2330u : 0x20b0u) << 16 | 0x10deu;
    if (f == "nvswitch") {
      for (int l = 0; l < kMockLinksPerGpu; ++l) g.links.push_back({true, l % kMockSwitches});
    } else if (f == "mesh") {
      for (int p = 0; p < n; ++p) {
        if (p == i) continue;
        for (int k = 0; k < kMockMeshLinksPerPair; ++k) g.links.push_back({false, p});
      }
    }
    m.gpus.push_back(std::move(g));
  }
  return m;
}

}  // namespace loom::mock
