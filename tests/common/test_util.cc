#include "common/test_util.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "kernels/host_reduce.h"
#include "loom/memory.h"
#include "verifiable.h"

namespace loom::testing {

std::string Case::name() const {
  return fmt::format("{} {} {} count={} {}{}{}", collective_name(coll), dtype_name(dt), redop_name(op), count,
                     in_place ? "in-place" : "out-of-place",
                     (coll == Collective::kBroadcast || coll == Collective::kReduce) ? fmt::format(" root={}", root) : "",
                     shared_buffers ? " mem_alloc" : "");
}

std::vector<std::string> run_cases_on_threads(std::vector<std::unique_ptr<Comm>>& comms,
                                              const std::vector<Case>& cases) {
  const size_t n = comms.size();
  std::vector<std::string> err(n);
  std::vector<std::thread> ts;
  for (size_t r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      for (const auto& c : cases) {
        Status st = run_case(*comms[r], c);
        if (!st.is_ok()) {
          err[r] = c.name() + ": " + st.to_string();
          comms[r]->abort("test failure on this rank");
          return;
        }
      }
    });
  for (auto& t : ts) t.join();
  return err;
}

namespace {
// A case's buffer: heap, or loom::mem_alloc (Case::shared_buffers), filled with `fill`.
class Buf {
 public:
  Buf(size_t bytes, std::byte fill, bool shared) : shared_(shared) {
    if (shared) {
      Result<void*> r = mem_alloc(std::max<size_t>(bytes, 1));
      p_ = r.is_ok() ? static_cast<std::byte*>(*r) : nullptr;
    } else {
      p_ = static_cast<std::byte*>(std::malloc(std::max<size_t>(bytes, 1)));
    }
    if (p_) std::memset(p_, static_cast<int>(fill), bytes);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() {
    if (shared_) (void)mem_free(p_);
    else std::free(p_);
  }
  std::byte* data() const { return p_; }
  std::byte& operator[](size_t i) const { return p_[i]; }

 private:
  std::byte* p_ = nullptr;
  bool shared_;
};
}  // namespace

Status run_case(Comm& comm, const Case& c) {
  const int n = comm.size(), r = comm.rank();
  const size_t es = dtype_size(c.dt);
  // Buffer sizes in elements, NCCL conventions.
  size_t send_count = c.count, recv_count = c.count;
  switch (c.coll) {
    case Collective::kReduceScatter: send_count = c.count * n; break;
    case Collective::kAllGather: recv_count = c.count * n; break;
    case Collective::kAllToAll: send_count = recv_count = c.count * n; break;
    default: break;
  }
  const size_t big = std::max(send_count, recv_count);
  // Guard bytes after each buffer catch overruns.
  constexpr size_t kGuard = 64;
  Buf sendv(send_count * es + kGuard, std::byte{0x5a}, c.shared_buffers),
      recvv(big * es + kGuard, std::byte{0xa5}, c.shared_buffers);
  if (!sendv.data() || !recvv.data()) return system_error(c.name() + ": allocating the buffers", ENOMEM);
  std::byte* sendp = sendv.data();
  std::byte* recvp = recvv.data();
  const bool reduces = c.coll == Collective::kAllReduce || c.coll == Collective::kReduceScatter || c.coll == Collective::kReduce;
  const RedOp fill_op = reduces ? c.op : RedOp::kSum;
  if (c.in_place) {
    switch (c.coll) {
      case Collective::kReduceScatter:
        fill(recvp, send_count, c.dt, fill_op, r, n);
        sendp = recvp;
        recvp = recvp + r * c.count * es;
        break;
      case Collective::kAllGather:
        fill(recvp + r * c.count * es, c.count, c.dt, fill_op, r, n);
        sendp = recvp + r * c.count * es;
        break;
      case Collective::kAllToAll:
        fill(recvp, send_count, c.dt, fill_op, r, n);
        sendp = recvp;
        break;
      default:
        fill(recvp, send_count, c.dt, fill_op, r, n);
        sendp = recvp;
        break;
    }
  } else {
    fill(sendp, send_count, c.dt, fill_op, r, n);
  }
  Result<Work> w = invalid_usage("unset");
  switch (c.coll) {
    case Collective::kAllReduce: w = comm.allreduce(sendp, recvp, c.count, c.dt, c.op); break;
    case Collective::kReduceScatter: w = comm.reduce_scatter(sendp, recvp, c.count, c.dt, c.op); break;
    case Collective::kAllGather: w = comm.all_gather(sendp, recvp, c.count, c.dt); break;
    case Collective::kBroadcast: w = comm.broadcast(sendp, recvp, c.count, c.dt, c.root); break;
    case Collective::kReduce: w = comm.reduce(sendp, recvp, c.count, c.dt, c.op, c.root); break;
    case Collective::kAllToAll: w = comm.all_to_all(sendp, recvp, c.count, c.dt); break;
    case Collective::kSendRecv: {
      // Ring exchange in a group: send to r+1, receive from r-1, plus to/from self.
      comm.group_start();
      (void)comm.send(sendp, c.count, c.dt, (r + 1) % n);
      (void)comm.recv(recvp, c.count, c.dt, (r - 1 + n) % n);
      w = comm.group_end();
      break;
    }
  }
  if (!w.is_ok()) return w.status().with_context(c.name());
  Status st = w->wait();
  if (!st.is_ok()) return st.with_context(c.name());

  std::string first;
  size_t wrong = 0;
  auto out = recvp;
  switch (c.coll) {
    case Collective::kAllReduce: wrong = count_wrong_reduced(out, c.count, c.dt, c.op, n, 0, &first); break;
    case Collective::kReduceScatter:
      wrong = count_wrong_reduced(out, c.count, c.dt, c.op, n, r * c.count, &first);
      break;
    case Collective::kReduce:
      if (r == c.root) wrong = count_wrong_reduced(out, c.count, c.dt, c.op, n, 0, &first);
      break;
    case Collective::kAllGather:
      for (int b = 0; b < n && !wrong; ++b)
        wrong = count_wrong_copied(out + b * c.count * es, c.count, c.dt, fill_op, b, 0, &first);
      break;
    case Collective::kBroadcast: wrong = count_wrong_copied(out, c.count, c.dt, fill_op, c.root, 0, &first); break;
    case Collective::kAllToAll:
      // Block b of our output is block r of rank b's input.
      for (int b = 0; b < n && !wrong; ++b)
        wrong = count_wrong_copied(out + b * c.count * es, c.count, c.dt, fill_op, b, r * c.count, &first);
      break;
    case Collective::kSendRecv:
      wrong = count_wrong_copied(out, c.count, c.dt, fill_op, (r - 1 + n) % n, 0, &first);
      break;
  }
  if (wrong) return internal_error(fmt::format("{} on rank {}/{}: {} wrong element(s); {}", c.name(), r, n, wrong, first));
  // Guards: nothing written past the buffers.
  for (size_t i = 0; i < kGuard; ++i) {
    if (recvv[big * es + i] != std::byte{0xa5})
      return internal_error(fmt::format("{} on rank {}: wrote past the end of the receive buffer", c.name(), r));
  }
  return Status::ok();
}

std::vector<Case> mixed_cases(int nranks, const std::vector<size_t>& counts, const std::vector<Collective>& colls,
                              bool shared_buffers) {
  std::vector<Case> cases;
  int k = 0;
  for (size_t count : counts) {
    for (Collective c : colls) {
      Case cs;
      cs.coll = c;
      cs.count = count;
      cs.dt = (k % 2) ? DataType::kFloat32 : DataType::kInt8;
      cs.in_place = (k % 3) == 1 && c != Collective::kSendRecv;
      cs.root = k % nranks;
      cs.shared_buffers = shared_buffers;
      ++k;
      cases.push_back(cs);
    }
  }
  return cases;
}

std::vector<Case> correctness_matrix(int nranks, bool include_big) {
  std::vector<Case> out;
  const size_t kBig = (1u << 20) + 3;
  const Collective colls[] = {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather,
                              Collective::kBroadcast, Collective::kReduce,        Collective::kAllToAll,
                              Collective::kSendRecv};
  int case_no = 0;
  for (Collective coll : colls) {
    const bool reduces = coll == Collective::kAllReduce || coll == Collective::kReduceScatter || coll == Collective::kReduce;
    for (int d = 0; d < kNumDataTypes; ++d) {
      for (int o = 0; o < (reduces ? kNumRedOps : 1); ++o) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1023}, kBig}) {
          for (bool in_place : {false, true}) {
            if (coll == Collective::kSendRecv && in_place) continue;
            Case c;
            c.coll = coll;
            c.dt = static_cast<DataType>(d);
            c.op = static_cast<RedOp>(o);
            c.count = count;
            c.in_place = in_place;
            c.root = (case_no++) % nranks;
            if (count == kBig) {
              // 1M+3 elements: every collective x dtype with one op and one
              // placement, plus every op for float32 and bf16, keeps the
              // matrix inside CI's time budget.
              if (!include_big) continue;
              bool every_op = c.dt == DataType::kFloat32 || c.dt == DataType::kBfloat16;
              if (!every_op && o != 0) continue;
              if (in_place != ((d + o) % 2 == 1)) continue;
            }
            out.push_back(c);
          }
        }
      }
    }
  }
  return out;
}

}  // namespace loom::testing

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace loom::testing {

std::string where_stuck(pid_t pid) {
  // Every thread's name, state and kernel wait channel, then (where gdb is
  // installed) the user-space stacks. A ptrace-denied gdb prints nothing.
  std::string s;
  const std::string task_dir = "/proc/" + std::to_string(pid) + "/task";
  if (DIR* d = opendir(task_dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string t = task_dir + "/" + e->d_name;
      auto first_line = [](const std::string& path) {
        std::string line;
        if (FILE* f = std::fopen(path.c_str(), "r")) {
          char buf[256];
          if (std::fgets(buf, sizeof buf, f)) line = buf;
          std::fclose(f);
        }
        while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
        return line;
      };
      std::string stat = first_line(t + "/stat");
      size_t rp = stat.rfind(')');
      char state = rp != std::string::npos && rp + 2 < stat.size() ? stat[rp + 2] : '?';
      s += fmt::format("  thread {} '{}' state {} wchan {}\n", e->d_name, first_line(t + "/comm"), state,
                       first_line(t + "/wchan"));
    }
    closedir(d);
  }
  if (std::system("command -v gdb >/dev/null 2>&1") == 0) {
    std::string bt = run_command(fmt::format(
        "timeout 30 gdb -p {} -batch -nx -ex 'set pagination off' -ex 'thread apply all bt 20' 2>/dev/null "
        "| grep -E '^(Thread|#)'", pid));
    // One short line a frame (template arguments make some thousands long).
    std::string lines;
    for (size_t pos = 0; pos < bt.size();) {
      size_t end = bt.find('\n', pos);
      if (end == std::string::npos) end = bt.size();
      std::string line = bt.substr(pos, end - pos);
      if (line.size() > 160) line = line.substr(0, 157) + "...";
      lines += "  " + line + "\n";
      pos = end + 1;
    }
    if (lines.size() > 12000) lines = lines.substr(0, 12000) + "  [... stacks cut at 12000 bytes]\n";
    s += lines.empty() ? "  (gdb printed no stack: attaching not permitted here?)\n" : lines;
  } else {
    s += "  (install gdb for the threads' stacks)\n";
  }
  return s;
}

std::vector<ChildResult> run_processes(int n, const std::function<int(int, int)>& body, int timeout_s,
                                       const std::function<void()>& after_fork) {
  {
    // A child forked while another thread runs can inherit a lock held
    // forever (see the header): refuse, and say where the thread belongs.
    auto count_threads = [] {
      int k = 0;
      if (DIR* d = opendir("/proc/self/task")) {
        while (dirent* e = readdir(d)) k += e->d_name[0] != '.';
        closedir(d);
      }
      return k;
    };
    // Under TSan the first thread a process starts also starts TSan's own
    // background thread, which stays (TSan makes its state safe across fork).
#if defined(__SANITIZE_THREAD__)
    const int allowed = 2;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
    const int allowed = 2;
#else
    const int allowed = 1;
#endif
#else
    const int allowed = 1;
#endif
    // A thread joined a moment ago stays listed until the kernel reaps it
    // (after join returns): give it 100 ms to go.
    int threads = count_threads();
    for (int i = 0; i < 100 && threads > allowed; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      threads = count_threads();
    }
    if (threads > allowed) {
      std::vector<ChildResult> refused(static_cast<size_t>(n));
      for (auto& c : refused) {
        c.status = kRefusedToFork << 8;  // as a child that exited with kRefusedToFork
        c.output = fmt::format("run_processes: not forked, this process has {} threads; start helper threads in "
                               "after_fork (a child can inherit a lock another thread holds)", threads);
      }
      return refused;
    }
  }
  std::vector<pid_t> pids(n);
  std::vector<int> fds(n);
  for (int r = 0; r < n; ++r) {
    int p[2];
    if (pipe(p) != 0) abort();
    pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      int rc = body(r, p[1]);
      close(p[1]);
      _exit(rc);
    }
    close(p[1]);
    pids[r] = pid;
    fds[r] = p[0];
  }
  if (after_fork) after_fork();
  std::vector<ChildResult> out(n);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int open = n;
  while (open > 0) {
    std::vector<pollfd> pf;
    for (int r = 0; r < n; ++r)
      if (fds[r] >= 0) pf.push_back({fds[r], POLLIN, 0});
    poll(pf.data(), pf.size(), 100);
    for (int r = 0; r < n; ++r) {
      if (fds[r] < 0) continue;
      pollfd one{fds[r], POLLIN, 0};
      if (poll(&one, 1, 0) <= 0) continue;
      char buf[4096];
      ssize_t got = read(fds[r], buf, sizeof(buf));
      if (got > 0) out[r].output.append(buf, static_cast<size_t>(got));
      else {
        close(fds[r]);
        fds[r] = -1;
        --open;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      // Say where each child that is still running is stuck before killing
      // it: a CI log then shows the hang, not only that there was one.
      for (int r = 0; r < n; ++r)
        if (fds[r] >= 0) out[r].output += "[test harness: killed after timeout]\n" + where_stuck(pids[r]);
      for (int r = 0; r < n; ++r) kill(pids[r], SIGKILL);
      for (int r = 0; r < n; ++r)
        if (fds[r] >= 0) {
          close(fds[r]);
          fds[r] = -1;
        }
      break;
    }
  }
  for (int r = 0; r < n; ++r) waitpid(pids[r], &out[r].status, 0);
  return out;
}

namespace {

std::vector<pid_t>& root_helpers() {
  static auto* pids = new std::vector<pid_t>();  // never destroyed: the atexit handler uses it
  return *pids;
}

void stop_root_helpers() {
  for (pid_t p : root_helpers()) {
    kill(p, SIGKILL);
    waitpid(p, nullptr, 0);
  }
  root_helpers().clear();
}

}  // namespace

Result<UniqueId> unique_id() {
  static const bool registered = [] { return std::atexit(stop_root_helpers) == 0; }();
  (void)registered;
  stop_root_helpers();  // the previous test's rendezvous is over
  int p[2];
  if (pipe(p) != 0) return system_error("pipe", errno);
  pid_t pid = fork();
  if (pid < 0) {
    close(p[0]);
    close(p[1]);
    return system_error("fork", errno);
  }
  if (pid == 0) {
    close(p[0]);
    auto id = get_unique_id();
    char ok = id.is_ok() ? 1 : 0;
    std::string msg = id.is_ok() ? std::string(id->bytes, sizeof(id->bytes)) : id.status().to_string();
    if (write(p[1], &ok, 1) != 1 || write(p[1], msg.data(), msg.size()) != static_cast<ssize_t>(msg.size())) _exit(1);
    close(p[1]);
    // Serve the rendezvous (a thread of this process) until killed; a
    // parent that dies without killing us is not waited for long.
    for (int i = 0; i < 600 && getppid() != 1; ++i) sleep(1);
    _exit(0);
  }
  close(p[1]);
  root_helpers().push_back(pid);
  std::string got;
  char buf[512];
  for (ssize_t n; (n = read(p[0], buf, sizeof(buf))) > 0;) got.append(buf, static_cast<size_t>(n));
  close(p[0]);
  if (got.empty() || got[0] != 1) return internal_error("root helper: " + (got.empty() ? std::string("no answer") : got.substr(1)));
  UniqueId id;
  if (got.size() != 1 + sizeof(id.bytes)) return internal_error("root helper: short unique id");
  std::memcpy(id.bytes, got.data() + 1, sizeof(id.bytes));
  return id;
}

std::string build_bin(const std::string& name) {
  const char* b = std::getenv("LOOM_BUILD_DIR");
  return std::string(b ? b : ".") + "/bin/" + name;
}

int unused_loopback_port() { return unused_loopback_port(static_cast<unsigned>(getpid())); }

std::pair<int, int> loopback_port_band() {
  int lo = 32768;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int a = 0, b = 0;
    if (std::fscanf(f, "%d %d", &a, &b) == 2 && a > 1024) lo = a;
    std::fclose(f);
  }
  return {lo > 11024 ? lo - 10000 : 1025, lo};  // at least 1025, below the range
}

int unused_loopback_port(unsigned seed) {
  const auto [first, lo] = loopback_port_band();
  const int span = lo - first;
  if (span <= 0) return 0;
  // Start at a pid-derived offset so that tests running at once under
  // ctest -j try different ports first. Unsigned: with an int, pids beyond
  // 271k (pid_max is 4194304 on many hosts) overflowed (undefined), and the
  // negative remainder put the port below `first` (below 1025 where the
  // ephemeral range starts under 11024).
  for (int i = 0; i < span; ++i) {
    const int port = first + static_cast<int>((seed * 7919u + static_cast<unsigned>(i)) % static_cast<unsigned>(span));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    close(fd);
    if (ok) return port;
  }
  return 0;
}

std::string run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

namespace {
// The creator's pid from a segment's header (ShmTransport::Segment: a 64-bit
// magic, then the pid); 0 when it cannot be read yet (being created).
int segment_creator(const std::string& name) {
  int fd = open(("/dev/shm/" + name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  int32_t pid = 0;
  ssize_t got = pread(fd, &pid, sizeof pid, 8);
  close(fd);
  return got == static_cast<ssize_t>(sizeof pid) ? pid : 0;
}
}  // namespace

std::vector<std::string> loom_shm_segments() {
  std::vector<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("loom-", 0) != 0) continue;
      const int pid = segment_creator(name);
      // Unreadable, or its creator runs (EPERM: alive, not ours): not left behind.
      if (pid <= 0 || kill(pid, 0) == 0 || errno == EPERM) continue;
      out.push_back(name);
    }
    closedir(d);
  }
  return out;
}

bool premultiply_avg(std::vector<std::vector<std::byte>>& inputs, size_t count, DataType dt, RedOp op) {
  if (op != RedOp::kAvg || !kernels::avg_premultiplies(dt)) return false;
  std::byte inv[8];
  kernels::reciprocal(dt, static_cast<int>(inputs.size()), inv);
  for (auto& in : inputs) kernels::scale(in.data(), in.data(), count, dt, inv);
  return true;
}

}  // namespace loom::testing
