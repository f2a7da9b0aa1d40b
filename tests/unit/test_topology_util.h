// Helpers shared by the topology/tuner unit tests.
#pragma once

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace loom::topo::testing {

// ../shared/topologies next to the source tree (CTest sets LOOM_SOURCE_DIR).
inline std::string shared_topology(const std::string& name) {
  const char* src = std::getenv("LOOM_SOURCE_DIR");
  std::string dir = src != nullptr ? std::string(src) + "/../shared/topologies" : "/work/shared/topologies";
  return dir + "/" + name;
}

// Keeps expected warnings of hostile-input tests off stderr.
struct QuietTopo {
  QuietTopo() { setenv("LOOM_TOPO_QUIET", "1", 1); }
  ~QuietTopo() { unsetenv("LOOM_TOPO_QUIET"); }
};

}  // namespace loom::topo::testing
