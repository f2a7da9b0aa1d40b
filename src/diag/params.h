// Typed accessors for the diagnostics' LOOM_* variables (declared, with their
// docs, in the registry in core/config.cc).
#pragma once

#include <cstddef>
#include <string>

namespace loom::diag::params {
size_t trace_buffer_size();  // LOOM_TRACE_BUFFER_SIZE (operations kept per communicator; 0 = off)
bool fingerprints();         // LOOM_FINGERPRINT
std::string dump_dir();      // LOOM_DUMP_DIR
std::string diag_addr();     // LOOM_DIAG_ADDR
bool dump_on_sigusr1();      // LOOM_DUMP_ON_SIGUSR1
}  // namespace loom::diag::params
