// A peer that sends its last message, destroys its communicator and exits is
// not a failure: the receiver posts the matching recv later (its engine and
// the watchdog's idle check run meanwhile) and gets every byte. Only a recv
// for data the departed peer never sent fails, promptly and with a message
// that says so. Both transports: shm (the FIFO outlives the sender) and
// socket on loopback (bytes in the staging ring, in the kernel's socket
// buffers, and the direct path for large messages). Crashes (no close
// notice) stay errors: test_kill and test_socket_faults cover them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/test_util.h"

namespace loom {
namespace {

using Secs = std::chrono::duration<double>;

int report(int fd, const std::string& m, int rc) {
  (void)!write(fd, m.data(), m.size());
  return rc;
}

uint8_t pattern(size_t i) { return static_cast<uint8_t>((i * 131u) ^ (i >> 11) ^ 0x5a); }

struct Outcome {
  int rc0 = -1, rc1 = -1;
  std::string out0, out1;
  double secs = 0;
};

// Rank 1 sends `bytes` (none when 0) to rank 0, destroys its communicator and
// exits; rank 0 waits until rank 1 is gone (up to 30 s), idles 600 ms more
// (three or more watchdog idle checks), then receives those bytes from rank 1 and checks them, and
// then, when `extra` > 0, posts one more recv that rank 1 never matched, or
// with `send_back`, a send of `extra` bytes that rank 1 never received.
Outcome run_pair(const char* transport, size_t bytes, size_t extra, bool send_back = false) {
  setenv("LOOM_TRANSPORT", transport, 1);
  auto id = testing::unique_id();
  Outcome o;
  if (!id.is_ok()) {
    o.out0 = id.status().to_string();
    return o;
  }
  // Rank 1 writes a byte here once its destroy returned (sockets closed,
  // close notice given): rank 0 checks that it really receives from a
  // departed peer, not from one still blocked in its send.
  int gone[2];
  if (pipe2(gone, O_NONBLOCK) != 0) {
    o.out0 = "pipe failed";
    return o;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto res = testing::run_processes(2, [&](int r, int fd) {
    Config cfg;
    cfg.timeout_s = 60;  // a wrong wait would end at the deadline: far beyond the test's bound
    auto comm = Comm::init_rank(*id, 2, r, cfg);
    if (!comm.is_ok()) return report(fd, comm.status().to_string(), 3);
    if (r == 1) {
      std::vector<uint8_t> src(bytes);
      for (size_t i = 0; i < bytes; ++i) src[i] = pattern(i);
      if (bytes > 0) {
        auto w = (*comm)->send(src.data(), bytes, DataType::kUint8, 0);
        Status st = w.is_ok() ? w->wait() : w.status();
        if (!st.is_ok()) return report(fd, "send: " + st.to_string(), 4);
      }
      Status st = (*comm)->destroy();
      if (!st.is_ok()) return report(fd, "destroy: " + st.to_string(), 5);
      (void)!write(gone[1], "x", 1);
      return 0;  // the process exits: its sockets close, its pid goes away
    }
    // Wait for rank 1 to be gone, then idle 600 ms more. A fixed 600 ms from
    // init raced with a slow rank 1 on a loaded machine: the test failed once
    // under ctest -j2 (eighth session; its output was lost, so this race is
    // the likely cause, not a proven one).
    char c;
    bool departed = false;
    for (int i = 0; i < 3000 && !departed; ++i) {
      departed = read(gone[0], &c, 1) == 1;
      if (!departed) usleep(10 * 1000);
    }
    usleep(600 * 1000);
    if (Status st = (*comm)->async_error(); !st.is_ok()) return report(fd, "while idle: " + st.to_string(), 6);
    if (bytes > 0) {
      std::vector<uint8_t> dst(bytes, 0xee);
      auto w = (*comm)->recv(dst.data(), bytes, DataType::kUint8, 1);
      Status st = w.is_ok() ? w->wait() : w.status();
      if (!st.is_ok()) return report(fd, st.to_string(), 2);
      for (size_t i = 0; i < bytes; ++i)
        if (dst[i] != pattern(i))
          return report(fd, "byte " + std::to_string(i) + " wrong: " + std::to_string(dst[i]), 7);
    }
    if (extra > 0) {
      std::vector<uint8_t> dst(extra);
      auto w = send_back ? (*comm)->send(dst.data(), extra, DataType::kUint8, 1)
                         : (*comm)->recv(dst.data(), extra, DataType::kUint8, 1);
      Status st = w.is_ok() ? w->wait() : w.status();
      if (!st.is_ok()) return report(fd, st.to_string(), 2);
      return report(fd, "a transfer with the departed rank 1 succeeded", 8);
    }
    return report(fd, departed ? "ok" : "ok, but rank 1 had not left within 30 s when the recv was posted", 0);
  }, 60);
  close(gone[0]);
  close(gone[1]);
  unsetenv("LOOM_TRANSPORT");
  o.secs = Secs(std::chrono::steady_clock::now() - t0).count();
  o.rc0 = WIFEXITED(res[0].status) ? WEXITSTATUS(res[0].status) : -1;
  o.rc1 = WIFEXITED(res[1].status) ? WEXITSTATUS(res[1].status) : -1;
  o.out0 = res[0].output;
  o.out1 = res[1].output;
  return o;
}

void expect_delivered(const char* transport, size_t bytes) {
  Outcome o = run_pair(transport, bytes, 0);
  EXPECT_EQ(o.rc1, 0) << o.out1;
  EXPECT_EQ(o.rc0, 0) << o.out0;
  EXPECT_EQ(o.out0, "ok");
  EXPECT_LT(o.secs, 20.0);
  EXPECT_TRUE(testing::loom_shm_segments().empty());
}

void expect_clear_failure(const char* transport, size_t sent, size_t extra, bool send_back = false) {
  Outcome o = run_pair(transport, sent, extra, send_back);
  EXPECT_EQ(o.rc1, 0) << o.out1;
  EXPECT_EQ(o.rc0, 2) << o.out0;
  EXPECT_NE(o.out0.find("rank 1"), std::string::npos) << o.out0;
  EXPECT_NE(o.out0.find(send_back ? "destroyed its communicator (orderly close)"
                                  : "destroyed its communicator (orderly close) before sending what this recv expects"),
            std::string::npos)
      << o.out0;
  // Promptly: well before the 60 s deadline (setup + 0.6 s idle + detection).
  EXPECT_LT(o.secs, 8.0) << o.out0;
  EXPECT_TRUE(testing::loom_shm_segments().empty());
}

// Socket: 2 MiB goes through the direct path (>= LOOM_SOCKET_DIRECT_BYTES) on
// the sender; the receiver's window is posted only after every stream hit
// end-of-file, so the streams must still acknowledge it.
TEST(OrderlyClose, SocketDirect2MiB) { expect_delivered("socket", 2 << 20); }
// Small message: staging rings only.
TEST(OrderlyClose, SocketRing4KiB) { expect_delivered("socket", 4 << 10); }
// More than the staging ring (1 MiB here): part of it waits in the kernel's
// socket buffers after the sender is gone, behind streams that stopped
// reading because the ring is full.
TEST(OrderlyClose, SocketBeyondRing) {
  setenv("LOOM_SOCKET_BUF_BYTES", "1M", 1);
  expect_delivered("socket", (1 << 20) + (128 << 10));
  unsetenv("LOOM_SOCKET_BUF_BYTES");
}
TEST(OrderlyClose, Shm4KiB) { expect_delivered("shm", 4 << 10); }
TEST(OrderlyClose, Shm1MiB) {
  // Through the FIFO: the single-copy path (on by default for large
  // messages) keeps the sender in its send until the receiver read it.
  setenv("LOOM_SHM_SINGLE_COPY_BYTES", "0", 1);
  expect_delivered("shm", 1 << 20);
  unsetenv("LOOM_SHM_SINGLE_COPY_BYTES");
}

// A recv the departed rank never matched (nothing sent at all, or one
// message more than it sent): fail fast and say why.
TEST(OrderlyClose, SocketRecvFromDepartedPeerFails) { expect_clear_failure("socket", 0, 4 << 10); }
TEST(OrderlyClose, SocketRecvAfterItsLastMessageFails) { expect_clear_failure("socket", 2 << 20, 2 << 20); }
TEST(OrderlyClose, ShmRecvFromDepartedPeerFails) { expect_clear_failure("shm", 0, 4 << 10); }
TEST(OrderlyClose, ShmRecvAfterItsLastMessageFails) { expect_clear_failure("shm", 4 << 10, 4 << 10); }
// A send larger than what the FIFO / rings and socket buffers take to a
// rank that left: it can never complete, so it fails too.
TEST(OrderlyClose, ShmSendToDepartedPeerFails) { expect_clear_failure("shm", 0, 8 << 20, true); }
TEST(OrderlyClose, SocketSendToDepartedPeerFails) { expect_clear_failure("socket", 0, 64 << 20, true); }

}  // namespace
}  // namespace loom
