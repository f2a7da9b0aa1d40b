// loomrun's behaviour (prefixes, failure summary, ending the other ranks) and
// the environment bootstrap under the variable names of torchrun, Open MPI and
// Slurm.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/test_util.h"

namespace loom {
namespace {

std::string build_dir() {
  const char* d = getenv("LOOM_BUILD_DIR");
  return d ? d : "build";
}

// Runs a shell command, returns (exit status, combined output).
std::pair<int, std::string> run(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, ""};
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}

TEST(Loomrun, PrefixesOutputAndSucceeds) {
  auto [rc, out] = run(build_dir() + "/bin/loomrun -n 3 sh -c 'echo hello from $LOOM_RANK of $LOOM_WORLD_SIZE'");
  EXPECT_EQ(rc, 0) << out;
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(out.find("[" + std::to_string(r) + "] hello from " + std::to_string(r) + " of 3"), std::string::npos) << out;
}

// A rank's stderr goes to loomrun's stderr, its stdout to stdout, each line
// prefixed, as mpirun keeps them. Regression: both went to stdout, so a
// benchmark's warnings landed inside the CSV or JSON it printed there
// (`loomrun ... all_reduce_perf --csv > out.csv`).
TEST(Loomrun, KeepsTheRanksStderrApart) {
  const std::string ranks = " -n 2 sh -c 'echo out $LOOM_RANK; echo err $LOOM_RANK >&2; printf tail$LOOM_RANK >&2'";
  // run() adds 2>&1 at the end: each command routes its streams in a subshell.
  auto [rc, out] = run("(" + build_dir() + "/bin/loomrun" + ranks + " 2>/dev/null)");
  EXPECT_EQ(rc, 0) << out;
  for (int r = 0; r < 2; ++r) EXPECT_NE(out.find("[" + std::to_string(r) + "] out " + std::to_string(r)), std::string::npos) << out;
  EXPECT_EQ(out.find("err"), std::string::npos) << out;
  EXPECT_EQ(out.find("tail"), std::string::npos) << out;
  auto [rc2, err] = run("(" + build_dir() + "/bin/loomrun --no-prefix" + ranks + " 2>&1 >/dev/null)");
  EXPECT_EQ(rc2, 0) << err;
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(err.find("err " + std::to_string(r) + "\n"), std::string::npos) << err;
    EXPECT_NE(err.find("tail" + std::to_string(r) + "\n"), std::string::npos) << err;  // an unterminated last line
  }
  EXPECT_EQ(err.find("out"), std::string::npos) << err;
}

// A rank SIGKILLed inside shm setup (its segment created, not yet unlinked:
// tests/common/kill_in_shm_setup.cc) leaves /dev/shm/loom-<secret>-<rank>-<pid>;
// loomrun removes it once the ranks have exited, and says so. Regression: the
// segment stayed (up to GiBs with large FIFOs) and nothing could tell whose.
TEST(Loomrun, RemovesTheSegmentOfARankKilledInShmSetup) {
  const std::string preload = build_dir() + "/tests/mock/libloom_kill_in_shm_setup.so";
  if (access(preload.c_str(), R_OK) != 0) GTEST_SKIP() << "no " << preload << " (sanitizer build)";
  auto [rc, out] = run("env LD_PRELOAD=" + preload + " LOOM_TEST_KILL_RANK=1 LOOM_TIMEOUT=20 " + build_dir() +
                       "/bin/loomrun -n 2 " + build_dir() + "/bin/all_reduce_perf -b 8 -e 8 -n 1 -w 0");
  EXPECT_EQ(rc, 137) << out;
  const size_t at = out.find("rank 1 (pid ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string pid = std::to_string(atol(out.c_str() + at + 12));
  EXPECT_NE(out.find("loomrun: removed /dev/shm/loom-"), std::string::npos) << out;
  EXPECT_NE(out.find("-1-" + pid + ", left by rank 1 (pid " + pid + "), which ended inside its shared-memory setup"),
            std::string::npos) << out;
  auto [lsrc, left] = run("ls /dev/shm | grep -- '-" + pid + "$' || true");
  EXPECT_EQ(left, "") << "segments of rank 1 still in /dev/shm";
}

// Bad arguments are refused with exit 2 and a reason, before any rank
// starts. Regressions: -n 2x ran 2 ranks, -n 4294967297 ran one (atoi),
// --grace abc and 1e7 meant no grace at all (atof, an int overflow), and a
// mistyped option (--no-prefx) was run as the program (exit 127 per rank).
TEST(Loomrun, RefusesBadArguments) {
  const std::string loomrun = build_dir() + "/bin/loomrun ";
  const std::pair<const char*, const char*> cases[] = {
      {"-n 2x true", "-n '2x'"},
      {"-n 4294967297 true", "from 1 to 4096"},
      {"-n 0 true", "from 1 to 4096"},
      {"-n 2 --no-prefx true", "unknown option '--no-prefx'"},
      {"--grace abc -n 2 true", "--grace 'abc'"},
      {"--grace 1e7 -n 2 true", "--grace '1e7'"},
      {"--grace -5 -n 2 true", "--grace '-5'"},
      {"-n 2 --bind sometimes true", "--bind 'sometimes'"},
      {"-n 2", "no program to run"},
      {"true", "-n N is required"},
  };
  for (const auto& [args, why] : cases) {
    auto [rc, out] = run(loomrun + args);
    EXPECT_EQ(rc, 2) << args << "\n" << out;
    EXPECT_NE(out.find(why), std::string::npos) << args << "\n" << out;
    EXPECT_EQ(out.find("[0]"), std::string::npos) << "a rank started: " << args << "\n" << out;
  }
  // --opt=value is accepted; a malformed LOOM_LOOMRUN_GRACE is warned about
  // and the default 3 s used (as loom-env reports it), not 0.
  auto [rc, out] = run("env LOOM_LOOMRUN_GRACE=abc " + loomrun + "-n 2 --bind=none --grace=1 true");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("LOOM_LOOMRUN_GRACE='abc' is not a number of seconds"), std::string::npos) << out;
  auto t0 = std::chrono::steady_clock::now();
  auto [rc2, out2] = run("env LOOM_LOOMRUN_GRACE=abc " + loomrun +
                         "-n 2 sh -c 'if [ $LOOM_RANK = 0 ]; then exit 3; fi; sleep 1; echo finished in the grace'");
  EXPECT_EQ(rc2, 3) << out2;
  EXPECT_NE(out2.find("[1] finished in the grace"), std::string::npos)
      << "rank 1 was ended before the default 3 s grace: " << out2;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30) << out2;
}

TEST(Loomrun, OneRankFailsOthersAreEndedWithSummary) {
  auto t0 = std::chrono::steady_clock::now();
  auto [rc, out] = run(build_dir() + "/bin/loomrun -n 3 --grace 1 sh -c 'if [ $LOOM_RANK = 1 ]; then exit 3; fi; sleep 60'");
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(rc, 3) << "loomrun exits with the failing rank's code, as mpirun (was always 1)\n" << out;
  EXPECT_LT(secs, 20) << "loomrun did not end the other ranks";
  EXPECT_NE(out.find("loomrun: rank 1"), std::string::npos) << out;
  EXPECT_NE(out.find("exited with code 3"), std::string::npos) << out;
  EXPECT_NE(out.find("other ranks: 0 killed by loomrun's SIGTERM, 2 killed by loomrun's SIGTERM"), std::string::npos)
      << out;
}

// A rank killed by a signal shortly after another rank exited with an error
// is reported as the cause: the peers of a killed rank see its connections
// close and often exit before the kernel has reaped it. Regression (CI,
// RemovesTheSegmentOfARankKilledInShmSetup): loomrun said "rank 0 exited with
// code 1" and exited 1 for a job whose rank 1 was SIGKILLed.
TEST(Loomrun, ARankKilledBySignalIsTheCauseAheadOfAnEarlierErrorExit) {
  auto [rc, out] = run(build_dir() + "/bin/loomrun -n 3 --grace 2 sh -c '"
                       "case $LOOM_RANK in 0) exit 1;; 1) sleep 0.3; kill -9 $$;; *) sleep 60;; esac'");
  EXPECT_EQ(rc, 137) << out;
  EXPECT_NE(out.find("loomrun: rank 1 (pid "), std::string::npos) << out;
  EXPECT_NE(out.find("killed by signal 9"), std::string::npos) << out;
  EXPECT_NE(out.find("other ranks: 0 exited with code 1, 2 killed by loomrun's SIGTERM"), std::string::npos) << out;
}

// The summary says how each rank that loomrun asked to stop ended: killed by
// the SIGTERM, killed by the SIGKILL that follows, or exited by itself (a
// handler's exit 0 or code of its own) after the SIGTERM. Regression: every
// one read "terminated by loomrun", even a rank that exited 0 on its own.
TEST(Loomrun, SummarySaysHowEachStoppedRankEnded) {
  char dir[] = "/tmp/loom-test-stopped-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string d = dir;
  // Ranks 1-4 say they are ready (their traps set) with a file each; rank 0
  // fails once all four are there (20 s at most), and --grace 0 sends the
  // SIGTERM at once. Rank 1 exits 0 on it, rank 2 exits 5, rank 3 dies of
  // it, rank 4 ignores it (and so does its sleep) until the SIGKILL.
  auto [rc, out] = run(build_dir() + "/bin/loomrun -n 5 --grace 0 sh -c '"
                       "case $LOOM_RANK in "
                       "0) i=0; while [ $(ls " + d + " | wc -l) -lt 4 ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done;"
                       " exit 3;; "
                       "1) trap \"exit 0\" TERM;; 2) trap \"exit 5\" TERM;; 4) trap \"\" TERM;; esac; "
                       "touch " + d + "/$LOOM_RANK; sleep 60 & wait'");
  run("rm -rf " + d);
  EXPECT_EQ(rc, 3) << out;
  EXPECT_NE(out.find("loomrun: rank 0 (pid "), std::string::npos) << out;
  EXPECT_NE(out.find(") exited with code 3; other ranks: "
                     "1 exited with code 0 after loomrun's SIGTERM, "
                     "2 exited with code 5 after loomrun's SIGTERM, "
                     "3 killed by loomrun's SIGTERM, "
                     "4 killed by loomrun's SIGKILL (still running 2 s after SIGTERM)\n"),
            std::string::npos)
      << out;
}

// A rank still between fork and exec when another rank fails (--grace 0:
// the SIGTERM comes at once) is ended by that SIGTERM before its program
// starts. Regression: the child still had loomrun's SIGTERM handler there,
// which took the signal; the program then ran until the SIGKILL 2 s later.
// tests/common/hold_before_exec.cc holds rank 1 in that window until a
// signal reaches it.
TEST(Loomrun, RankStillStartingWhenAnotherFailsEndsBySigterm) {
  const std::string preload = build_dir() + "/tests/mock/libloom_hold_before_exec.so";
  if (access(preload.c_str(), R_OK) != 0) GTEST_SKIP() << "no " << preload << " (sanitizer build)";
  auto [rc, out] = run("env LD_PRELOAD=" + preload + " LOOM_TEST_HOLD_RANK=1 " + build_dir() +
                       "/bin/loomrun -n 2 --grace 0 sh -c 'if [ $LOOM_RANK = 0 ]; then exit 3; fi; echo started; exec sleep 60'");
  EXPECT_EQ(rc, 3) << out;
  EXPECT_EQ(out.find("[1] started"), std::string::npos) << "rank 1's program ran after loomrun's SIGTERM\n" << out;
  EXPECT_NE(out.find(") exited with code 3; other ranks: 1 killed by loomrun's SIGTERM\n"), std::string::npos) << out;
}

// loomrun ended by a hang-up (a closed terminal or ssh session) or killed
// outright takes its ranks with it. Regression: only INT and TERM were
// handled and the ranks, in process groups of their own, kept running as
// orphans (waiting for peers until LOOM_TIMEOUT in a real job).
void ranks_end_with_loomrun(const char* signal_name) {
  const std::string pids = "/tmp/loom-test-orphans-" + std::to_string(getpid()) + "-" + signal_name;
  std::remove(pids.c_str());
  auto [rc, out] = run("(" + build_dir() + "/bin/loomrun -n 2 sh -c 'echo $$ >> " + pids +
                       "; sleep 30' & LR=$!; for i in $(seq 100); do [ $(cat " + pids +
                       " 2>/dev/null | wc -l) -ge 2 ] && break; sleep 0.05; done; kill -" + signal_name +
                       " $LR; wait $LR; exit 0)");
  FILE* f = fopen(pids.c_str(), "r");
  ASSERT_NE(f, nullptr) << out;
  int pid = 0, seen = 0, alive = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::vector<int> all;
  while (fscanf(f, "%d", &pid) == 1) all.push_back(pid);
  fclose(f);
  for (int p : all) {
    ++seen;
    while (kill(p, 0) == 0 && std::chrono::steady_clock::now() < until) usleep(20 * 1000);
    if (kill(p, 0) == 0) {
      ++alive;
      kill(p, SIGKILL);
    }
  }
  std::remove(pids.c_str());
  EXPECT_EQ(seen, 2) << out;
  EXPECT_EQ(alive, 0) << signal_name << ": ranks outlived loomrun\n" << out;
}

TEST(Loomrun, HangUpEndsTheRanks) { ranks_end_with_loomrun("HUP"); }
TEST(Loomrun, KillingLoomrunEndsTheRanks) { ranks_end_with_loomrun("KILL"); }

TEST(Loomrun, KilledRankIsReportedWithItsSignal) {
  auto [rc, out] = run(build_dir() + "/bin/loomrun -n 2 --grace 1 sh -c 'if [ $LOOM_RANK = 0 ]; then kill -9 $$; fi; sleep 60'");
  EXPECT_EQ(rc, 128 + 9) << out;
  EXPECT_NE(out.find("rank 0"), std::string::npos) << out;
  EXPECT_NE(out.find("SIGKILL"), std::string::npos) << out;
}

// Each child sets one launcher's variables, then init_from_env + allreduce.
void env_bootstrap(const char* launcher) {
  const int n = 3;
  const int p = testing::unused_loopback_port();
  ASSERT_NE(p, 0) << "no free loopback port below the ephemeral range";
  const std::string port = std::to_string(p);
  auto res = testing::run_processes(n, [&](int r, int out) {
    std::string rs = std::to_string(r), ns = std::to_string(n);
    std::string l = launcher;
    if (l == "torchrun") {
      setenv("RANK", rs.c_str(), 1);
      setenv("WORLD_SIZE", ns.c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", port.c_str(), 1);
    } else if (l == "ompi") {
      setenv("OMPI_COMM_WORLD_RANK", rs.c_str(), 1);
      setenv("OMPI_COMM_WORLD_SIZE", ns.c_str(), 1);
      setenv("LOOM_ROOT_ADDR", ("127.0.0.1:" + port).c_str(), 1);
    } else if (l == "slurm") {
      setenv("SLURM_PROCID", rs.c_str(), 1);
      setenv("SLURM_NTASKS", ns.c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", port.c_str(), 1);
    } else {
      setenv("LOOM_RANK", rs.c_str(), 1);
      setenv("LOOM_WORLD_SIZE", ns.c_str(), 1);
      setenv("LOOM_ROOT_ADDR", ("127.0.0.1:" + port).c_str(), 1);
    }
    Config cfg;
    cfg.timeout_s = 30;
    auto comm = Comm::init_from_env(cfg);
    if (!comm.is_ok()) {
      std::string m = comm.status().to_string();
      (void)!write(out, m.data(), m.size());
      return 1;
    }
    if ((*comm)->rank() != r || (*comm)->size() != n) return 2;
    int32_t v = r + 1;
    auto w = (*comm)->allreduce(&v, &v, 1, DataType::kInt32, RedOp::kSum);
    if (!w.is_ok() || !w->wait().is_ok()) return 3;
    return v == 6 ? 0 : 4;
  }, 60);
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(WIFEXITED(res[r].status) && WEXITSTATUS(res[r].status) == 0)
        << launcher << " rank " << r << " status " << res[r].status << ": " << res[r].output;
}

TEST(EnvBootstrap, Loom) { env_bootstrap("loom"); }
TEST(EnvBootstrap, Torchrun) { env_bootstrap("torchrun"); }
TEST(EnvBootstrap, OpenMpi) { env_bootstrap("ompi"); }
TEST(EnvBootstrap, Slurm) { env_bootstrap("slurm"); }

TEST(EnvBootstrap, MissingVariablesGiveAClearError) {
  auto res = testing::run_processes(1, [&](int, int out) {
    for (const char* v : {"LOOM_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) unsetenv(v);
    auto comm = Comm::init_from_env();
    std::string m = comm.status().to_string();
    (void)!write(out, m.data(), m.size());
    return comm.is_ok() ? 1 : 0;
  });
  EXPECT_EQ(WEXITSTATUS(res[0].status), 0);
  EXPECT_NE(res[0].output.find("no rank in the environment"), std::string::npos) << res[0].output;
}

// The root ports the tests above hand out lie in the band they search, below
// the ephemeral range, for any pid. Regression: the first port tried came
// from an int, pid * 7919, which overflowed for pids beyond 271k (pid_max is
// 4194304 on many hosts; undefined behaviour), and its negative remainder
// put the port below the band (here 12769-22767 for a band 22768-32767; on a
// host whose ephemeral range starts below 11024, below 1025).
TEST(EnvBootstrap, TestPortsStayBelowTheEphemeralRangeForAnyPid) {
  const auto [band, lo] = testing::loopback_port_band();
  if (band >= lo) GTEST_SKIP() << "ephemeral range starts at " << lo << ": no room below it";
  for (unsigned seed : {0u, 1u, 271829u, 4194303u, 4294967295u}) {
    const int p = testing::unused_loopback_port(seed);
    if (p == 0) continue;  // every port in the band is taken (not the case here)
    EXPECT_GE(p, band) << "seed " << seed;
    EXPECT_LT(p, lo) << "seed " << seed;
  }
}

// Two ranks with the given variables each, on one root port.
std::vector<testing::ChildResult> env_pair(const std::vector<std::vector<std::pair<const char*, std::string>>>& envs,
                                           double timeout_s) {
  const int p = testing::unused_loopback_port();
  EXPECT_NE(p, 0) << "no free loopback port below the ephemeral range";
  const std::string port = std::to_string(p);
  return testing::run_processes(static_cast<int>(envs.size()), [&](int r, int out) {
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port.c_str(), 1);
    for (const auto& [k, v] : envs[r]) setenv(k, v.c_str(), 1);
    Config cfg;
    cfg.timeout_s = timeout_s;
    auto comm = Comm::init_from_env(cfg);
    std::string m = comm.is_ok() ? "ok" : comm.status().to_string();
    (void)!write(out, m.data(), m.size());
    return comm.is_ok() ? 0 : 1;
  }, 60);
}

// Ranks that disagree on the world size reach the root, which names the
// disagreement at once. Regression: the size was hashed into the env
// secret, so they were strangers to each other and both waited out their
// timeout ("waiting for the other ranks").
TEST(EnvBootstrap, DisagreeingWorldSizesAreNamed) {
  auto t0 = std::chrono::steady_clock::now();
  auto res = env_pair({{{"RANK", "0"}, {"WORLD_SIZE", "2"}}, {{"RANK", "1"}, {"WORLD_SIZE", "3"}}}, 20);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(WEXITSTATUS(res[r].status), 1) << res[r].output;
    EXPECT_NE(res[r].output.find("nranks="), std::string::npos) << "rank " << r << ": " << res[r].output;
  }
  EXPECT_LT(secs, 15) << "the disagreement waited for the timeout";
}

// Two Slurm steps of one allocation on the same port are two jobs: their
// ranks do not meet.
TEST(EnvBootstrap, TwoSlurmStepsOnOnePortDoNotMeet) {
  auto res = env_pair({{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "0"}},
                       {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "1"}}},
                      2);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(WEXITSTATUS(res[r].status), 1) << "rank " << r << " joined the other step: " << res[r].output;
}

// A world size beyond int's range is refused, not truncated. Regression:
// LOOM_WORLD_SIZE=4294967298 (2^32 + 2) was read as 2.
TEST(EnvBootstrap, WorldSizeBeyondIntIsRefused) {
  auto res = testing::run_processes(1, [&](int, int out) {
    setenv("LOOM_RANK", "0", 1);
    setenv("LOOM_WORLD_SIZE", "4294967298", 1);
    setenv("LOOM_ROOT_ADDR", "127.0.0.1:1", 1);
    Config cfg;
    cfg.timeout_s = 2;
    auto comm = Comm::init_from_env(cfg);
    std::string m = comm.is_ok() ? "ok" : comm.status().to_string();
    (void)!write(out, m.data(), m.size());
    return comm.is_ok() ? 1 : 0;
  });
  EXPECT_EQ(WEXITSTATUS(res[0].status), 0) << res[0].output;
  EXPECT_NE(res[0].output.find("world size missing, < 1 or not an int"), std::string::npos) << res[0].output;
}

}  // namespace
}  // namespace loom
