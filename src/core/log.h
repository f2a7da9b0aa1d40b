// Logging by level and subsystem: LOOM_DEBUG=NONE|WARN|INFO|TRACE,
// LOOM_DEBUG_SUBSYS=INIT,COLL,... Lines look like
//   "host:pid:tid [rank] loom INFO INIT message".
// Log calls below the active level cost one integer comparison.
#pragma once

#include <fmt/format.h>

#include <string>

namespace loom {

enum class LogLevel : int { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

enum LogSubsys : unsigned {
  kLogInit = 1u << 0,
  kLogColl = 1u << 1,
  kLogP2p = 1u << 2,
  kLogShm = 1u << 3,
  kLogNet = 1u << 4,
  kLogBoot = 1u << 5,
  kLogEnv = 1u << 6,
  kLogTopo = 1u << 7,
  kLogTune = 1u << 8,
  kLogDiag = 1u << 9,
  kLogAll = ~0u,
};

namespace detail {
extern int g_log_level;        // initialised from env on first use
extern unsigned g_log_subsys;
void log_init_once();
void log_write(LogLevel level, unsigned subsys, const std::string& msg);
}  // namespace detail

// A warning is written whatever LOOM_DEBUG_SUBSYS says, as NCCL logs WARN
// for every subsystem (NCCL_DEBUG_SUBSYS=COLL still shows a failed
// bootstrap): subsystems only select INFO and TRACE lines.
inline bool log_enabled(LogLevel level, unsigned subsys) {
  detail::log_init_once();
  // Relaxed atomic loads (plain loads on x86): log_reinit may rewrite both
  // while other threads log (the shim maps NCCL_* names at its first init
  // while a unique id's root thread runs). Regression: TSan, a data race in
  // NcclCompat.AnUnusedUniqueIdWarnsNobody.
  return static_cast<int>(level) <= __atomic_load_n(&detail::g_log_level, __ATOMIC_RELAXED) &&
         (level == LogLevel::kWarn || (subsys & __atomic_load_n(&detail::g_log_subsys, __ATOMIC_RELAXED)) != 0);
}

// Re-reads LOOM_DEBUG / LOOM_DEBUG_SUBSYS (used after the shim maps NCCL_* names).
void log_reinit();

template <typename... Args>
void log(LogLevel level, unsigned subsys, fmt::format_string<Args...> f, Args&&... args) {
  if (!log_enabled(level, subsys)) return;
  detail::log_write(level, subsys, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace loom

#define LOOM_WARN(subsys, ...) ::loom::log(::loom::LogLevel::kWarn, subsys, __VA_ARGS__)
#define LOOM_INFO(subsys, ...) ::loom::log(::loom::LogLevel::kInfo, subsys, __VA_ARGS__)
#define LOOM_TRACE(subsys, ...) ::loom::log(::loom::LogLevel::kTrace, subsys, __VA_ARGS__)
