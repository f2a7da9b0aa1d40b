#include "diag/params.h"

#include "core/config.h"

namespace loom::diag::params {
size_t trace_buffer_size() {
  int64_t n = env_int("LOOM_TRACE_BUFFER_SIZE", 1024);
  return n > 0 ? static_cast<size_t>(n) : 0;
}
bool fingerprints() { return env_bool("LOOM_FINGERPRINT", true); }
std::string dump_dir() { return env_string("LOOM_DUMP_DIR", ""); }
std::string diag_addr() { return env_string("LOOM_DIAG_ADDR", ""); }
bool dump_on_sigusr1() { return env_bool("LOOM_DUMP_ON_SIGUSR1", true); }
}  // namespace loom::diag::params
