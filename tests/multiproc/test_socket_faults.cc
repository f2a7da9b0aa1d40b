// Failure paths of the socket transport on loopback: a peer that exits in the
// middle of a message, a killed peer, an abort announced over the control
// stream, strangers on the rendezvous port and on the transport's own port,
// and a wrong root port. Each ends in a clear error (or, for strangers, in a
// working communicator), never a crash or an endless wait.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "bootstrap/bootstrap.h"
#include "common/test_util.h"
#include "transport/socket/socket_transport.h"

namespace loom {
namespace {

using Secs = std::chrono::duration<double>;

class SocketFaults : public ::testing::Test {
 protected:
  void SetUp() override { setenv("LOOM_TRANSPORT", "socket", 1); }
  void TearDown() override {
    unsetenv("LOOM_TRANSPORT");
    EXPECT_TRUE(testing::loom_shm_segments().empty());
  }
};

int report(int fd, const std::string& m, int rc) {
  (void)!write(fd, m.data(), m.size());
  return rc;
}

TEST_F(SocketFaults, PeerClosesMidMessage) {
  auto id = testing::unique_id();
  ASSERT_TRUE(id.is_ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto res = testing::run_processes(2, [&](int r, int fd) {
    Config cfg;
    cfg.timeout_s = 60;
    auto comm = Comm::init_rank(*id, 2, r, cfg);
    if (!comm.is_ok()) return report(fd, comm.status().to_string(), 3);
    std::vector<float> buf(16 << 20, 1.0f);  // 64 MiB: far more than rings and socket buffers hold
    if (r == 1) {
      auto w = (*comm)->send(buf.data(), buf.size(), DataType::kFloat32, 0);
      usleep(300 * 1000);
      _exit(0);  // leaves in the middle of the message
    }
    usleep(800 * 1000);
    auto w = (*comm)->recv(buf.data(), buf.size(), DataType::kFloat32, 1);
    Status st = w.is_ok() ? w->wait() : w.status();
    return report(fd, st.to_string(), st.is_ok() ? 0 : 2);
  }, 60);
  const double secs = Secs(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(WIFEXITED(res[0].status)) << res[0].output;
  EXPECT_EQ(WEXITSTATUS(res[0].status), 2) << res[0].output;
  EXPECT_NE(res[0].output.find("rank 1"), std::string::npos) << res[0].output;
  EXPECT_NE(res[0].output.find("closed the connection"), std::string::npos) << res[0].output;
  EXPECT_LT(secs, 20.0);
}

TEST_F(SocketFaults, KilledPeerIsNamed) {
  const int n = 3, victim = 2;
  auto id = testing::unique_id();
  ASSERT_TRUE(id.is_ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto res = testing::run_processes(n, [&](int r, int fd) {
    Config cfg;
    cfg.timeout_s = 60;
    auto comm = Comm::init_rank(*id, n, r, cfg);
    if (!comm.is_ok()) return report(fd, comm.status().to_string(), 3);
    std::vector<float> buf(1 << 20, 1.0f);
    for (int it = 0;; ++it) {
      if (r == victim && it == 5) raise(SIGKILL);
      auto w = (*comm)->allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, RedOp::kSum);
      Status st = w.is_ok() ? w->wait() : w.status();
      if (!st.is_ok()) return report(fd, st.to_string(), 2);
      std::fill(buf.begin(), buf.end(), 1.0f);
    }
  }, 90);
  const double secs = Secs(std::chrono::steady_clock::now() - t0).count();
  for (int r = 0; r < n; ++r) {
    if (r == victim) {
      EXPECT_TRUE(WIFSIGNALED(res[r].status));
      continue;
    }
    EXPECT_TRUE(WIFEXITED(res[r].status) && WEXITSTATUS(res[r].status) == 2) << res[r].output;
    EXPECT_NE(res[r].output.find("rank " + std::to_string(victim)), std::string::npos) << res[r].output;
    EXPECT_NE(res[r].output.find("allreduce"), std::string::npos) << res[r].output;
  }
  EXPECT_LT(secs, 30.0);
}

TEST_F(SocketFaults, AbortReachesRemotePeerWithReason) {
  auto id = testing::unique_id();
  ASSERT_TRUE(id.is_ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto res = testing::run_processes(2, [&](int r, int fd) {
    Config cfg;
    cfg.timeout_s = 60;
    auto comm = Comm::init_rank(*id, 2, r, cfg);
    if (!comm.is_ok()) return report(fd, comm.status().to_string(), 3);
    std::vector<float> buf(1024);
    if (r == 1) {
      usleep(300 * 1000);
      (*comm)->abort("injected failure 7f3a");
      usleep(2000 * 1000);  // stay alive: the peer must learn the reason, not just see a closed socket
      return 0;
    }
    auto w = (*comm)->recv(buf.data(), buf.size(), DataType::kFloat32, 1);
    Status st = w.is_ok() ? w->wait() : w.status();
    return report(fd, st.to_string(), st.is_ok() ? 0 : 2);
  }, 60);
  const double secs = Secs(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(WIFEXITED(res[0].status) && WEXITSTATUS(res[0].status) == 2) << res[0].output;
  EXPECT_NE(res[0].output.find("injected failure 7f3a"), std::string::npos) << res[0].output;
  EXPECT_NE(res[0].output.find("rank 1"), std::string::npos) << res[0].output;
  EXPECT_LT(secs, 10.0);
}

// Opens a connection to addr and optionally writes bytes; the fd stays open.
Fd stranger(const SockAddr& addr, const void* data, size_t len) {
  auto fd = tcp_connect(addr, deadline_after(5));
  if (!fd.is_ok()) return Fd();
  if (len) (void)send_all(fd->get(), data, len, deadline_after(5));
  return std::move(fd).value();
}

TEST_F(SocketFaults, StrangersAtTheRendezvousAreDropped) {
  auto id = testing::unique_id();
  ASSERT_TRUE(id.is_ok());
  auto uid = decode_uid(*id);
  ASSERT_TRUE(uid.is_ok());
  char garbage[256];
  for (size_t i = 0; i < sizeof(garbage); ++i) garbage[i] = static_cast<char>(i * 37 + 11);
  Fd g = stranger(uid->root, garbage, sizeof(garbage));
  Fd silent = stranger(uid->root, nullptr, 0);
  ASSERT_TRUE(g.valid() && silent.valid());
  auto res = testing::run_processes(3, [&](int r, int fd) {
    auto comm = Comm::init_rank(*id, 3, r);
    if (!comm.is_ok()) return report(fd, comm.status().to_string(), 3);
    testing::Case c;
    c.count = 4099;
    Status st = testing::run_case(**comm, c);
    if (!st.is_ok()) return report(fd, st.to_string(), 2);
    return (*comm)->destroy().is_ok() ? 0 : 4;
  }, 60);
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(WIFEXITED(res[r].status) && WEXITSTATUS(res[r].status) == 0) << "rank " << r << ": " << res[r].output;
}

// White-box: strangers on the socket transport's own listening port during
// setup (garbage, silence, a hello with the wrong secret) are dropped and the
// connection between the real ranks carries a message intact.
TEST_F(SocketFaults, StrangersAtTheTransportPortAreDropped) {
  auto id = testing::unique_id();
  ASSERT_TRUE(id.is_ok());
  auto res = testing::run_processes(2, [&](int r, int fd) {
    auto uid = decode_uid(*id);
    auto boot = Bootstrap::connect(*uid, 2, r, deadline_after(30));
    if (!boot.is_ok()) return report(fd, boot.status().to_string(), 3);
    std::vector<Fd> strangers;
    SocketTransport::Options opt = SocketTransport::Options::from_env();
    opt.slice_bytes = 4096;
    opt.ring_bytes = 64 << 10;
    opt.on_listen = [&](const SockAddr& a) {
      if (r != 1) return;  // rank 1 accepts rank 0's streams
      const char junk[] = "GET / HTTP/1.0\r\n\r\n and some more bytes to fill a hello....";
      strangers.push_back(stranger(a, junk, sizeof(junk)));
      strangers.push_back(stranger(a, nullptr, 0));
      struct {
        uint32_t magic = 0x4c4f534b;
        uint16_t version = 1, stream = 0;
        uint64_t secret = 12345;
        int32_t rank = 0, nsocks = 2;
        uint64_t slice = 4096;
      } forged;
      strangers.push_back(stranger(a, &forged, sizeof(forged)));
    };
    const auto t0 = std::chrono::steady_clock::now();
    auto t = SocketTransport::create(**boot, {true, true}, opt, deadline_after(30));
    if (!t.is_ok()) return report(fd, t.status().to_string(), 4);
    if (Secs(std::chrono::steady_clock::now() - t0).count() > 10) return report(fd, "setup stalled", 5);
    Connection* c = (*t)->connection(1 - r);
    std::vector<uint32_t> msg(300001);  // many times the ring, odd length
    size_t bytes = msg.size() * sizeof(uint32_t) - 2;
    size_t done = 0;
    auto dl = deadline_after(30);
    if (r == 0) {
      for (size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<uint32_t>(i * 2654435761u);
      auto* p = reinterpret_cast<const std::byte*>(msg.data());
      while (done < bytes && Clock::now() < dl) {
        uint32_t ev = (*t)->events();
        size_t k = c->send_some(p + done, bytes - done);
        done += k;
        if (!k) (*t)->wait_events(ev, std::chrono::milliseconds(10));
      }
    } else {
      auto* p = reinterpret_cast<std::byte*>(msg.data());
      while (done < bytes && Clock::now() < dl) {
        uint32_t ev = (*t)->events();
        auto s = c->recv_peek(bytes - done);
        if (s.empty()) {
          (*t)->wait_events(ev, std::chrono::milliseconds(10));
          continue;
        }
        std::memcpy(p + done, s.data(), s.size());
        c->recv_consume(s.size(), bytes - done);
        done += s.size();
      }
      for (size_t i = 0; i < bytes / 4; ++i)
        if (msg[i] != static_cast<uint32_t>(i * 2654435761u)) return report(fd, "corrupt at word " + std::to_string(i), 6);
    }
    if (done != bytes) return report(fd, "incomplete: " + std::to_string(done), 7);
    t->reset();  // flushes rank 0's ring before closing
    return 0;
  }, 60);
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(WIFEXITED(res[r].status) && WEXITSTATUS(res[r].status) == 0) << "rank " << r << ": " << res[r].output;
}

TEST_F(SocketFaults, WrongRootPortIsAClearTimeout) {
  // A loopback port nobody listens on.
  SockAddr bound;
  {
    auto l = tcp_listen(loopback_addr(0), &bound);
    ASSERT_TRUE(l.is_ok());
  }
  UidContents uid{random_secret(), bound};
  Config cfg;
  cfg.timeout_s = 2;
  const auto t0 = std::chrono::steady_clock::now();
  auto comm = Comm::init_rank(encode_uid(uid), 2, 1, cfg);
  const double secs = Secs(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(comm.is_ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kTimeout) << comm.status().to_string();
  EXPECT_NE(comm.status().message().find(bound.to_string()), std::string::npos) << comm.status().to_string();
  EXPECT_LT(secs, 8.0);
}

}  // namespace
}  // namespace loom
