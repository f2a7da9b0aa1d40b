// LD_PRELOAD library of one test (multiproc/test_launchers,
// Loomrun.RankStillStartingWhenAnotherFailsEndsBySigterm), preloaded into
// loomrun: the rank named by LOOM_TEST_HOLD_RANK is held between loomrun's
// fork and its exec -- in its setpgid(0, 0), the child's first call -- until a
// signal reaches it (caught by a handler: the sleep is interrupted; blocked:
// it is pending), 20 s at most. That is where a rank still starting is when
// another rank fails at once and loomrun sends the SIGTERM.
//
// Which child is which: loomrun's own setpgid(pid, pid) after each fork is
// counted, so a child's copy of the count is its rank.
#include <dlfcn.h>
#include <signal.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

extern "C" int setpgid(pid_t pid, pid_t pgid) {
  using Fn = int (*)(pid_t, pid_t);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "setpgid"));
  static int started = 0;  // in loomrun: the ranks forked; in a rank: its own rank
  const int rc = real(pid, pgid);
  if (pid != 0) {
    ++started;
    return rc;
  }
  const char* hold = std::getenv("LOOM_TEST_HOLD_RANK");
  if (!hold) return rc;
  const bool held = std::atoi(hold) == started;
  unsetenv("LOOM_TEST_HOLD_RANK");  // the rank's own program is not held
  if (!held) return rc;
  for (int i = 0; i < 2000; ++i) {
    sigset_t pending;
    sigpending(&pending);
    if (sigismember(&pending, SIGTERM)) break;
    timespec tick{0, 10 * 1000 * 1000};
    if (nanosleep(&tick, nullptr) != 0 && errno == EINTR) break;
  }
  return rc;
}
