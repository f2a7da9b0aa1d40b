// loom-doctor status on a running job: a straggler (progressing, one rank
// late to every collective) and a rank stuck in user code (no progress),
// each told within 10 s of asking.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/test_util.h"
#include <thread>

namespace {

std::string bin(const std::string& name) { return loom::testing::build_bin(name); }
std::string run(const std::string& cmd) { return loom::testing::run_command(cmd); }


int free_port() {
  // Port from the pid: tests of one ctest run differ, and bind() fallbacks
  // in the hub keep the job alive even if another process holds it.
  return 30000 + getpid() % 20000;
}

pid_t start_job(const std::string& args, int port) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("LOOM_DIAG_ADDR", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
    setenv("LOOM_TIMEOUT", "60", 1);
    std::string cmd = bin("loomrun") + " -n 3 " + bin("hang_demo") + " " + args + " >/dev/null 2>&1";
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), nullptr);
    _exit(127);
  }
  return pid;
}

void stop_job(pid_t pid) {
  kill(pid, SIGTERM);  // loomrun forwards it to the ranks
  int st;
  waitpid(pid, &st, 0);
}

// Waits (up to 30 s) until the job's diagnostics hub accepts connections:
// the tests time the doctor's answer, not the job's start-up, which a loaded
// CI machine can stretch past the 3 s these tests first sleep.
void wait_for_hub(int port) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < give_up) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool up = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    close(fd);
    if (up) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string status(int port) {
  return run(bin("loom-doctor") + " status 127.0.0.1:" + std::to_string(port) + " --interval 2 2>&1");
}

TEST(DoctorLive, Straggler) {
  int port = free_port();
  pid_t job = start_job("--case straggler --lag-ms 60 --seconds 15", port);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  wait_for_hub(port);
  auto t0 = std::chrono::steady_clock::now();
  std::string out = status(port);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop_job(job);
  EXPECT_EQ(out.rfind("STRAGGLER: rank 2 ", 0), 0u) << out;
  EXPECT_LT(secs, 10) << out;
}

TEST(DoctorLive, StuckNotSlow) {
  int port = free_port() + 1;
  pid_t job = start_job("--case user-code", port);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  wait_for_hub(port);
  auto t0 = std::chrono::steady_clock::now();
  std::string out = status(port);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop_job(job);
  EXPECT_EQ(out.rfind("STUCK_IN_USER_CODE: rank 2 ", 0), 0u) << out;
  EXPECT_LT(secs, 10) << out;
}

}  // namespace
