// Helpers shared by Loom's tests: closed-form inputs and expected outputs
// (nccl-tests "verifiable" style: no reference rank), and a collective case
// runner used by the thread, process and netns matrices.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm.h"
#include "verifiable.h"

namespace loom::testing {

using verifiable::input_value;
using verifiable::expected_value;
using verifiable::fill;
// The average of fp16 / bf16 / fp8 is a sum of inputs pre-multiplied by
// T(1/n) (CommImpl::run_sub, as NCCL): for such (dt, op) scales every rank's
// input in place (n = inputs.size()) and returns true; else returns false.
// Schedule-level tests then run the sum, out of place, as the comm does.
bool premultiply_avg(std::vector<std::vector<std::byte>>& inputs, size_t count, DataType dt, RedOp op);
using verifiable::count_wrong_reduced;
using verifiable::count_wrong_copied;

struct Case {
  Collective coll = Collective::kAllReduce;
  DataType dt = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  size_t count = 0;
  bool in_place = false;
  int root = 0;
  // Buffers from loom::mem_alloc (peers read them through mappings) instead
  // of the heap.
  bool shared_buffers = false;
  std::string name() const;
};

// Runs one case on this rank of comm (every rank must run the same case) and
// checks the result in closed form. Returns an error naming the first wrong
// element, or ok.
Status run_case(Comm& comm, const Case& c);

// Every rank of comms (ranks as threads of this process, Comm::init_all) runs
// the cases in order on its own thread; a rank that fails aborts its
// communicator so the others do not wait for it. Returns each rank's first
// error ("case: status"), "" where all passed.
std::vector<std::string> run_cases_on_threads(std::vector<std::unique_ptr<Comm>>& comms,
                                              const std::vector<Case>& cases);

// The correctness matrix of the foundation issue: every collective x dtype x op
// x count x in/out-of-place. `big` is the 1M+3 count; see the .cc for which
// cases run at that size.
std::vector<Case> correctness_matrix(int nranks, bool include_big);

// Every count x collective in order, alternating int8 / float, one case in
// three in place (not send/recv), the root cycling over the ranks: the mixed
// sequences the transport tests run (message sizes on both sides of the
// single-copy thresholds, FIFO wrap points moving between messages).
std::vector<Case> mixed_cases(int nranks, const std::vector<size_t>& counts, const std::vector<Collective>& colls,
                              bool shared_buffers = false);

}  // namespace loom::testing

namespace loom::testing {

// Forks n processes; child r runs body(r) and exits with its return value.
// Returns the children's wait statuses (the parent reaps them).
struct ChildResult {
  int status = 0;
  std::string output;  // what the child wrote to its result pipe
};
// A child still running at timeout_s is killed; its output then ends with
// "[test harness: killed after timeout]" and where_stuck()'s report.
// after_fork runs in the parent once every child is forked: start a test's
// helper threads there, never before. A fork while another thread of the
// parent holds a lock leaves that lock held forever in the child (ASan's
// allocator keeps a lock per size class and has no fork handler: a child's
// rendezvous root thread blocked in its first allocation of a size class,
// and every rank timed out at the rendezvous, netns_doctor and netns_faults
// under ASan, whose link cutter thread was running when the ranks forked).
// A process with more than one thread (two in TSan builds: TSan's own) is not forked at all: every result
// then reads as an exit with kRefusedToFork and says why.
constexpr int kRefusedToFork = 99;
std::vector<ChildResult> run_processes(int n, const std::function<int(int rank, int result_fd)>& body,
                                       int timeout_s = 600, const std::function<void()>& after_fork = {});
// Where a running process is stuck: each thread's name, state and kernel
// wait channel, then every thread's stack when gdb is installed.
std::string where_stuck(pid_t pid);

// get_unique_id(), with the rendezvous root in a helper process instead of a
// thread of this one. run_processes forks ranks; a fork while another thread
// holds an allocator lock leaves the child deadlocked on its first malloc
// (glibc guards against it, ASan's allocator does not: the multi-process tests
// hung now and then under ASan). The helper is forked while this process has
// no other thread, serves the rendezvous, and is killed at the next call or at
// exit.
Result<UniqueId> unique_id();

// $LOOM_BUILD_DIR/bin/<name> (CTest sets LOOM_BUILD_DIR).
std::string build_bin(const std::string& name);
// Runs a shell command; returns what it wrote to stdout.
std::string run_command(const std::string& cmd);

// A loopback TCP port that is free now and lies below the kernel's ephemeral
// range (net.ipv4.ip_local_port_range), for a test that hands a fixed root
// port to ranks it starts. A port from bind(0) is an ephemeral one: between
// releasing it and rank 0 binding it, another rank's own bind(0) or connect()
// can take it. Regression: EnvBootstrap.OpenMpi failed in CI with "bind
// 127.0.0.1:37099: Address already in use". Returns 0 if none was found.
// `seed` picks the first port tried (default: this process's pid).
int unused_loopback_port();
int unused_loopback_port(unsigned seed);
// The ports it searches: [first, end), end = where the ephemeral range starts.
std::pair<int, int> loopback_port_band();

// Names of /dev/shm entries Loom creates ("loom-*") whose creating process
// has exited: segments left behind. A segment whose creator still runs
// belongs to a live communicator, e.g. another test's under ctest -j, and is
// not counted (regression: test_kill and netns_doctor failed under ctest -j2
// on a concurrently running test's segments).
std::vector<std::string> loom_shm_segments();

}  // namespace loom::testing
