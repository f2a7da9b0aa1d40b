// Warning output of the topology module.
//
// All topology warnings go through topo_warn() so that switching to the
// lead's logging API later is a one-line change here. Until then they are
// written to stderr with the "loom WARN TOPO" prefix. LOOM_TOPO_QUIET=1
// silences them (tests feed hostile input on purpose and would be noisy).
#pragma once

#include <string>

namespace loom::topo {

void topo_warn(const std::string& message);

}  // namespace loom::topo
