// Starting ranks inside the hosts of a NetnsLab (see netns_lab.h): each rank
// is a forked child that joins its host's namespace, takes the host's name as
// LOOM_HOST_ID and initialises from the environment (rank 0 hosts the
// rendezvous root on its eth0 address).
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "netns_lab.h"

namespace loom::testing {

constexpr int kLabRootPort = 29411;

inline int write_result(int fd, const std::string& m, int rc) {
  (void)!write(fd, m.data(), m.size());
  return rc;
}

// Runs body(comm, rank) in rank processes placed on hosts[rank] (after_fork:
// see run_processes; a test's threads start there). Child exit
// codes: body's, or 90 (could not join the namespace) / 91 (init failed; the
// error is in the output).
inline std::vector<ChildResult> run_on_hosts(const NetnsLab& lab, const std::vector<int>& hosts, const Config& cfg,
                                             const std::function<int(Comm&, int rank, int fd)>& body,
                                             int timeout_s = 120, const std::function<void()>& after_fork = {}) {
  const int n = static_cast<int>(hosts.size());
  // Loom's own deadline (unless the config or LOOM_TIMEOUT sets one) comes
  // well before the harness's kill, so a hang ends as Loom's diagnosis in the
  // output rather than only as a kill.
  Config with_deadline = cfg;
  if (with_deadline.timeout_s <= 0 && !std::getenv("LOOM_TIMEOUT")) with_deadline.timeout_s = std::max(5, timeout_s / 3);
  return run_processes(n, [&](int r, int fd) {
    if (!lab.enter(hosts[r])) return write_result(fd, "cannot join namespace " + lab.host(hosts[r]), 90);
    // The lab's hosts reach each other over their veth links: an interface
    // pinned in the caller's environment (LOOM_SOCKET_IFNAME=lo, as the rest
    // of the suite runs) would make every rank listen on its own loopback.
    // Regression: NetnsDoctor and NetnsFaults timed out connecting when run
    // with the variable exported.
    unsetenv("LOOM_SOCKET_IFNAME");
    unsetenv("NCCL_SOCKET_IFNAME");
    setenv("LOOM_HOST_ID", lab.host(hosts[r]).c_str(), 1);
    setenv("LOOM_RANK", std::to_string(r).c_str(), 1);
    setenv("LOOM_WORLD_SIZE", std::to_string(n).c_str(), 1);
    setenv("LOOM_ROOT_ADDR", (NetnsLab::addr(hosts[0]) + ":" + std::to_string(kLabRootPort)).c_str(), 1);
    auto comm = Comm::init_from_env(with_deadline);
    if (!comm.is_ok()) return write_result(fd, comm.status().to_string(), 91);
    return body(**comm, r, fd);
  }, timeout_s, after_fork);
}

// TCP sockets held by this process.
inline int count_own_sockets() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      char target[128] = {};
      ssize_t len = readlink((std::string("/proc/self/fd/") + e->d_name).c_str(), target, sizeof(target) - 1);
      if (len > 7 && std::string(target, 7) == "socket:") ++n;
    }
    closedir(d);
  }
  return n;
}

}  // namespace loom::testing
