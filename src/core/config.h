// One typed registry of every LOOM_* environment variable.
//
// Each variable is declared once (name, type, default, doc) with LOOM_PARAM in
// config.cc; `loom-env --markdown` prints docs/env.md from the registry, and
// the variables that are set are logged at INFO under the ENV subsystem
// (log_environment, at the first communicator of a process).
#pragma once

#include <cstdint>
#include <climits>
#include <optional>
#include <string>
#include <vector>

namespace loom {

struct ParamInfo {
  const char* name;      // "LOOM_TIMEOUT"
  const char* type;      // "int", "double", "string", "bytes", "bool"
  const char* def;       // default as text
  const char* doc;       // one-line description
};

// All declared parameters, in declaration order.
const std::vector<ParamInfo>& all_params();
// Logs (INFO ENV) every declared variable that is set, with its value, and
// the count of the others (at their defaults). Once per process.
void log_environment();

// Raw lookup: the environment value, or nullptr when unset or empty.
const char* env_raw(const char* name);

// Typed lookups: the default when unset; a value that does not parse (or,
// env_int, lies outside [lo, hi]) is warned about once per variable
// (WARN ENV, naming it and the default taken) and reads as the default.
int64_t env_int(const char* name, int64_t def, int64_t lo = INT32_MIN, int64_t hi = INT32_MAX);
double env_double(const char* name, double def);
// 1/0, true/false, yes/no, on/off (any case), or an integer (0 = false).
bool env_bool(const char* name, bool def);
std::string env_string(const char* name, const std::string& def);
// Accepts plain numbers and K/M/G suffixes (powers of 1024; KiB/MiB/GiB too).
uint64_t env_bytes(const char* name, uint64_t def);
// The value when set and well formed; nullopt when unset or malformed
// (warned as above). For parameters whose default depends on the context:
// a malformed value keeps the contextual default, not a fixed one.
std::optional<uint64_t> env_bytes_if_set(const char* name);
// Parses "64K", "1M", "1MiB", "8" -> bytes; false on malformed input.
bool parse_bytes(const std::string& text, uint64_t* out);
// Parses "8,4K,1M" (parse_bytes per item); false on an empty list or item.
bool parse_bytes_list(const std::string& text, std::vector<size_t>* out);

// Typed accessors for the registered parameters (defaults live in config.cc).
namespace params {
double timeout_s();          // LOOM_TIMEOUT
uint64_t shm_fifo_bytes();   // LOOM_SHM_FIFO_BYTES
// LOOM_SHM_FIFO_STEP_BYTES: most bytes per FIFO write/read (0: unlimited).
uint64_t shm_fifo_step_bytes(int local_ranks);
// LOOM_SHM_SINGLE_COPY_BYTES (messages the receiver reduces) and
// LOOM_SHM_SINGLE_COPY_PLAIN_BYTES (messages the receiver stores); 0 = never.
// Their defaults depend on how many ranks share this host's CPUs.
uint64_t shm_single_copy_bytes(int local_ranks);
// CPUs online on this host, which its ranks share.
int host_cores();
// The last-level cache of CPU 0: LOOM_LLC_BYTES, else sysfs (32 MiB when the
// kernel does not say).
size_t host_llc_bytes();
// LOOM_COPY_STREAM_BYTES: local copies of at least this many bytes use
// streaming stores (kernels::stream_copy); 0 = never. Default: a quarter of
// the last-level cache.
uint64_t copy_stream_bytes();
// More ranks on this host than it has CPUs online.
bool oversubscribed(int local_ranks);
// The cache a broadcast of `local_ranks` ranks on this host can keep its
// FIFO chunks in: host_llc_bytes() with a CPU per rank, over (ranks per
// CPU)^2 with more (fitted, config.cc). The cost model's FIFO discount
// (CommCost::llc_bytes) and the direct broadcast's staging threshold
// (stages_broadcast) both read it.
size_t broadcast_cache_bytes(int local_ranks);
// The ranks on `rank`'s host (host_of_rank[r]: rank r's host; empty: one host).
int ranks_on_host_of(const std::vector<int>& host_of_rank, int rank, int nranks);
// Reduced messages between ranks in different processes (the tuner's case).
uint64_t shm_single_copy_xproc_bytes(int local_ranks);
uint64_t shm_single_copy_plain_bytes(int local_ranks);
// Stored messages between processes (default: never with a CPU per rank,
// else LOOM_SHM_SINGLE_COPY_PLAIN_BYTES's default; either variable set, its value).
uint64_t shm_single_copy_plain_xproc_bytes(int local_ranks);
uint64_t chunk_bytes();      // LOOM_CHUNK_BYTES
// LOOM_CHUNK_BYTES when set, well formed and at least kMinChunkBytes (else
// warned about and nullopt: the cost model's chunk stays).
inline constexpr uint64_t kMinChunkBytes = 4096;
std::optional<uint64_t> chunk_bytes_if_set();
int spin_count();            // LOOM_SPIN
int engine_spin_us();        // LOOM_ENGINE_SPIN_US
int max_queued_ops();        // LOOM_MAX_QUEUED_OPS (0 = unbounded)
int spin_us();               // LOOM_SPIN_US (-1: auto)
int shm_shared_copy();       // LOOM_SHM_SHARED_COPY
int shm_slots();             // LOOM_SHM_SLOTS (small messages in cache-line slots; 1 = on)
int shm_stream_stores();     // LOOM_SHM_STREAM_STORES (-1 auto, 0 cached, 1 streaming FIFO stores)
int shm_map_shared();        // LOOM_SHM_MAP_SHARED (read mem_alloc buffers through a mapping; 1 = on)
uint64_t shm_map_min_bytes();  // messages from mem_alloc buffers go mapped single copy from this size
// Announced messages (Step::announced: a block staged once in scratch for
// many readers) go mapped from this size instead (LOOM_SHM_ANNOUNCED_MIN_BYTES).
uint64_t shm_announced_min_bytes();
std::string transport();     // LOOM_TRANSPORT: auto | shm | socket
int socket_nsocks();         // LOOM_SOCKET_NSOCKS
int socket_nthreads();       // LOOM_SOCKET_NTHREADS
uint64_t socket_slice_bytes();  // LOOM_SOCKET_SLICE_BYTES
uint64_t socket_buf_bytes();    // LOOM_SOCKET_BUF_BYTES
uint64_t socket_sockbuf();      // LOOM_SOCKET_SOCKBUF
uint64_t socket_direct_bytes();  // LOOM_SOCKET_DIRECT_BYTES
bool tune_calibrate();  // LOOM_TUNE_CALIBRATE
bool tune_hand_off();   // LOOM_TUNE_HAND_OFF
bool tune_probe_algos();  // LOOM_TUNE_PROBE_ALGOS
bool short_path();  // LOOM_SHORT_PATH (Executor::run_short)
}  // namespace params

}  // namespace loom
