#include "bootstrap/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <vector>

#include "core/config.h"

namespace loom {

uint16_t SockAddr::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

void SockAddr::set_port(uint16_t p) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(p);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(p);
}

bool SockAddr::is_loopback() const {
  if (family() == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr) >> 24) == 127;
  if (family() == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr);
  return false;
}

std::string SockAddr::to_string() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, buf, sizeof(buf));
    return std::string(buf) + ":" + std::to_string(port());
  }
  if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, buf, sizeof(buf));
    return "[" + std::string(buf) + "]:" + std::to_string(port());
  }
  return "<no address>";
}

Result<SockAddr> parse_sockaddr(const std::string& text) {
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return invalid_argument("bad address '" + text + "': expected [v6addr]:port");
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos) return invalid_argument("bad address '" + text + "': expected host:port");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end || p < 0 || p > 65535)
    return invalid_argument("bad port in address '" + text + "'");
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_family = AF_UNSPEC;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) return invalid_argument("cannot resolve host '" + host + "': " + gai_strerror(rc));
  SockAddr a;
  std::memcpy(&a.storage, res->ai_addr, res->ai_addrlen);
  a.len = res->ai_addrlen;
  freeaddrinfo(res);
  a.set_port(static_cast<uint16_t>(p));
  return a;
}

SockAddr loopback_addr(uint16_t port) {
  SockAddr a;
  auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
  in->sin_family = AF_INET;
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  in->sin_port = htons(port);
  a.len = sizeof(sockaddr_in);
  return a;
}

Result<SockAddr> local_addr_towards(const SockAddr& remote) {
  Fd s(socket(remote.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return system_error("socket", errno);
  // connect() on a UDP socket only selects the route; nothing is sent.
  if (connect(s.get(), reinterpret_cast<const sockaddr*>(&remote.storage), remote.len) != 0)
    return system_error("no route to " + remote.to_string(), errno);
  SockAddr local;
  local.len = sizeof(local.storage);
  if (getsockname(s.get(), reinterpret_cast<sockaddr*>(&local.storage), &local.len) != 0)
    return system_error("getsockname", errno);
  local.set_port(0);
  return local;
}

namespace {

// NCCL_SOCKET_IFNAME grammar: comma list of prefixes; '^' excludes the list;
// '=' requires exact names.
bool ifname_matches(const std::string& spec_in, const std::string& name) {
  std::string spec = spec_in;
  bool exclude = false, exact = false;
  if (!spec.empty() && spec[0] == '^') { exclude = true; spec = spec.substr(1); }
  if (!spec.empty() && spec[0] == '=') { exact = true; spec = spec.substr(1); }
  bool hit = false;
  std::stringstream ss(spec);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    if (tok.empty()) continue;
    if (exact ? name == tok : name.rfind(tok, 0) == 0) hit = true;
  }
  return exclude ? !hit : hit;
}

}  // namespace

namespace {
// An address a rendezvous root can listen on and name in a unique id: its
// interface up, IPv4 or IPv6 but not IPv6 link-local (the scope id does not
// travel in an id).
bool usable(const InterfaceAddr& a) {
  if (!a.up) return false;
  if (a.addr.family() == AF_INET) return true;
  return a.addr.family() == AF_INET6 &&
         !IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(&a.addr.storage)->sin6_addr);
}
}  // namespace

bool pick_default_interface(const std::vector<InterfaceAddr>& ifs, SockAddr* out, std::string* name) {
  auto rank = [](const InterfaceAddr& a) {
    if (a.loopback) return 3;
    if (a.name.rfind("docker", 0) == 0) return 2;
    return a.name.rfind("ib", 0) == 0 ? 0 : 1;
  };
  const InterfaceAddr* best = nullptr;
  auto key = [&](const InterfaceAddr& a) { return 2 * rank(a) + (a.addr.family() == AF_INET ? 0 : 1); };
  for (const auto& a : ifs)
    if (usable(a) && (!best || key(a) < key(*best))) best = &a;
  if (!best) return false;
  *out = best->addr;
  out->set_port(0);
  if (name) *name = best->name;
  return true;
}

namespace {

std::vector<InterfaceAddr> list_interfaces(int* error) {
  std::vector<InterfaceAddr> out;
  ifaddrs* ifs = nullptr;
  *error = getifaddrs(&ifs) != 0 ? errno : 0;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
    InterfaceAddr a;
    a.name = i->ifa_name;
    a.up = (i->ifa_flags & IFF_UP) != 0;
    a.loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
    a.addr.len = i->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&a.addr.storage, i->ifa_addr, a.addr.len);
    out.push_back(std::move(a));
  }
  if (ifs) freeifaddrs(ifs);
  return out;
}

}  // namespace

Result<SockAddr> default_listen_addr() {
  std::string spec = env_string("LOOM_SOCKET_IFNAME", "");
  int error = 0;
  std::vector<InterfaceAddr> ifs = list_interfaces(&error);
  if (error) return system_error("getifaddrs", error);
  SockAddr found;
  if (spec.empty()) {
    if (!pick_default_interface(ifs, &found)) return loopback_addr();
    return found;
  }
  for (int want : {AF_INET, AF_INET6}) {
    for (const auto& a : ifs) {
      if (a.addr.family() != want || !usable(a) || !ifname_matches(spec, a.name)) continue;
      found = a.addr;
      found.set_port(0);
      return found;
    }
  }
  return invalid_argument("LOOM_SOCKET_IFNAME='" + spec + "' matches no interface that is up and has an address");
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void set_nonblocking(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

Result<Fd> tcp_listen(const SockAddr& addr, SockAddr* bound, int backlog) {
  Fd s(socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return system_error("socket", errno);
  int one = 1;
  setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(s.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) != 0)
    return system_error("bind " + addr.to_string(), errno);
  if (listen(s.get(), backlog) != 0) return system_error("listen", errno);
  if (bound) {
    bound->len = sizeof(bound->storage);
    getsockname(s.get(), reinterpret_cast<sockaddr*>(&bound->storage), &bound->len);
  }
  return s;
}

namespace {
// Waits for `events` on fd in slices of at most 100 ms.
Status wait_fd(int fd, short events, Deadline deadline, const std::atomic<bool>* abort, const char* what) {
  for (;;) {
    if (abort && abort->load(std::memory_order_relaxed)) return aborted_error(std::string(what) + ": aborted");
    auto now = Clock::now();
    if (now >= deadline) return timeout_error(std::string(what) + ": deadline passed");
    int ms = static_cast<int>(std::min<int64_t>(
        100, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1));
    pollfd p{fd, events, 0};
    int rc = poll(&p, 1, ms);
    if (rc > 0) return Status::ok();
    if (rc < 0 && errno != EINTR) return system_error(std::string(what) + ": poll", errno);
  }
}
}  // namespace

Result<Fd> tcp_connect(const SockAddr& addr, Deadline deadline, const std::atomic<bool>* abort) {
  int delay_ms = 10;
  for (;;) {
    Fd s(socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) return system_error("socket", errno);
    set_nonblocking(s.get(), true);
    int rc = connect(s.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      Status st = wait_fd(s.get(), POLLOUT, deadline, abort, "connect");
      if (!st.is_ok()) return st.with_context("connecting to " + addr.to_string());
      socklen_t len = sizeof(err);
      getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err == 0) {
      set_nonblocking(s.get(), false);
      set_nodelay(s.get());
      return s;
    }
    if (err != ECONNREFUSED && err != ETIMEDOUT && err != EHOSTUNREACH && err != ENETUNREACH && err != ECONNRESET)
      return system_error("connect to " + addr.to_string(), err);
    if (abort && abort->load()) return aborted_error("connect to " + addr.to_string() + ": aborted");
    if (Clock::now() + std::chrono::milliseconds(delay_ms) >= deadline)
      return timeout_error("could not connect to " + addr.to_string() + " before the deadline (last error: " +
                           std::strerror(err) + "); is the root process running and the address right?");
    usleep(delay_ms * 1000);
    delay_ms = std::min(delay_ms * 2, 200);
  }
}

Result<Fd> tcp_accept(int listen_fd, Deadline deadline, const std::atomic<bool>* abort, SockAddr* peer) {
  for (;;) {
    LOOM_RETURN_IF_ERROR(wait_fd(listen_fd, POLLIN, deadline, abort, "accept"));
    SockAddr a;
    a.len = sizeof(a.storage);
    int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&a.storage), &a.len, SOCK_CLOEXEC);
    if (fd >= 0) {
      if (peer) *peer = a;
      set_nodelay(fd);
      return Fd(fd);
    }
    if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) return system_error("accept", errno);
  }
}

Status send_all(int fd, const void* data, size_t len, Deadline deadline, const std::atomic<bool>* abort) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      LOOM_RETURN_IF_ERROR(wait_fd(fd, POLLOUT, deadline, abort, "send"));
      continue;
    }
    return system_error("send", errno);
  }
  return Status::ok();
}

Status recv_all(int fd, void* data, size_t len, Deadline deadline, const std::atomic<bool>* abort) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return remote_error("connection closed by peer");
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      LOOM_RETURN_IF_ERROR(wait_fd(fd, POLLIN, deadline, abort, "recv"));
      continue;
    }
    return system_error("recv", errno);
  }
  return Status::ok();
}

}  // namespace loom
