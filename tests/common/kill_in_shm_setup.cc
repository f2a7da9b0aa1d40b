// LD_PRELOAD library of one test (multiproc/test_launchers,
// Loomrun.RemovesTheSegmentOfARankKilledInShmSetup): the rank named by
// LOOM_TEST_KILL_RANK is SIGKILLed when it first opens a peer's shared-memory
// segment, i.e. inside shm setup, after its own segment was created and before
// it is unlinked: the moment at which a killed rank leaves /dev/shm behind.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

extern "C" int shm_open(const char* name, int oflag, mode_t mode) {
  using Fn = int (*)(const char*, int, mode_t);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "shm_open"));
  const char* victim = std::getenv("LOOM_TEST_KILL_RANK");
  const char* rank = std::getenv("LOOM_RANK");
  if (!(oflag & O_CREAT) && victim && rank && std::strcmp(victim, rank) == 0) raise(SIGKILL);
  return real(name, oflag, mode);
}
