// NCCL environment variables that users already set, given their Loom meaning.
//
// A LOOM_* variable the user set explicitly always wins; otherwise the NCCL_*
// value is copied (translated where the grammars differ) before the first
// communicator is created, so Loom's own config registry sees it. NCCL_*
// variables without a Loom meaning are listed once at INFO as ignored.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/log.h"
#include "shim/shim.h"
#include "topology/algo_override.h"

extern char** environ;

namespace loom::shim {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

// NCCL_DEBUG has VERSION and ABORT levels Loom does not; both mean "warnings".
std::string translate_debug(const std::string& v) {
  std::string u = upper(v);
  if (u == "VERSION" || u == "ABORT") return "WARN";
  return u;
}

}  // namespace

// NCCL_DEBUG_SUBSYS names the subsystems NCCL's way; three of Loom's have
// other names (GRAPH is TOPO, TUNING is TUNE, BOOTSTRAP is BOOT). The rest
// pass as they are: Loom's own names, and NCCL ones Loom has no lines for
// (ALLOC, CALL, PROXY, NVLS, REG, PROFILE, RAS), which Loom's logger
// ignores. Regression: passed through untranslated, NCCL_DEBUG_SUBSYS=TUNING
// named nothing Loom knows and so selected every subsystem
// (NcclShimEnv.DebugSubsystemNamesTranslate).
std::string translate_debug_subsys(const std::string& v) {
  static constexpr std::pair<std::string_view, std::string_view> kRenamed[] = {
      {"GRAPH", "TOPO"}, {"TUNING", "TUNE"}, {"BOOTSTRAP", "BOOT"}};
  std::string out;
  size_t start = 0;
  while (start <= v.size()) {
    size_t end = v.find(',', start);
    if (end == std::string::npos) end = v.size();
    std::string name = v.substr(start, end - start);
    start = end + 1;
    // The '^' (exclude) prefix belongs to the list, not to the first name.
    std::string prefix;
    if (out.empty() && !name.empty() && name[0] == '^') {
      prefix = "^";
      name.erase(0, 1);
    }
    const size_t first = name.find_first_not_of(" \t");
    name = first == std::string::npos ? "" : name.substr(first, name.find_last_not_of(" \t") - first + 1);
    for (const auto& [nccl, loom] : kRenamed)
      if (upper(name) == nccl) name = loom;
    out += (out.empty() && prefix.empty() ? "" : out.empty() ? prefix : ",") + name;
  }
  return out;
}

namespace {

struct Mapping {
  const char* nccl;
  const char* loom;
  std::string (*translate)(const std::string&);
};

std::string same(const std::string& v) { return v; }

// NCCL_SHM_DISABLE=1 keeps NCCL off /dev/shm between ranks of a host (the
// usual answer to a container's small /dev/shm); Loom's only other path
// between them is TCP, so it means LOOM_TRANSPORT=socket. Regression: it
// was ignored, and Loom kept using /dev/shm (NcclShimEnv.NcclVariablesMap
// ToLoomOnesOnce).
std::string translate_shm_disable(const std::string& v) { return v == "1" ? "socket" : ""; }

const Mapping kMappings[] = {
    {"NCCL_DEBUG", "LOOM_DEBUG", translate_debug},
    {"NCCL_DEBUG_SUBSYS", "LOOM_DEBUG_SUBSYS", translate_debug_subsys},
    {"NCCL_DEBUG_FILE", "LOOM_DEBUG_FILE", same},
    {"NCCL_ALGO", "LOOM_ALGO", nullptr},  // translated by translate_nccl_algo
    {"NCCL_SOCKET_IFNAME", "LOOM_SOCKET_IFNAME", same},
    {"NCCL_TOPO_FILE", "LOOM_TOPO_FILE", same},
    {"NCCL_TOPO_DUMP_FILE", "LOOM_TOPO_DUMP_FILE", same},
    {"NCCL_TOPO_DUMP_FILE_RANK", "LOOM_TOPO_DUMP_FILE_RANK", same},
    {"NCCL_SHM_DISABLE", "LOOM_TRANSPORT", translate_shm_disable},
};

// Read by the shim itself rather than mapped.
const char* const kShimOwned[] = {"NCCL_COMM_BLOCKING", "NCCL_COMM_ID"};

int level_of(const char* v) {
  if (v == nullptr) return 0;
  std::string u = upper(v);
  if (u == "TRACE") return 3;
  if (u == "INFO") return 2;
  if (u == "WARN" || u == "VERSION" || u == "ABORT") return 1;
  return 0;
}

int debug_level() {
  static const int level = [] {
    int l = level_of(std::getenv("LOOM_DEBUG"));
    return l != 0 ? l : level_of(std::getenv("NCCL_DEBUG"));
  }();
  return level;
}

}  // namespace

// NCCL_ALGO names the algorithms NCCL may use: "Ring", "Ring,Tree",
// "allreduce:tree;broadcast:ring", or "^NVLS" (exclusions). LOOM_ALGO forces
// one algorithm per collective (see topology/algo_override.h). So a list that
// keeps exactly one algorithm Loom has (ring, tree) becomes a LOOM_ALGO rule:
// global Ring forces ring for every NCCL_ALGO-governed collective, global Tree
// only allreduce (the only NCCL collective with a tree). Several allowed
// algorithms leave the choice to Loom's tuner; exclusions are not translated;
// CollNet*, NVLS*, PAT have no Loom counterpart. Dropped parts are reported.
std::string translate_nccl_algo(const std::string& v, std::vector<std::string>* dropped) {
  if (v.find('^') != std::string::npos) {
    dropped->push_back(v + " (exclusion lists are not translated)");
    return {};
  }
  static const char* const kRingColls[] = {"allreduce", "broadcast", "reduce", "allgather",
                                           "reducescatter"};
  std::vector<std::string> rules;
  size_t start = 0;
  while (start <= v.size()) {
    size_t end = v.find(';', start);
    if (end == std::string::npos) end = v.size();
    std::string entry = v.substr(start, end - start);
    start = end + 1;
    if (entry.empty()) continue;
    std::string coll;
    size_t colon = entry.find(':');
    if (colon != std::string::npos) {
      coll = lower(entry.substr(0, colon));
      entry = entry.substr(colon + 1);
    }
    std::vector<std::string> kept;
    size_t a = 0;
    while (a <= entry.size()) {
      size_t b = entry.find(',', a);
      if (b == std::string::npos) b = entry.size();
      std::string name = lower(entry.substr(a, b - a));
      a = b + 1;
      name.erase(std::remove(name.begin(), name.end(), ' '), name.end());
      if (name == "ring" || name == "tree") kept.push_back(name);
      else if (!name.empty()) dropped->push_back(name);
    }
    if (kept.size() != 1) {
      if (kept.size() > 1)
        dropped->push_back(entry + " (several algorithms allowed: Loom's tuner chooses)");
      continue;
    }
    if (!coll.empty()) {
      rules.push_back(coll + ":" + kept[0]);
    } else if (kept[0] == "tree") {
      rules.push_back("allreduce:tree");
    } else {
      for (const char* c : kRingColls) rules.push_back(std::string(c) + ":ring");
    }
  }
  std::string out;
  for (const std::string& r : rules) out += (out.empty() ? "" : ";") + r;
  if (!out.empty() && !topo::parse_algo_override(out).is_ok()) {
    dropped->push_back(v + " (no valid LOOM_ALGO equivalent)");
    return {};
  }
  return out;
}

bool log_enabled(LogLevel level) { return debug_level() >= static_cast<int>(level); }

// Through Loom's logger, so the shim's lines go where NCCL_DEBUG_FILE says
// (NCCL's debug.cc writes all of its output there) and NCCL_DEBUG_SUBSYS
// filters them like the rest. Regression: they went to stderr, whatever the
// file (NcclCompat.DebugOutputGoesWhereNcclDebugFileSays).
void log(LogLevel level, const std::string& msg, unsigned subsys) {
  const auto core_level = static_cast<loom::LogLevel>(static_cast<int>(level));
  if (loom::log_enabled(core_level, subsys)) loom::detail::log_write(core_level, subsys, msg);
}

std::optional<bool> blocking_from_env() {
  const char* v = std::getenv("NCCL_COMM_BLOCKING");
  if (v == nullptr) return std::nullopt;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 0);
  if (end == v || *end != '\0' || (x != 0 && x != 1)) {
    static std::once_flag warned;
    std::call_once(warned, [v] {
      if (log_enabled(LogLevel::kWarn))
        log(LogLevel::kWarn, std::string("NCCL_COMM_BLOCKING=") + v + " is not 0 or 1: ignored");
    });
    return std::nullopt;
  }
  return x == 1;
}

void apply_nccl_env() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> notes;
    for (const Mapping& m : kMappings) {
      const char* v = std::getenv(m.nccl);
      if (v == nullptr) continue;
      if (std::getenv(m.loom) != nullptr) {
        notes.push_back(std::string(m.nccl) + " ignored: " + m.loom + " is set");
        continue;
      }
      std::vector<std::string> dropped;
      std::string value = m.translate ? m.translate(v) : translate_nccl_algo(v, &dropped);
      for (const std::string& d : dropped)
        notes.push_back(std::string(m.nccl) + ": '" + d + "' has no Loom equivalent, ignored");
      if (value.empty()) continue;
      setenv(m.loom, value.c_str(), 0);
      notes.push_back(std::string(m.loom) + "=" + value + " (from " + m.nccl + ")");
    }
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      std::string_view entry(*e);
      if (entry.rfind("NCCL_", 0) != 0) continue;
      std::string name(entry.substr(0, entry.find('=')));
      bool known = std::any_of(std::begin(kMappings), std::end(kMappings),
                               [&](const Mapping& m) { return name == m.nccl; }) ||
                   std::any_of(std::begin(kShimOwned), std::end(kShimOwned),
                               [&](const char* n) { return name == n; });
      if (!known) notes.push_back(name + " has no meaning in Loom, ignored");
    }
    // Loom's logger may have read LOOM_DEBUG* already (a call that logged
    // before the first communicator, e.g. ncclMemAlloc loading CUDA): read
    // them again now that the NCCL_* values are in. Regression: the
    // NCCL_DEBUG* settings were then ignored for the whole process.
    loom::log_reinit();
    if (log_enabled(LogLevel::kInfo))
      for (const std::string& n : notes) log(LogLevel::kInfo, n, kLogEnv);
  });
}

}  // namespace loom::shim
