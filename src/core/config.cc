#include "core/config.h"

#include <fmt/format.h>
#include "core/log.h"

#include <algorithm>
#include <cstdlib>
#include <cerrno>
#include <climits>
#include <cctype>
#include <cstring>
#include <optional>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <unistd.h>

#include "bootstrap/socket.h"

namespace loom {
namespace {

std::vector<ParamInfo>& registry() {
  static std::vector<ParamInfo> r = {
      {"LOOM_TIMEOUT", "double", "300",
       "Deadline in seconds for every wait of an operation (connect, send, receive); "
       "on expiry the operation fails naming the peer and step, and the communicator is marked failed. "
       "0, a negative value or `inf`: no deadline (at most 1e7 s, ~116 days; larger values are clamped)."},
      {"LOOM_DEBUG", "string", "WARN", "Log level: NONE, WARN, INFO, TRACE (NCCL_DEBUG is honoured by the shim)."},
      {"LOOM_DEBUG_SUBSYS", "string", "ALL",
       "Comma list of subsystems to log: INIT, COLL, P2P, SHM, NET, BOOT, ENV, TOPO, TUNE, DIAG, ALL; ^ prefix excludes. "
       "Selects INFO and TRACE lines; warnings are always logged (as NCCL_DEBUG_SUBSYS)."},
      {"LOOM_DEBUG_FILE", "string", "", "Write logs to this file instead of stderr; %h = host, %p = pid."},
      {"LOOM_RANK", "int", "", "This process's rank (env bootstrap)."},
      {"LOOM_WORLD_SIZE", "int", "", "Number of ranks (env bootstrap)."},
      {"LOOM_ROOT_ADDR", "string", "", "host:port where rank 0 listens for the rendezvous (env bootstrap)."},
      {"LOOM_SHM_FIFO_BYTES", "bytes", "2M",
       "Size of each shared-memory FIFO between two ranks (one per direction). Must be the same on every rank of a "
       "host: ranks that differ fail at setup, naming it."},
      {"LOOM_COPY_STREAM_BYTES", "bytes", "auto",
       "Local copies (an out-of-place all_gather's or broadcast root's own block) of at least this size use streaming "
       "stores, which do not read the destination into the cache first; 0 disables. auto: a quarter of the "
       "last-level cache."},
      {"LOOM_SHM_FIFO_STEP_BYTES", "bytes", "auto",
       "Most bytes one FIFO write publishes (and one read consumes) at a time, so receiver and sender copy at once; "
       "0: no limit. auto: 256K when the host runs no more ranks than it has CPUs, else no limit."},
      {"LOOM_SHM_STREAM_STORES", "string", "auto",
       "How a rank writes what peers on its host read next: its FIFO steps to each peer (from 16 KiB) and its copies "
       "into scratch that peers map (a staged broadcast or all_gather block, in 256 KiB pieces). 1 streaming "
       "(non-temporal) stores, 0 cached stores, auto cached until 3 such copies of 16 KiB or more in a row run "
       "below 6 GB/s (the readers' cores do not share a cache with this one), then streaming, trying cached "
       "stores again after 1 ms, then at intervals doubling to 64 ms; chosen per FIFO and per communicator's "
       "scratch."},
      {"LOOM_SHM_SINGLE_COPY_BYTES", "bytes", "auto",
       "Messages between ranks of one host of at least this size are read directly from the sender's memory "
       "(process_vm_readv between processes, memcpy between threads: one copy instead of two); 0 disables. "
       "Applies to every message of the reducing collectives (allreduce, reduce_scatter, reduce) and of a broadcast "
       "of more than 2 ranks; set, it is also "
       "the default of LOOM_SHM_SINGLE_COPY_PLAIN_BYTES. auto: between processes never (the FIFO's two copies "
       "measured 2x faster than process_vm_readv for these ops); between threads of one process 256K when the "
       "host runs no more ranks than it has CPUs, else 0. Messages from mem_alloc memory, Loom's scratch "
       "included, still go single copy through a mapping: LOOM_SHM_MAP_SHARED. Must be the same on every rank "
       "(checked at init: the tuner prices single-copy messages from it)."},
      {"LOOM_SHM_SINGLE_COPY_PLAIN_BYTES", "bytes", "auto",
       "Single-copy threshold for the messages of the other collectives (all_gather, all_to_all, send/recv, "
       "2-rank broadcast), which the receiver only stores; 0 disables. auto: LOOM_SHM_SINGLE_COPY_BYTES if "
       "set; else between processes never (the FIFO measured 1.05-2x faster with a CPU per rank, copying in "
       "steps on both cores, and 1.1-1.5x oversubscribed, except send/recv at 1-16M); between threads "
       "256K (below it, reading freshly written data costs more than the FIFO's two copies; 16K suits inputs "
       "that never change between calls, as in nccl-tests' loop). Must be the same on every rank (checked at init)."},
      {"LOOM_CHUNK_BYTES", "bytes", "512K", "Pipelining chunk of chain and tree broadcast/reduce, of binomial broadcast, of the ring allreduce's slices and of the columns of Rabenseifner (allreduce, reduce_scatter) and of the recursive-doubling all_gather; set, it overrides the cost model's chunk. At least 4K (smaller values are refused with a warning); must be the same on every rank."},
      {"LOOM_TUNE_ALPHA_US", "double", "",
       "Cost model calibration: measured per-message latency (us) between ring neighbours; needs "
       "LOOM_TUNE_BW_GBPS too, one without the other or a value that is not a number fails init naming the "
       "variable; 0 is accepted (perf-tests/algo_sweep.sh prints fitted values). Unset: from the topology."},
      {"LOOM_TUNE_BW_GBPS", "double", "", "Cost model calibration: measured bandwidth (GB/s) between ring neighbours."},
      {"LOOM_TUNE_REDUCE_GBPS", "double", "", "Cost model calibration: measured reduction throughput (GB/s)."},
      {"LOOM_TUNE_CALIBRATE", "bool", "0",
       "1: each communicator measures ring-neighbour latency and bandwidth (8 B and 4 MiB ping-pongs) and the "
       "reduction throughput at init (tens of ms), agrees on the worst values across ranks and feeds them to the "
       "tuner; overrides LOOM_TUNE_ALPHA_US / LOOM_TUNE_BW_GBPS / LOOM_TUNE_REDUCE_GBPS."},
      {"LOOM_TUNE_HAND_OFF", "bool", "1",
       "With more ranks on the host than CPUs: each communicator times rounds of 8 B exchanges at init between "
       "ranks on different cores and on one core (1-5 ms), agrees on the slowest rank's figures and "
       "feeds the tuner the cost of waiting for a rank's turn on a core (it moves 3-10x with the host's "
       "context-switch cost). 0: the cost model's defaults."},
      {"LOOM_TUNE_PROBE_ALGOS", "bool", "1",
       "With more ranks on the host than CPUs (and LOOM_TUNE_HAND_OFF on): each communicator times, at init, "
       "the allreduce and all_gather algorithms the model prices within 4x of its best for a block of one float "
       "per rank (at least two; turns of 4 ops, 4 rounds; ~4 ms in all at 8 ranks on 2 cores), "
       "agrees on the mean over ranks and adds the difference between measured and modelled time to that "
       "algorithm's estimate at every size (8 ranks on 2 cores: the model put recursive doubling ahead of "
       "direct, which measured 0.71-0.89 of its time up to 1 KiB). Skipped when any rank has less than 10 s "
       "of its init deadline (LOOM_TIMEOUT) left. 0: the model alone."},
      {"LOOM_SHORT_PATH", "bool", "1",
       "Operations whose every message is its peer's only one in its direction (binomial and direct broadcast "
       "and reduce, the direct allreduce) and at most 2 KiB run on the executor's short path: each send "
       "written whole with its fingerprint header in one try, each receive taken whole if it has arrived, the "
       "rest handed to the general loop (8 ranks on 2 cores: broadcast 8 B 0.71-0.77 -> 0.63-0.65 us). Needs "
       "LOOM_FINGERPRINT. Per rank: both paths send the same bytes. 0: the general loop for every operation."},
      {"LOOM_ENGINE_SPIN_US", "int", "0",
       "Microseconds an idle progress engine polls for the next operation (yielding) before it sleeps; 0 = sleep at "
       "once (a thread blocked in Work::wait runs queued operations itself, so the engine only serves async use). "
       "Also how long the threads that wait for a CUDA-stream-ordered op's start (the stream reaching it) and end "
       "poll before they sleep (H200 host, 2 ranks, 8 B on a stream: 59 -> 50 us per call at 500)."},
      {"LOOM_MAX_QUEUED_OPS", "int", "1024",
       "Operations a communicator queues for its progress engine before a call that would queue one more blocks "
       "(until half have run), as a CUDA stream's launch queue blocks; 0 = unbounded. Without a bound, a loop of "
       "non-blocking calls grew the queue by ~400 B per op (1M ops: 420 MB) and paid page faults per op."},
      {"LOOM_SPIN", "int", "2000",
       "Progress polls before a waiting engine sleeps on its futex (lower = friendlier to oversubscribed cores)."},
      {"LOOM_SHM_SHARED_COPY", "bool", "1",
       "Shared single copy: a sender whose phase only sends writes half of a large (>= 512 KiB) single-copy "
       "message into the receiver while the receiver reads the other half (2-rank broadcast, send/recv); never "
       "with more ranks on the host than CPUs (the sender's half takes a core its readers need: measured 2x "
       "slower); 0 = the receiver copies alone."},
      {"LOOM_SHM_MAP_SHARED", "bool", "1",
       "A single-copy message from a buffer of loom::mem_alloc (ncclMemAlloc without CUDA) is read through a mapping of "
       "the sender's buffer (mapped once per buffer, pidfd_getfd + mmap) instead of by process_vm_readv per "
       "message, from 256 KiB even where LOOM_SHM_SINGLE_COPY_* leave messages to the FIFO (a reduced message "
       "between oversubscribed ranks: the receiver then reduces straight from the sender's buffer and the "
       "sender copies nothing); 0 = no mapping, process_vm_readv as the thresholds say. The receiving rank's "
       "setting decides. The tuner prices reduce_scatter's partial sums (Loom's scratch) and the staged direct "
       "all_gather and broadcast as mapped while it is on at every rank of the communicator."},
      {"LOOM_SHM_ANNOUNCED_MIN_BYTES", "bytes", "128K",
       "With more ranks than cores, the direct all_gather stages each rank's block once in its scratch and every "
       "peer on the host reads it from there through a mapping (one copy per reader instead of a FIFO copy in "
       "and out per pair): from this block size on (a reader with LOOM_SHM_MAP_SHARED=0 takes it through the "
       "FIFO); so does the direct broadcast's root with its buffer, from this size and once the op's data "
       "(ranks x bytes) outgrows LOOM_LLC_BYTES over (ranks per core)^2. Larger: no staging below it. Must be "
       "the same on every rank (checked at init)."},
      {"LOOM_LLC_BYTES", "bytes", "auto",
       "The host's last-level cache, as the cost model, the streaming-copy threshold (LOOM_COPY_STREAM_BYTES) "
       "and the direct broadcast's staging (LOOM_SHM_ANNOUNCED_MIN_BYTES) count it (a broadcast with more ranks "
       "than cores: over (ranks per core)^2). auto: CPU 0's from sysfs, 32M where the kernel does not say. Must "
       "be the same on every rank (checked at init)."},
      {"LOOM_SHM_SLOTS", "bool", "1",
       "Messages of up to 120 bytes travel in cache-line slots (stamp + payload in one line) instead of the FIFO; "
       "0 = FIFO for all. The receiving rank's setting decides (both ends read it from its segment)."},
      {"LOOM_SPIN_US", "int", "-1",
       "Microseconds a waiting rank keeps polling (after LOOM_SPIN polls) before it sleeps; -1 = auto: 200 when "
       "the communicator has no more ranks than this machine has CPUs, else 0. Sleeping and being woken costs "
       "tens of microseconds on a VM, more than a 1 MiB single-copy read takes."},
      {"LOOM_HOST_ID", "string", "",
       "Overrides the host identity (hash of hostname + boot id) so tests can fake several hosts."},
      {"LOOM_TRANSPORT", "string", "auto",
       "auto: shared memory between ranks of one host, TCP sockets between hosts; socket: TCP for every peer "
       "(tests, benchmarks); shm: shared memory only (init fails if a rank is on another host)."},
      {"LOOM_SOCKET_IFNAME", "string", "",
       "Interface for sockets (NCCL grammar: prefix list, ^ excludes, = exact). Unset: `get_unique_id`'s root picks "
       "as NCCL does (ib*, then any but lo/docker*, then docker*, then lo); other ranks listen on the interface that "
       "routes to the root."},
      {"LOOM_SOCKET_NSOCKS", "int", "2", "TCP streams per peer pair; each message is cut into slices spread over them."},
      {"LOOM_SOCKET_NTHREADS", "int", "2", "Progress threads per rank that move bytes between rings and sockets."},
      {"LOOM_SOCKET_SLICE_BYTES", "bytes", "64K",
       "Bytes sent on one stream before moving to the next (the connecting rank's value is used by both); 4 KiB to "
       "64 MiB, larger values are clamped with a warning."},
      {"LOOM_SOCKET_BUF_BYTES", "bytes", "4M", "Staging ring per peer and direction between the executor and the sockets."},
      {"LOOM_SOCKET_SOCKBUF", "bytes", "0",
       "SO_SNDBUF/SO_RCVBUF for data sockets; 0 keeps the kernel's autotuning (which grows beyond what a fixed "
       "value below net.core.wmem_max can reach)."},
      {"LOOM_SOCKET_DIRECT_BYTES", "bytes", "1M",
       "Messages at least this large skip the staging rings: progress threads send() from the source buffer and "
       "recv() into the destination (plain receives; reductions still read the ring). 0 = always stage."},
      // Diagnostics (src/diag, accessors in diag/params.h).
      {"LOOM_TRACE_BUFFER_SIZE", "int", "1024",
       "Flight recorder: operations kept per communicator (ring buffer shown by live queries and dumps); 0 = off."},
      {"LOOM_FINGERPRINT", "bool", "1",
       "Prepend a 32-byte operation fingerprint to each op's first message to each peer (to every send/recv "
       "message), so mismatched calls "
       "fail at once with both calls named (0 = off). Must be the same on every rank (checked at init)."},
      {"LOOM_DUMP_DIR", "string", "",
       "Directory for JSON diagnostic dumps (one file per rank, written on failure, timeout and SIGUSR1; read by "
       "loom-doctor analyze). Unset: no dump files."},
      {"LOOM_DIAG_ADDR", "string", "",
       "host:port of the live query server (loom-doctor status). Unset: the bootstrap address with port 28950, "
       "or an ephemeral port when taken; off = no server."},
      {"LOOM_DUMP_ON_SIGUSR1", "bool", "1",
       "Write a diagnostic dump when the process receives SIGUSR1 (only if the program has no SIGUSR1 handler)."},
      {"LOOM_LOOMRUN_GRACE", "double", "3", "loomrun: seconds to wait for the other ranks after one fails before killing them."},
      {"LOOM_CUDART_LIBRARY", "string", "",
       "CUDA runtime to dlopen (path or name). Unset: libcudart.so.13, then .so.12, then .so. Not found, or no "
       "device visible: Loom runs without CUDA (host buffers; the stream argument is ignored)."},
      {"LOOM_NVML_LIBRARY", "string", "",
       "NVML to dlopen for GPU discovery (bus ids, SM, NVLink peers). Unset: libnvidia-ml.so.1. Not found: the "
       "topology has no GPU details."},
  };
  return r;
}

}  // namespace

const std::vector<ParamInfo>& all_params() { return registry(); }

void log_environment() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!log_enabled(LogLevel::kInfo, kLogEnv)) return;
    int defaults = 0;
    for (const ParamInfo& p : registry()) {
      if (const char* v = env_raw(p.name)) LOOM_INFO(kLogEnv, "{}={}", p.name, v);
      else ++defaults;
    }
    LOOM_INFO(kLogEnv, "{} other LOOM_* variables at their defaults (loom-env lists them)", defaults);
  });
}

const char* env_raw(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

namespace {

// Once per variable: a malformed value and the default taken instead.
void warn_malformed(const char* name, const char* value, const char* what, const std::string& def) {
  static std::mutex mu;
  static std::set<std::string> warned;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (!warned.insert(name).second) return;
  }
  LOOM_WARN(kLogEnv, "{}={}: not {}; using the default {}", name, value, what, def);
}

}  // namespace

int64_t env_int(const char* name, int64_t def, int64_t lo, int64_t hi) {
  const char* v = env_raw(name);
  if (!v) return def;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0' || errno == ERANGE || x < lo || x > hi) {
    warn_malformed(name, v, fmt::format("an integer in [{}, {}]", lo, hi).c_str(), std::to_string(def));
    return def;
  }
  return x;
}

double env_double(const char* name, double def) {
  const char* v = env_raw(name);
  if (!v) return def;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  if (end == v || *end != '\0') {
    warn_malformed(name, v, "a number", fmt::format("{}", def));
    return def;
  }
  return x;
}

// A boolean's spellings (1/0 and any integer, true/false, yes/no, on/off);
// nullopt for anything else. Regression: anything but 0/false/no/off read as
// true ("0 " too).
static std::optional<bool> parse_bool(const char* v) {
  if (strcasecmp(v, "false") == 0 || strcasecmp(v, "no") == 0 || strcasecmp(v, "off") == 0) return false;
  if (strcasecmp(v, "true") == 0 || strcasecmp(v, "yes") == 0 || strcasecmp(v, "on") == 0) return true;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  if (end != v && *end == '\0') return x != 0;
  return std::nullopt;
}

bool env_bool(const char* name, bool def) {
  const char* v = env_raw(name);
  if (!v) return def;
  if (auto b = parse_bool(v)) return *b;
  warn_malformed(name, v, "a boolean (1/0, true/false, yes/no, on/off)", def ? "1" : "0");
  return def;
}

std::string env_string(const char* name, const std::string& def) {
  const char* v = env_raw(name);
  return v ? std::string(v) : def;
}

bool parse_bytes(const std::string& text, uint64_t* out) {
  // Digits (a fraction only with a suffix: 1.5K), then K/M/G with an
  // optional B. Regression: strtoull took "-8" as 2^64 - 8, and overflowed
  // products wrapped.
  if (text.empty() || !(std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.')) return false;
  char* end = nullptr;
  errno = 0;
  const bool fraction = text.find('.') != std::string::npos;
  const double xf = fraction ? std::strtod(text.c_str(), &end) : 0.0;
  const unsigned long long x = fraction ? 0 : std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str() || (!fraction && errno == ERANGE && x == ULLONG_MAX)) return false;
  uint64_t mult = 1;
  if (*end) {
    switch (*end) {
      case 'k': case 'K': mult = 1ull << 10; break;
      case 'm': case 'M': mult = 1ull << 20; break;
      case 'g': case 'G': mult = 1ull << 30; break;
      default: return false;
    }
    ++end;
    if (*end == 'i' && (end[1] == 'B' || end[1] == 'b')) ++end;  // KiB, MiB, GiB
    if (*end == 'B' || *end == 'b') ++end;
    if (*end) return false;
  } else if (fraction) {
    return false;  // "1.5" bytes
  }
  if (fraction) {
    const double v = xf * static_cast<double>(mult);
    if (!(v >= 0) || v >= 18446744073709551615.0) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }
  if (x > UINT64_MAX / mult) return false;
  *out = x * mult;
  return true;
}

bool parse_bytes_list(const std::string& text, std::vector<size_t>* out) {
  out->clear();
  size_t pos = 0;
  for (;;) {
    const size_t comma = text.find(',', pos);
    uint64_t v = 0;
    if (!parse_bytes(text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos), &v)) return false;
    out->push_back(static_cast<size_t>(v));
    if (comma == std::string::npos) return true;
    pos = comma + 1;
  }
}

std::optional<uint64_t> env_bytes_if_set(const char* name) {
  const char* v = env_raw(name);
  uint64_t x = 0;
  if (!v) return std::nullopt;
  if (parse_bytes(v, &x)) return x;
  warn_malformed(name, v, "a byte count (8, 64K, 1M, 1MiB)", "for this context");
  return std::nullopt;
}

uint64_t env_bytes(const char* name, uint64_t def) {
  const char* v = env_raw(name);
  uint64_t x = 0;
  if (!v) return def;
  if (parse_bytes(v, &x)) return x;
  // Regression: a malformed value (256KiB, 1e3) silently read as the default.
  warn_malformed(name, v, "a byte count (8, 64K, 1M, 1MiB)", std::to_string(def));
  return def;
}

namespace params {
// 0, a negative value or inf: no deadline (the longest one a clock can hold,
// ~116 days). Regression: LOOM_TIMEOUT=0 (a natural "no timeout"), -1, inf
// or 1e10 made every init fail within 0.1 s with "deadline passed", naming
// nothing about the variable (the huge ones overflowed the clock).
double timeout_s() {
  const double t = env_double("LOOM_TIMEOUT", 300.0);
  return (t > 0 && t < kMaxDeadlineS) ? t : kMaxDeadlineS;
}
uint64_t shm_fifo_bytes() { return env_bytes("LOOM_SHM_FIFO_BYTES", 2ull << 20); }
namespace {
constexpr uint64_t kSingleCopyBytes = 256ull << 10;
}  // namespace

int host_cores() { return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)); }

size_t host_llc_bytes() {
  if (auto v = env_bytes_if_set("LOOM_LLC_BYTES")) return static_cast<size_t>(*v);
  static const size_t bytes = [] {
    size_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 8; ++i) {
      const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
      std::ifstream level_f(dir + "level"), size_f(dir + "size");
      int level = 0;
      std::string size;
      if (!(level_f >> level) || !(size_f >> size) || size.empty()) continue;
      size_t v = std::strtoull(size.c_str(), nullptr, 10);
      const char unit = size.back();
      if (unit == 'K') v <<= 10;
      else if (unit == 'M') v <<= 20;
      if (level > best_level && v > 0) best_level = level, best = v;
    }
    return best > 0 ? best : size_t{32} << 20;
  }();
  return bytes;
}

uint64_t copy_stream_bytes() {
  // Measured, one core, 8 MiB copies cycling through 4 buffer pairs (64 MiB,
  // beyond the 32 MiB L3): memcpy 19-22 GB/s, streaming stores 26-27; one
  // pair (16 MiB, in cache): 44-48 against 36-39. A copy of a quarter of the
  // cache and up is taken to be part of a footprint that does not fit.
  return env_bytes("LOOM_COPY_STREAM_BYTES", host_llc_bytes() / 4);
}
bool oversubscribed(int local_ranks) { return local_ranks > host_cores(); }

size_t broadcast_cache_bytes(int local_ranks) {
  // Ranks taking turns on a core keep less of a pipelined FIFO broadcast in
  // cache the more of them share it; fitted on where the staged direct
  // broadcast (one copy in, one mapped read per receiver, a hand-off per
  // reader instead of one per chunk and hop) overtakes the binomial tree:
  // the LLC over (ranks per core)^2. Measured, AMD EPYC guest, 2 cores, 32
  // MiB L3, broadcast_perf -z 1 -A binomial --ab direct with staging forced
  // (staged / binomial in one process, three runs, performance.md Run 41,
  // docs/data/run41/broadcast-ab.txt), and from where this stages: 3 ranks
  // 256 KiB 1.21-1.42, 1 MiB 0.94-1.01, 4 MiB 0.59-0.71 (beyond 4.7 MiB); 4
  // ranks 1 MiB 1.18-1.26, 2 MiB 0.83-1.01, 4 MiB 0.74-0.78 (beyond 2 MiB);
  // 6 ranks 256 KiB 0.88-1.20, 1 MiB 0.65-0.75 (beyond 593 KiB); 8 ranks 256
  // KiB 0.69-0.79, 1 MiB 0.51-0.57, 128 KiB 1.33-1.66 against the tree the
  // tuner keeps there (beyond 256 KiB); 16 ranks 256 KiB 0.48-0.52 (from the
  // announced 128 KiB). The whole LLC until Run 41 (Run 36, an Intel guest,
  // had 8 ranks 1 MiB the other way round: binomial 214-252 us, staged
  // 324-343).
  const double llc = static_cast<double>(host_llc_bytes());
  const double per_core = static_cast<double>(local_ranks) / std::max(1, host_cores());
  return per_core <= 1 ? static_cast<size_t>(llc) : static_cast<size_t>(llc / (per_core * per_core));
}

int ranks_on_host_of(const std::vector<int>& host_of_rank, int rank, int nranks) {
  if (host_of_rank.empty()) return nranks;
  return static_cast<int>(std::count(host_of_rank.begin(), host_of_rank.end(), host_of_rank[static_cast<size_t>(rank)]));
}

uint64_t shm_fifo_step_bytes(int local_ranks) {
  if (auto v = env_bytes_if_set("LOOM_SHM_FIFO_STEP_BYTES")) return *v;
  // With a core per rank the receiver copies one step out while the sender
  // copies the next in. Measured, 2 ranks, min of 8-12 interleaved rounds,
  // unlimited -> 256K: allreduce 1/4/16 MiB 99.7/440/3733 -> 73.4/428/3645 us
  // (128K and 512K alike, all ahead of unlimited); broadcast through the FIFO
  // 1/4/16 MiB 66.2/365/4041 -> 58.0/338/3636. Oversubscribed, each step the
  // receiver waits for is a context switch: 8-rank chain broadcast 4 MiB
  // 3008 -> 3332 us with 256K steps, so no limit there.
  if (oversubscribed(local_ranks)) return 0;
  return 256ull << 10;
}

uint64_t shm_single_copy_bytes(int local_ranks) {
  if (auto v = env_bytes_if_set("LOOM_SHM_SINGLE_COPY_BYTES")) return *v;
  // Ranks that are threads of one process (their single copy is a memcpy
  // from the peer's buffer); between processes see shm_single_copy_xproc_bytes.
  // A reduced message read single copy saves the sender's copy into the FIFO but
  // not the receiver's work: it still lands the bytes (now by system call) and
  // reduces them. With a core per rank the sender's time is what is saved; with
  // more ranks than cores the total CPU per op is what counts, and it only adds
  // the system call, the page pinning and a sender parked until its reader runs.
  // Measured, 2 cores, forced off against 256K: reduce_scatter ring 8 ranks
  // 2 MiB 1930-1977 -> 1190-1217 us, 8 MiB 6524-7110 -> 5685-5897; allreduce
  // ring 4 ranks 2 MiB 1311-1320 -> 1058-1097, 8 ranks 8 MiB 13421-15051 ->
  // 12452-12815; recursive halving no slower anywhere.
  if (oversubscribed(local_ranks)) return 0;
  return kSingleCopyBytes;
}
uint64_t shm_single_copy_xproc_bytes(int local_ranks) {
  if (env_bytes_if_set("LOOM_SHM_SINGLE_COPY_BYTES")) return shm_single_copy_bytes(local_ranks);
  // Between processes, the messages of a reducing collective (allreduce,
  // reduce_scatter, reduce: RankSchedule::reduced_class, every message of
  // the op, since its stored ones carry blocks the op has just reduced) go
  // through the FIFO at every size. process_vm_readv pins every 4 KiB page
  // of the sender's buffer per message and copies lines still dirty in the
  // sender's cache, while the FIFO's two copies run on both cores at once
  // and pipeline through the shared cache (2 MiB per direction). Measured,
  // 2 ranks on 2 cores, ring, min of 3 interleaved runs, 256K-threshold
  // single copy against FIFO: allreduce 1 MiB 136 -> 62 us, 4 MiB 628 -> 311,
  // 16 MiB 4993 -> 2631, 64 MiB 18475 -> 12991 (inputs rewritten before every
  // call, --fresh -z 1: 1 MiB 120 -> 58, 16 MiB 4916 -> 2475); reduce_scatter
  // 1 MiB 82 -> 41, 16 MiB 2553 -> 1626. Broadcast too (its inner ranks
  // forward what they just received): 4 ranks on 2 cores, min of 3, 1 MiB
  // binomial 243 -> 130 us, chain 247 -> 163 (from 3 ranks only: a 2-rank
  // broadcast forwards nothing: its messages are stored ones, see
  // shm_single_copy_plain_xproc_bytes, which sends them through the FIFO
  // too with a CPU per rank). mem_alloc buffers still go mapped.
  (void)local_ranks;
  return 0;
}
uint64_t shm_single_copy_plain_bytes(int local_ranks) {
  if (auto v = env_bytes_if_set("LOOM_SHM_SINGLE_COPY_PLAIN_BYTES")) return *v;
  if (env_bytes_if_set("LOOM_SHM_SINGLE_COPY_BYTES")) return shm_single_copy_bytes(local_ranks);
  // 256K, with or without a CPU per rank. Single copy reads the sender's
  // buffer where its owner last wrote it. Data written just before the call
  // (gradients, activations, the previous op's result) sits dirty in the
  // owner's cache, and process_vm_readv pulls it across 2-3x slower than a
  // copy of lines it already holds (2 processes, 64 KiB: 10.4 us against
  // 3.3), while the FIFO's two user-space copies cope better. Measured with
  // inputs rewritten before every call (perf-tests --fresh), 2 ranks, 16K
  // against 256K here: allreduce 32 KiB 11.2 -> 6.1 us, 128 KiB 24.5 -> 15.6;
  // all_gather 32 KiB 6.4 -> 4.1, 128 KiB 14.2 -> 10.0; broadcast 128 KiB
  // 21.0 -> 10.0; send/recv 16 KiB 5.6 -> 3.7; equal from 256 KiB.
  // 16K measures faster only when the input never changes between calls, as
  // in nccl-tests' loop (all_gather 128 KiB 6.1 against 10.1 us): the reader
  // then keeps the lines in its own cache. LOOM_SHM_SINGLE_COPY_PLAIN_BYTES=16K
  // restores that for data that really is static. Oversubscribed, a sender
  // waiting for its reader's acknowledgement waits for a core too (4 ranks
  // on 2 cores: broadcast 64 KiB 10 -> 26 us at 16K).
  return kSingleCopyBytes;
}
uint64_t shm_single_copy_plain_xproc_bytes(int local_ranks) {
  if (env_bytes_if_set("LOOM_SHM_SINGLE_COPY_PLAIN_BYTES") || env_bytes_if_set("LOOM_SHM_SINGLE_COPY_BYTES"))
    return shm_single_copy_plain_bytes(local_ranks);
  // Between processes with a CPU per rank, the stored messages (all_gather,
  // all_to_all, send/recv) go through the FIFO too, now that its steps let
  // both cores copy at once (LOOM_SHM_FIFO_STEP_BYTES). Measured, 2 ranks,
  // slowest rank's time (-z 1 -a 3), min of 8-10 interleaved rounds, 256K
  // single copy against FIFO, us: all_gather 256K/1M/4M/16M/64M 20.6/53.3/
  // 223/2154/13132 against 11.4/47.1/204/2190/11626 (inputs rewritten each
  // call, --fresh: 22.2/72.0/232/2365 against 10.9/37.8/210/2594); all_to_all
  // 256K/1M/4M/16M/64M 23.9/71.6/288/2698/13162 against 16.6/54.6/264/2593/
  // 12875; send/recv 256K/1M/4M/16M 28.2/122/428/3448 against 16.5/80.5/356/
  // 3284; broadcast, in place (the root only sends: it writes half of a
  // single-copy message into the receiver), min / median of 30 rounds,
  // 1M/4M/16M 45.3/173/1746 against 31.0/120/1670, medians 98.1/260/2423
  // against 45.5/152/2096.
  // Oversubscribed too (run 18; until then single copy from 256K, after
  // all_gather at 8 ranks on 2 cores measured 1.3-2x faster by it, before the
  // FIFOs were really mapped at setup: that FIFO path still paid a page fault
  // per first touch). Measured, more ranks than the 2 cores, min of 3
  // interleaved rounds, FIFO against single copy from 256K, us:
  // all_gather -z 1, 4 ranks 256K/1M/4M/16M 53/115/573/3006 against
  // 58/178/596/4199, 8 ranks 145/339/1511/6965 against 190/393/1468/7852;
  // all_to_all -z 1, 4 ranks 46/129/627/3151 against 62/148/490/3512, 8 ranks
  // 158/418/1771/8120 against 243/394/2031/9066. The exception: send/recv at 4
  // ranks, 1M/4M/16M 231/1302/5594 against 187/903/5646 (at 8 ranks within
  // 3%), a ring shift whose messages pass the 2 MiB FIFO in turns.
  (void)local_ranks;
  return 0;
}

std::optional<uint64_t> chunk_bytes_if_set() {
  // A chunk of a few bytes pipelines element by element: LOOM_CHUNK_BYTES=0
  // ran a 4 MiB allreduce 75x slower in 18x the memory (and 1 GB would have
  // needed ~90 GB of schedule). Below kMinChunkBytes the value is refused.
  auto v = env_bytes_if_set("LOOM_CHUNK_BYTES");
  if (v && *v < kMinChunkBytes) {
    warn_malformed("LOOM_CHUNK_BYTES", env_raw("LOOM_CHUNK_BYTES"),
                   fmt::format("at least {} bytes", kMinChunkBytes).c_str(), "(the cost model's chunk)");
    return std::nullopt;
  }
  return v;
}
uint64_t chunk_bytes() { return chunk_bytes_if_set().value_or(512ull << 10); }
int spin_count() { return static_cast<int>(env_int("LOOM_SPIN", 2000)); }
int shm_shared_copy() { return env_bool("LOOM_SHM_SHARED_COPY", true) ? 1 : 0; }
int shm_slots() { return env_bool("LOOM_SHM_SLOTS", true) ? 1 : 0; }
int shm_stream_stores() {
  const std::string v = env_string("LOOM_SHM_STREAM_STORES", "auto");
  if (v.empty() || strcasecmp(v.c_str(), "auto") == 0) return -1;
  if (auto b = parse_bool(v.c_str())) return *b ? 1 : 0;
  warn_malformed("LOOM_SHM_STREAM_STORES", v.c_str(), "auto, 1 or 0", "auto");
  return -1;
}
int shm_map_shared() { return env_bool("LOOM_SHM_MAP_SHARED", true) ? 1 : 0; }
uint64_t shm_map_min_bytes() { return kSingleCopyBytes; }
uint64_t shm_announced_min_bytes() { return env_bytes("LOOM_SHM_ANNOUNCED_MIN_BYTES", 128ull << 10); }
int spin_us() { return static_cast<int>(env_int("LOOM_SPIN_US", -1)); }
int max_queued_ops() { return static_cast<int>(std::max<int64_t>(0, env_int("LOOM_MAX_QUEUED_OPS", 1024))); }  // int range
int engine_spin_us() { return static_cast<int>(env_int("LOOM_ENGINE_SPIN_US", 0)); }
std::string transport() { return env_string("LOOM_TRANSPORT", "auto"); }
int socket_nsocks() { return static_cast<int>(env_int("LOOM_SOCKET_NSOCKS", 2)); }
int socket_nthreads() { return static_cast<int>(env_int("LOOM_SOCKET_NTHREADS", 2)); }
uint64_t socket_slice_bytes() { return env_bytes("LOOM_SOCKET_SLICE_BYTES", 64ull << 10); }
uint64_t socket_buf_bytes() { return env_bytes("LOOM_SOCKET_BUF_BYTES", 4ull << 20); }
uint64_t socket_sockbuf() { return env_bytes("LOOM_SOCKET_SOCKBUF", 0); }
uint64_t socket_direct_bytes() { return env_bytes("LOOM_SOCKET_DIRECT_BYTES", 1ull << 20); }
bool tune_calibrate() { return env_bool("LOOM_TUNE_CALIBRATE", false); }
bool tune_hand_off() { return env_bool("LOOM_TUNE_HAND_OFF", true); }
bool tune_probe_algos() { return env_bool("LOOM_TUNE_PROBE_ALGOS", true); }
bool short_path() { return env_bool("LOOM_SHORT_PATH", true); }
}  // namespace params

}  // namespace loom
