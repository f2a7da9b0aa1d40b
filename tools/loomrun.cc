// loomrun -n N [options] [--] program [args...]
//
// Starts N local ranks of `program` with the env bootstrap (LOOM_RANK,
// LOOM_WORLD_SIZE, LOOM_ROOT_ADDR, LOOM_SECRET, LOOM_LOCAL_RANK), prefixes every
// output line with the rank (a rank's stdout to loomrun's stdout, its stderr
// to loomrun's stderr, as mpirun), and when one rank fails (non-zero exit or a
// signal) gives the others a grace period, then terminates them and exits
// non-zero with a one-line summary of who failed and how.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <algorithm>
#include <vector>

namespace {

volatile sig_atomic_t g_signal = 0;
constexpr long kMaxRanks = 4096;              // ranks on one host
constexpr double kMaxGraceSeconds = 86400;    // a day; also keeps the deadline arithmetic in range
constexpr int kTermToKillSeconds = 2;         // from SIGTERM to SIGKILL for a rank still running
void on_signal(int sig) { g_signal = sig; }
// The signals loomrun catches; with SIGPIPE, which it ignores, the ones a rank
// gets back at their defaults before exec.
constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

void usage(FILE* out) {
  fprintf(out,
          "usage: loomrun -n N [--grace SECONDS] [--bind core|none] [--no-prefix] [--] program [args...]\n"
          "  Starts N ranks of program on this host with LOOM_RANK, LOOM_WORLD_SIZE,\n"
          "  LOOM_ROOT_ADDR (127.0.0.1:<free port>), LOOM_SECRET and LOOM_LOCAL_RANK set.\n"
          "  Output lines are prefixed with [rank]; a rank's stdout goes to stdout, its\n"
          "  stderr to stderr. If a rank exits non-zero or is killed, the others get\n"
          "  --grace seconds (default 3, env LOOM_LOOMRUN_GRACE) to finish,\n"
          "  then are terminated; loomrun prints a summary and exits with the first\n"
          "  failing rank's code (128 + signal number when it was killed), as mpirun;\n"
          "  a rank killed by a signal within the grace period counts as the first\n"
          "  failing one ahead of ranks that exited with an error (they usually only\n"
          "  report the lost peer).\n"
          "  --bind core (default) pins rank r to the r-th CPU loomrun may use (modulo their\n"
          "  number), like mpirun's --bind-to core: ranks that migrate between cores pay\n"
          "  for it in latency. --bind none leaves placement to the kernel.\n");
}

int free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (s < 0 || bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    perror("loomrun: cannot find a free port");
    exit(2);
  }
  int port = ntohs(a.sin_port);
  close(s);
  return port;
}

// One of a rank's two output pipes, forwarded line by line to `to`.
struct Stream {
  int fd = -1;
  std::string partial;
  FILE* to = stdout;
};

struct Rank {
  pid_t pid = -1;
  Stream io[2];  // stdout, stderr
  bool exited = false;
  int status = 0;
  int signalled = 0;  // the last signal loomrun sent the rank's group: 0, SIGTERM or SIGKILL
  bool open() const { return io[0].fd >= 0 || io[1].fd >= 0; }
};

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return "killed by signal " + std::to_string(sig) + " (SIG" + std::string(sigabbrev_np(sig) ? sigabbrev_np(sig) : "?") + ")";
  }
  return "ended with status " + std::to_string(status);
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

// How a rank that loomrun asked to stop ended: by loomrun's own signal, or by
// itself (a handler that exits 0 or with a code of its own, another signal)
// after the SIGTERM. Regression: all of them read "terminated by loomrun".
std::string describe_stopped(const Rank& r) {
  if (WIFSIGNALED(r.status) && WTERMSIG(r.status) == SIGTERM) return "killed by loomrun's SIGTERM";
  if (WIFSIGNALED(r.status) && WTERMSIG(r.status) == SIGKILL && r.signalled == SIGKILL)
    return "killed by loomrun's SIGKILL (still running " + std::to_string(kTermToKillSeconds) + " s after SIGTERM)";
  return describe_exit(r.status) + " after loomrun's SIGTERM";
}

void flush_lines(Stream& r, int rank, bool prefix, bool final) {
  size_t pos;
  while ((pos = r.partial.find('\n')) != std::string::npos) {
    std::string line = r.partial.substr(0, pos + 1);
    r.partial.erase(0, pos + 1);
    if (prefix) fprintf(r.to, "[%d] %s", rank, line.c_str());
    else fputs(line.c_str(), r.to);
  }
  if (final && !r.partial.empty()) {
    if (prefix) fprintf(r.to, "[%d] %s\n", rank, r.partial.c_str());
    else fprintf(r.to, "%s\n", r.partial.c_str());
    r.partial.clear();
  }
  fflush(r.to);
}

void close_stream(Stream& st, int rank, bool prefix) {
  flush_lines(st, rank, prefix, true);
  close(st.fd);
  st.fd = -1;
}

// A rank killed inside its communicator's shared-memory setup leaves its
// segment in /dev/shm (each rank unlinks its own once its local peers have
// mapped it): "loom-<16 hex digits>-<rank>-<pid>" (shm_segment_name in
// src/transport/shm/shm_transport.h). Once the ranks have exited, those
// ending in one of their pids are theirs: removed, and said so.
void remove_stale_segments(const std::vector<Rank>& ranks) {
  DIR* d = opendir("/dev/shm");
  if (!d) return;
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("loom-", 0) == 0) names.push_back(name);
  }
  closedir(d);
  for (const std::string& name : names) {
    // loom-<16 hex>-<rank>-<pid>
    const size_t a = 5, b = name.find('-', a), c = b == std::string::npos ? b : name.find('-', b + 1);
    if (b != a + 16 || c == std::string::npos || c == b + 1 || c + 1 >= name.size()) continue;
    if (name.find_first_not_of("0123456789abcdef", a) != b) continue;
    if (name.find_first_not_of("0123456789", b + 1) != c || name.find_first_not_of("0123456789", c + 1) != std::string::npos)
      continue;
    const long pid = strtol(name.c_str() + c + 1, nullptr, 10);
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (ranks[r].pid != pid) continue;
      const std::string path = "/dev/shm/" + name;
      if (unlink(path.c_str()) == 0)
        fprintf(stderr, "loomrun: removed %s, left by rank %zu (pid %ld), which ended inside its shared-memory setup\n",
                path.c_str(), r, pid);
    }
  }
}


// Whole-string numbers: "2x", "" and out-of-range values are refused
// (atoi/atof read them as 2, 0 and garbage: -n 4294967297 ran one rank).
bool parse_count(const char* s, long lo, long hi, long* out) {
  char* end = nullptr;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (end == s || *end != '\0' || errno != 0 || v < lo || v > hi) return false;
  *out = v;
  return true;
}
bool parse_seconds(const char* s, double* out) {
  char* end = nullptr;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || errno != 0 || !(v >= 0 && v <= kMaxGraceSeconds)) return false;
  *out = v;
  return true;
}

int bad_usage(const std::string& why) {
  fprintf(stderr, "loomrun: %s\n", why.c_str());
  usage(stderr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  long nranks = -1;
  double grace = 3.0;
  if (const char* g = getenv("LOOM_LOOMRUN_GRACE")) {
    // As loom-env says of a malformed value: warned, the default used.
    if (!parse_seconds(g, &grace)) {
      fprintf(stderr, "loomrun: LOOM_LOOMRUN_GRACE='%s' is not a number of seconds in [0, %g]; using 3\n", g,
              kMaxGraceSeconds);
      grace = 3.0;
    }
  }
  bool prefix = true;
  bool bind = true;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    // --opt=value as well as --opt value.
    std::string inline_value;
    bool has_inline = false;
    if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) {
      inline_value = a.substr(a.find('=') + 1);
      a = a.substr(0, a.find('='));
      has_inline = true;
    }
    auto value = [&](std::string* v) {
      if (has_inline) {
        *v = inline_value;
        return true;
      }
      if (i + 1 >= argc) return false;
      *v = argv[++i];
      return true;
    };
    std::string v;
    if (a == "-n" || a == "-np") {
      if (!value(&v)) return bad_usage(a + " needs a number of ranks");
      if (!parse_count(v.c_str(), 1, kMaxRanks, &nranks))
        return bad_usage(a + " '" + v + "': the number of ranks is a whole number from 1 to " +
                         std::to_string(kMaxRanks));
    } else if (a == "--grace") {
      if (!value(&v)) return bad_usage("--grace needs a number of seconds");
      if (!parse_seconds(v.c_str(), &grace))
        return bad_usage("--grace '" + v + "': seconds from 0 to " + std::to_string(static_cast<long>(kMaxGraceSeconds)));
    } else if (a == "--bind") {
      if (!value(&v)) return bad_usage("--bind needs core or none");
      if (v != "core" && v != "none") return bad_usage("--bind '" + v + "': core or none");
      bind = v == "core";
    } else if (a == "--no-prefix" && !has_inline) {
      prefix = false;
    } else if ((a == "-h" || a == "--help") && !has_inline) {
      usage(stdout);
      return 0;
    } else if (a == "--" && !has_inline) {
      ++i;
      break;
    } else if (!a.empty() && a[0] == '-') {
      // Regression: a mistyped option (--no-prefx) was run as the program.
      return bad_usage("unknown option '" + std::string(argv[i]) + "' (the program's own options go after it, or after --)");
    } else {
      break;
    }
  }
  if (nranks < 1) return bad_usage("-n N is required");
  if (i >= argc) return bad_usage("no program to run");
  const int n = static_cast<int>(nranks);
  // Hang-up (a closed terminal or ssh session) and quit end the ranks like
  // interrupt and terminate do. Regression: they killed loomrun alone and
  // left the ranks (in process groups of their own) running as orphans.
  for (int sig : kHandledSignals) signal(sig, on_signal);
  signal(SIGPIPE, SIG_IGN);
  const pid_t launcher = getpid();

  const int port = free_port();
  unsigned long long secret = 0;
  if (getrandom(&secret, sizeof(secret), 0) != sizeof(secret)) secret = static_cast<unsigned long long>(getpid()) * 2654435761ull;
  char root[64], sec[32];
  snprintf(root, sizeof(root), "127.0.0.1:%d", port);
  snprintf(sec, sizeof(sec), "%016llx", secret);

  // The CPUs this loomrun may use; rank r is pinned to the (r mod count)-th.
  std::vector<int> cpus;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);

  std::vector<Rank> ranks(n);
  // A failure part-way through starting the ranks ends those already started.
  auto give_up = [&](const char* what, int started) {
    perror(what);
    for (int k = 0; k < started; ++k) kill(-ranks[k].pid, SIGKILL);
    for (int k = 0; k < started; ++k) waitpid(ranks[k].pid, nullptr, 0);
    return 2;
  };
  for (int r = 0; r < n; ++r) {
    // Two pipes: a rank's stderr stays stderr (regression: it went to
    // loomrun's stdout, inside the CSV or JSON a benchmark printed there).
    int fds[2], efds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return give_up("loomrun: pipe", r);
    if (pipe2(efds, O_CLOEXEC) != 0) {
      close(fds[0]);
      close(fds[1]);
      return give_up("loomrun: pipe", r);
    }
    // Every signal is blocked from before the fork until the child has put
    // loomrun's dispositions back to the defaults: a SIGTERM that reaches a
    // rank still between fork and exec (another rank failed at once, or
    // loomrun was interrupted) then waits, and ends it as soon as it unblocks.
    // Regression: loomrun's handler, inherited, took that SIGTERM in the
    // child, and the program ran until the SIGKILL 2 s later.
    sigset_t all, parent_mask;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &parent_mask);
    pid_t pid = fork();
    if (pid != 0) sigprocmask(SIG_SETMASK, &parent_mask, nullptr);
    if (pid < 0) return give_up("loomrun: fork", r);
    if (pid == 0) {
      // loomrun is single-threaded and no handler can run here, so the
      // allocations below (setenv, to_string) are safe after fork.
      // Own process group: ending a rank ends whatever it started too.
      setpgid(0, 0);
      // If loomrun itself dies (SIGKILL, a crash), the rank goes with it
      // instead of waiting for its peers until LOOM_TIMEOUT as an orphan.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(1);  // loomrun died before the line above
      if (bind && !cpus.empty()) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[r % cpus.size()], &one);
        sched_setaffinity(0, sizeof(one), &one);
      }
      dup2(fds[1], STDOUT_FILENO);
      dup2(efds[1], STDERR_FILENO);
      setenv("LOOM_RANK", std::to_string(r).c_str(), 1);
      setenv("LOOM_LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("LOOM_WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("LOOM_ROOT_ADDR", root, 1);
      setenv("LOOM_SECRET", sec, 1);
      for (int sig : kHandledSignals) signal(sig, SIG_DFL);
      signal(SIGPIPE, SIG_DFL);
      // No signal blocked, as mpirun starts its ranks (Open MPI's odls
      // unblocks all): not even one blocked where loomrun was started, since
      // loomrun's SIGTERM must be able to end the rank.
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      execvp(argv[i], argv + i);
      fprintf(stderr, "loomrun: cannot execute %s: %s\n", argv[i], strerror(errno));
      _exit(127);
    }
    close(fds[1]);
    close(efds[1]);
    setpgid(pid, pid);  // also here, so no kill races the child's own setpgid
    ranks[r].pid = pid;
    ranks[r].io[0].fd = fds[0];
    ranks[r].io[1].fd = efds[0];
    ranks[r].io[1].to = stderr;
  }

  using Clock = std::chrono::steady_clock;
  int first_failed = -1;
  Clock::time_point kill_at{}, hard_kill_at{};
  bool term_sent = false, kill_sent = false;
  int alive = n;
  Clock::time_point all_exited_at{};
  while (alive > 0 || std::any_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.open(); })) {
    // Once every rank has exited, a grandchild still holding the output pipe
    // must not keep loomrun alive: drain briefly, then stop reading.
    if (alive == 0) {
      if (all_exited_at == Clock::time_point{}) all_exited_at = Clock::now();
      if (Clock::now() - all_exited_at > std::chrono::milliseconds(500)) {
        for (int r = 0; r < n; ++r)
          for (Stream& st : ranks[r].io)
            if (st.fd >= 0) close_stream(st, r, prefix);
        break;
      }
    }
    std::vector<pollfd> pfds;
    std::vector<std::pair<int, int>> who;  // rank, stream
    for (int r = 0; r < n; ++r)
      for (int k = 0; k < 2; ++k)
        if (ranks[r].io[k].fd >= 0) {
          pfds.push_back({ranks[r].io[k].fd, POLLIN, 0});
          who.push_back({r, k});
        }
    if (!pfds.empty()) poll(pfds.data(), pfds.size(), 50);
    else usleep(20000);
    for (size_t k = 0; k < pfds.size(); ++k) {
      if (!(pfds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const int r = who[k].first;
      Stream& st = ranks[r].io[who[k].second];
      char buf[65536];
      ssize_t got = read(st.fd, buf, sizeof(buf));
      if (got > 0) {
        st.partial.append(buf, static_cast<size_t>(got));
        flush_lines(st, r, prefix, false);
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        close_stream(st, r, prefix);
      }
    }
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (int r = 0; r < n; ++r)
        if (ranks[r].pid == pid) {
          ranks[r].exited = true;
          ranks[r].status = status;
          --alive;
          if (failed(status) && first_failed < 0 && !term_sent) {
            first_failed = r;
            kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int>(grace * 1000));
          } else if (first_failed >= 0 && !term_sent && WIFSIGNALED(status) &&
                     !WIFSIGNALED(ranks[first_failed].status)) {
            // A rank killed by a signal (OOM killer, SIGSEGV) within the
            // grace period is the likelier cause than one that exited with
            // an error: its peers see the closed connection and exit first,
            // often before the kernel has made the killed rank a zombie.
            // Regression: loomrun then reported "rank 0 exited with code 1"
            // and exit code 1 for a job whose rank 1 was SIGKILLed.
            first_failed = r;
          }
        }
    }
    if (g_signal && !term_sent) {
      first_failed = first_failed < 0 ? -2 : first_failed;
      kill_at = Clock::now();
    }
    if (first_failed != -1 && alive > 0) {
      auto now = Clock::now();
      if (!term_sent && now >= kill_at) {
        for (int r = 0; r < n; ++r)
          if (!ranks[r].exited) {
            kill(-ranks[r].pid, SIGTERM);
            ranks[r].signalled = SIGTERM;
          }
        term_sent = true;
        hard_kill_at = now + std::chrono::seconds(kTermToKillSeconds);
      } else if (term_sent && !kill_sent && now >= hard_kill_at) {
        for (int r = 0; r < n; ++r)
          if (!ranks[r].exited) {
            kill(-ranks[r].pid, SIGKILL);
            ranks[r].signalled = SIGKILL;
          }
        kill_sent = true;
      }
    }
  }
  remove_stale_segments(ranks);
  if (first_failed == -1) return 0;
  std::string summary = "loomrun: ";
  if (first_failed >= 0)
    summary += "rank " + std::to_string(first_failed) + " (pid " + std::to_string(ranks[first_failed].pid) + ") " +
               describe_exit(ranks[first_failed].status);
  else
    summary += "interrupted by signal " + std::to_string(g_signal);
  std::string others;
  for (int r = 0; r < n; ++r) {
    if (r == first_failed) continue;
    if (ranks[r].signalled) others += (others.empty() ? "" : ", ") + std::to_string(r) + " " + describe_stopped(ranks[r]);
    else if (failed(ranks[r].status)) others += (others.empty() ? "" : ", ") + std::to_string(r) + " " + describe_exit(ranks[r].status);
  }
  if (!others.empty()) summary += "; other ranks: " + others;
  fprintf(stderr, "%s\n", summary.c_str());
  // As mpirun: the first failing rank's exit code, 128 + its signal when it
  // was killed (the shell's convention), 128 + loomrun's own signal when
  // interrupted. Regression: always 1, so a job script could not tell a
  // rank's error code or an OOM kill (137) from anything else.
  if (first_failed < 0) return 128 + static_cast<int>(g_signal);
  const int st = ranks[first_failed].status;
  if (WIFEXITED(st)) return WEXITSTATUS(st) != 0 ? WEXITSTATUS(st) : 1;
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return 1;
}
