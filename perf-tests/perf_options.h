// Command line of the *_perf binaries: nccl-tests' flags plus Loom's own.
//
// nccl-tests flags: -b -e -f -i -n -w -m -c -d -o -r -z -a -T -J (same
// meanings and defaults as nccl-tests; -t/-g/-p/-G/-C/-R/-y/-N are accepted
// for scripts written for nccl-tests and ignored with a note, since a Loom
// rank is a process). Loom flags: -A ALGO, --sizes LIST, --json[=FILE],
// --csv[=FILE], --baseline mpi, --plot FILE.png, --progress, --oneway, --fresh,
// --ab ALGO, and -R (buffers from loom::mem_alloc).
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "loom/types.h"

namespace loom::perf {

// What a binary measures: a Collective, or nccl-tests' hypercube pattern
// (an all-gather made of log2(n) grouped send/recv exchanges).
enum class Bench { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kReduce, kAllToAll, kSendRecv, kHypercube };

const char* bench_name(Bench b);        // "allreduce", ..., "hypercube"
const char* bench_binary(Bench b);      // "all_reduce_perf", ...
bool bench_reduces(Bench b);            // uses -o
bool bench_rooted(Bench b);             // uses -r
// The Collective whose algorithm -A selects; false for p2p patterns.
bool bench_collective(Bench b, Collective* out);

// How -a combines per-rank times (nccl-tests: 0=rank 0, 1=avg, 2=min, 3=max).
enum class Average { kRank0 = 0, kAvg = 1, kMin = 2, kMax = 3 };

struct Options {
  size_t min_bytes = 32u << 20;   // -b
  size_t max_bytes = 32u << 20;   // -e
  double factor = 0;              // -f; 0 = add `step` instead
  size_t step = 1u << 20;         // -i
  std::vector<size_t> sizes;      // --sizes: explicit list, overrides -b/-e/-f/-i
  int iters = 20;                 // -n
  int warmup = 5;                 // -w
  int agg = 1;                    // -m: operations aggregated in one group per iteration
  int check = 1;                  // -c: verification runs per size (0 = none)
  DataType dt = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  int root = 0;
  // -d all / -o all / -r all (nccl-tests): the sweep runs once per type, per
  // op (reducing collectives) and per root (broadcast, reduce), in that
  // nesting; dt / op / root above then hold the combination being measured.
  bool all_types = false, all_ops = false, all_roots = false;
  bool blocking = false;          // -z
  Average average = Average::kAvg;  // -a
  double timeout_s = 0;           // -T: deadline of every wait (0 = LOOM_TIMEOUT)
  std::string algo;               // -A: "ring" or a full LOOM_ALGO spec
  bool json_stdout = false, csv_stdout = false;  // --json / --csv without a file
  std::string json_file, csv_file;  // -J FILE, --json=FILE, --csv=FILE
  bool baseline_mpi = false;      // --baseline mpi
  std::string plot_file;          // --plot FILE.png
  bool progress = false;          // --progress: progress lines even when stderr is not a TTY
  // --oneway (sendrecv_perf): even ranks send to rank + 1, odd ranks receive
  // from rank - 1, so every pair moves data in one direction only (the
  // traffic of a unidirectional iperf3); by default every rank sends and
  // receives at once (nccl-tests' pattern).
  bool oneway = false;
  // --fresh: the send buffer is rewritten before every timed operation, and
  // only the operations are timed. The nccl-tests loop reuses one unchanged
  // input, which a peer reading it in place (single copy) keeps in its own
  // cache from the call before; a training step writes its gradients or
  // activations anew between calls, so the peer reads lines another core
  // has just written (2-3x dearer here at 16 KiB - 256 KiB). Needs -z 1.
  bool fresh = false;
  // -R 1|2 (nccl-tests: register the buffers with the communicator): send
  // and receive buffers come from loom::mem_alloc, which peers of this host
  // map and read with plain loads instead of process_vm_readv.
  int local_register = 0;
  // --thp: buffers in whole 2 MiB pages, advised as transparent huge pages
  // (madvise); a single-copy read pins one page per 2 MiB instead of 512.
  bool thp = false;
  // --ab ALGO: also compare, per size, this run's algorithm (auto or -A) with
  // ALGO on a second communicator of the same ranks, timed out of place in
  // --ab-blocks alternating blocks inside this one process (so the host's
  // changes of pace hit both alike), and print the two times and their ratio.
  std::string ab_algo;
  int ab_blocks = 10;
  std::vector<std::string> notes;  // accepted-but-ignored flags, printed in the header
};

// Parses argv into *o. Returns -1 to go on, else the exit code to return
// (0 after --help, 2 after an error, which has been printed to stderr).
int parse_options(int argc, char** argv, Bench bench, Options* o);
void print_usage(FILE* out, const char* prog);

// The sizes (bytes) the sweep visits, in order.
std::vector<size_t> sweep_sizes(const Options& o);

// --ab: whether block `k` times A before B (even blocks) or B before A (odd):
// each side runs first in half the blocks, so the position cancels out.
bool ab_a_first(int k);

}  // namespace loom::perf
