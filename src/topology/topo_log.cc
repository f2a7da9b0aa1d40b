#include "topology/topo_log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace loom::topo {

void topo_warn(const std::string& message) {
  const char* quiet = std::getenv("LOOM_TOPO_QUIET");
  if (quiet != nullptr && std::strcmp(quiet, "1") == 0) return;
  std::fprintf(stderr, "loom WARN TOPO %s\n", message.c_str());
}

}  // namespace loom::topo
