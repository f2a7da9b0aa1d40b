#include "core/threads.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>

namespace loom {

long current_thread_id() { return static_cast<long>(syscall(SYS_gettid)); }

void yield_until_asleep(long tid) {
  const std::string path = "/proc/self/task/" + std::to_string(tid) + "/stat";
  for (int i = 0; i < 100; ++i) {
    char buf[512];
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    const ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return;
    buf[n] = 0;
    // "tid (name) S ...": the state follows the last ')' (a name may hold one).
    const char* paren = strrchr(buf, ')');
    if (!paren || paren[1] != ' ' || paren[2] != 'R') return;
    sched_yield();
  }
}

long wait_for_thread_id(const std::atomic<long>& slot) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (;;) {
    const long id = slot.load(std::memory_order_acquire);
    if (id != 0 || std::chrono::steady_clock::now() >= until) return id;
    sched_yield();
  }
}

}  // namespace loom
