// A small multi-host lab on one machine for the netns tests: N network
// namespaces ("hosts") each with an eth0 on a bridge that lives in its own
// "switch" namespace, so nothing is added to the machine's own namespace.
// Addresses come from 198.51.100.0/24 (documentation range) and exist only
// inside these namespaces.
//
// Needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN for setns). Namespaces are named
// "loomnt-<pid>-..."; the destructor removes them, and the constructor first
// removes leftovers of earlier runs whose process is gone (a crashed test).
//
// Ranks run in forked children that join a host with setns(CLONE_NEWNET) —
// what `ip netns exec` does, minus the exec — and take LOOM_HOST_ID = the
// host's name, so ranks of one host share memory and the others use TCP.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace loom::testing {

class NetnsLab {
 public:
  static constexpr const char* kPrefix = "loomnt-";

  // Empty when the lab can run here; else why not (for GTEST_SKIP).
  static std::string unavailable() {
    if (geteuid() != 0) return "netns tests need root (network namespaces, veth, bridge); run them as root";
    if (system("ip netns list >/dev/null 2>&1") != 0) return "`ip netns` does not work here (iproute2 missing?)";
    return "";
  }

  explicit NetnsLab(int nhosts) : tag_(std::string(kPrefix) + std::to_string(getpid())) {
    remove_stale();
    ok_ = sh("ip netns add " + sw()) && sh(in(sw()) + "ip link set lo up") &&
          sh(in(sw()) + "ip link add br0 type bridge") && sh(in(sw()) + "ip link set br0 up");
    for (int i = 0; ok_ && i < nhosts; ++i) {
      const std::string h = host(i), v = "v" + std::to_string(i);
      ok_ = sh("ip netns add " + h) && sh(in(h) + "ip link set lo up") &&
            sh("ip -n " + sw() + " link add " + v + " type veth peer name eth0 netns " + h) &&
            sh("ip -n " + sw() + " link set " + v + " master br0 up") &&
            sh(in(h) + "ip addr add " + addr(i) + "/24 dev eth0") && sh(in(h) + "ip link set eth0 up");
      if (ok_) ++nhosts_;
    }
  }
  ~NetnsLab() {
    for (int i = 0; i < nhosts_ + 1; ++i) sh("ip netns del " + host(i) + " 2>/dev/null");
    sh("ip netns del " + sw() + " 2>/dev/null");
  }
  NetnsLab(const NetnsLab&) = delete;
  NetnsLab& operator=(const NetnsLab&) = delete;

  bool ok() const { return ok_; }
  int nhosts() const { return nhosts_; }
  std::string host(int i) const { return tag_ + "-h" + std::to_string(i); }
  std::string sw() const { return tag_ + "-sw"; }
  static std::string addr(int i) { return "198.51.100." + std::to_string(10 + i); }

  // Cuts host i off the bridge (or reconnects it).
  bool set_link(int i, bool up) const {
    return sh("ip -n " + sw() + " link set v" + std::to_string(i) + (up ? " up" : " down"));
  }
  // Runs a command inside host i's namespace.
  bool run_in(int i, const std::string& cmd) const { return sh(in(host(i)) + cmd); }

  // In a forked child: join host i's network namespace.
  bool enter(int i) const {
    int fd = open(("/var/run/netns/" + host(i)).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool ok = setns(fd, CLONE_NEWNET) == 0;
    close(fd);
    return ok;
  }

  // Prefix of every namespace of this lab; existing(prefix()) is the leak check.
  std::string prefix() const { return tag_ + "-"; }
  static std::vector<std::string> existing(const std::string& prefix) { return list(prefix); }

  static bool sh(const std::string& cmd) { return system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

 private:
  static std::string in(const std::string& ns) { return "ip netns exec " + ns + " "; }

  static std::vector<std::string> list(const std::string& prefix) {
    std::vector<std::string> out;
    FILE* p = popen("ip netns list 2>/dev/null", "r");
    if (!p) return out;
    char line[512];
    while (fgets(line, sizeof(line), p)) {
      std::istringstream ss(line);
      std::string name;
      ss >> name;
      if (name.rfind(prefix, 0) == 0) out.push_back(name);
    }
    pclose(p);
    return out;
  }

  // Namespaces of earlier runs whose test process no longer exists.
  static void remove_stale() {
    for (const auto& name : list(kPrefix)) {
      long pid = std::strtol(name.c_str() + std::char_traits<char>::length(kPrefix), nullptr, 10);
      if (pid > 0 && kill(static_cast<pid_t>(pid), 0) == 0 && pid != getpid()) continue;  // still running
      sh("ip netns del " + name);
    }
  }

  std::string tag_;
  int nhosts_ = 0;
  bool ok_ = false;
};

}  // namespace loom::testing
