#include "core/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "core/config.h"

namespace loom {
namespace detail {

int g_log_level = -1;
unsigned g_log_subsys = kLogAll;

namespace {
std::mutex g_mu;
FILE* g_out = nullptr;

struct SubsysName {
  const char* name;
  unsigned bit;
};
constexpr SubsysName kSubsys[] = {{"INIT", kLogInit}, {"COLL", kLogColl}, {"P2P", kLogP2p},
                                  {"SHM", kLogShm},   {"NET", kLogNet},   {"BOOT", kLogBoot},
                                  {"ENV", kLogEnv},   {"TOPO", kLogTopo}, {"TUNE", kLogTune},
                                  {"DIAG", kLogDiag}, {"ALL", kLogAll}};

const char* subsys_name(unsigned s) {
  for (const auto& e : kSubsys)
    if (e.bit == s) return e.name;
  return "ALL";
}

void configure() {
  std::string lvl = env_string("LOOM_DEBUG", "WARN");
  for (auto& c : lvl) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
  int level = 1;
  if (lvl == "NONE") level = 0;
  else if (lvl == "WARN" || lvl == "VERSION") level = 1;
  else if (lvl == "INFO") level = 2;
  else if (lvl == "TRACE") level = 3;
  std::string sub = env_string("LOOM_DEBUG_SUBSYS", "ALL");
  unsigned mask = 0;
  bool exclude = !sub.empty() && sub[0] == '^';
  if (exclude) sub = sub.substr(1);
  size_t pos = 0;
  while (pos <= sub.size()) {
    size_t comma = sub.find(',', pos);
    std::string tok = sub.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    // "COLL, INIT": the space is not part of the name (regression: INIT was dropped).
    tok.erase(0, tok.find_first_not_of(" \t"));
    tok.erase(tok.find_last_not_of(" \t") + 1);
    for (auto& c : tok) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
    for (const auto& e : kSubsys)
      if (tok == e.name) mask |= e.bit;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  // No known name: everything. Excluding only unknown names (NCCL's
  // ^GRAPH, copied from NCCL_DEBUG_SUBSYS) excludes nothing. Regression: it
  // excluded everything, WARN included.
  __atomic_store_n(&g_log_subsys, exclude ? ~mask : (mask == 0 ? kLogAll : mask), __ATOMIC_RELAXED);
  std::string file = env_string("LOOM_DEBUG_FILE", "");
  if (g_out && g_out != stderr) fclose(g_out);
  g_out = stderr;
  if (!file.empty()) {
    std::string path;
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    for (size_t i = 0; i < file.size(); ++i) {
      if (file[i] == '%' && i + 1 < file.size() && file[i + 1] == 'h') { path += host; ++i; }
      else if (file[i] == '%' && i + 1 < file.size() && file[i + 1] == 'p') { path += std::to_string(getpid()); ++i; }
      else path += file[i];
    }
    if (FILE* f = fopen(path.c_str(), "a")) g_out = f;
  }
  __atomic_store_n(&g_log_level, level, __ATOMIC_RELEASE);
}
}  // namespace

void log_init_once() {
  if (__atomic_load_n(&g_log_level, __ATOMIC_ACQUIRE) >= 0) return;
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_log_level < 0) configure();
}

void log_write(LogLevel level, unsigned subsys, const std::string& msg) {
  static const char* kNames[] = {"NONE", "WARN", "INFO", "TRACE"};
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  std::string line = fmt::format("{}:{}:{} loom {} {} {}\n", host, getpid(), static_cast<long>(syscall(SYS_gettid)),
                                 kNames[static_cast<int>(level)], subsys_name(subsys), msg);
  std::lock_guard<std::mutex> lk(g_mu);
  fputs(line.c_str(), g_out ? g_out : stderr);
  fflush(g_out ? g_out : stderr);
}

}  // namespace detail

void log_reinit() {
  std::lock_guard<std::mutex> lk(detail::g_mu);
  detail::configure();
}

}  // namespace loom
