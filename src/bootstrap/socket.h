// Small TCP helpers with deadlines, shared by the bootstrap and the socket
// transport. Every blocking call polls in short slices so it can honour both
// its deadline and an abort flag.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/status.h"

namespace loom {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// The longest wait a deadline stands for (~116 days): beyond it, or for
// infinity or NaN, the conversion to the clock's 64-bit nanoseconds
// overflowed (undefined; in practice a deadline in the past, so every wait
// failed at once).
constexpr double kMaxDeadlineS = 1e7;
inline double clamp_deadline_s(double seconds) { return seconds < kMaxDeadlineS ? seconds : kMaxDeadlineS; }

inline Deadline deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(clamp_deadline_s(seconds)));
}

// The same from the coarse monotonic clock (steady_clock's base at a few ms
// resolution; a few ns per read instead of ~18 here): early by at most one
// tick, for per-op deadlines of seconds where every read counts.
inline Deadline coarse_deadline_after(double seconds) {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  const auto now = Deadline(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
  return now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(clamp_deadline_s(seconds)));
}

// An IPv4 or IPv6 socket address.
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;

  int family() const { return storage.ss_family; }
  uint16_t port() const;
  void set_port(uint16_t port);
  bool is_loopback() const;
  std::string to_string() const;  // "127.0.0.1:1234" / "[::1]:1234"
};

// Parses "host:port", "[v6addr]:port" or "v4addr:port"; resolves names with getaddrinfo.
Result<SockAddr> parse_sockaddr(const std::string& text);
SockAddr loopback_addr(uint16_t port = 0);

// The local address this machine would use to reach `remote` (no packet is sent).
Result<SockAddr> local_addr_towards(const SockAddr& remote);

// One address of one interface, as getifaddrs lists them.
struct InterfaceAddr {
  std::string name;
  SockAddr addr;
  bool up = false;
  bool loopback = false;  // IFF_LOOPBACK
};

// The interface address a rendezvous root listens on when none is named,
// NCCL's documented default: an InfiniBand (ib*) interface first, then any
// other but loopback and docker*, then docker*, then loopback; IPv4 before
// IPv6 within each class, list order otherwise. Skips interfaces that are
// down and IPv6 link-local addresses (their scope cannot travel in a unique
// id). Port 0. False only when the list has no usable address.
bool pick_default_interface(const std::vector<InterfaceAddr>& ifs, SockAddr* out, std::string* name = nullptr);

// The address get_unique_id's root listens on: LOOM_SOCKET_IFNAME (NCCL
// grammar) when set, else pick_default_interface over this machine's
// interfaces (loopback when nothing else is up), so an id made on one host
// can be used from others, as NCCL's ncclGetUniqueId.
Result<SockAddr> default_listen_addr();

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Listens on addr (port 0 = ephemeral); `bound` receives the actual address.
Result<Fd> tcp_listen(const SockAddr& addr, SockAddr* bound, int backlog = 128);
// Connects, retrying refused/unreachable attempts until the deadline
// (the listener may not be up yet).
Result<Fd> tcp_connect(const SockAddr& addr, Deadline deadline, const std::atomic<bool>* abort = nullptr);
// Accepts one connection or times out.
Result<Fd> tcp_accept(int listen_fd, Deadline deadline, const std::atomic<bool>* abort = nullptr,
                      SockAddr* peer = nullptr);

Status send_all(int fd, const void* data, size_t len, Deadline deadline, const std::atomic<bool>* abort = nullptr);
Status recv_all(int fd, void* data, size_t len, Deadline deadline, const std::atomic<bool>* abort = nullptr);

void set_nodelay(int fd);
void set_nonblocking(int fd, bool on);

}  // namespace loom
