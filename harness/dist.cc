#include "harness/dist.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace loom::harness {

namespace {

// Every communicator this process created, so a fatal error can abort them
// all and the peers fail fast instead of waiting for their deadline.
std::mutex g_comms_mu;
std::vector<Comm*> g_comms;

void register_comm(Comm* c) {
  std::lock_guard<std::mutex> lock(g_comms_mu);
  g_comms.push_back(c);
}

std::string human_bytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.2fMiB", static_cast<double>(b) / (1 << 20));
  else if (b >= 1024)
    std::snprintf(buf, sizeof buf, "%.1fKiB", static_cast<double>(b) / 1024);
  else
    std::snprintf(buf, sizeof buf, "%lluB", static_cast<unsigned long long>(b));
  return buf;
}

template <typename T>
T check(Result<T> r, const char* what) {
  if (!r.is_ok()) Group::fail(what, r.status());
  return std::move(r).value();
}

}  // namespace

void CommStats::add(const std::string& kind, uint64_t bytes, double seconds) {
  CollStats& s = by_kind_[kind];
  s.calls += 1;
  s.bytes += bytes;
  s.seconds += seconds;
}

double CommStats::total_seconds() const {
  double t = 0;
  for (const auto& [k, s] : by_kind_) t += s.seconds;
  return t;
}

std::string CommStats::summary() const {
  std::string out;
  for (const auto& [k, s] : by_kind_) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s%s %llux %s %.1fms", out.empty() ? "" : ", ", k.c_str(),
                  static_cast<unsigned long long>(s.calls), human_bytes(s.bytes).c_str(), s.seconds * 1e3);
    out += buf;
  }
  return out;
}

Group::Group(std::unique_ptr<Comm> comm, CommStats* stats) : comm_(std::move(comm)), stats_(stats) {
  if (comm_) register_comm(comm_.get());
}

void Group::fail(const std::string& what, const Status& st) {
  std::fprintf(stderr, "loom-harness: %s failed: %s\n", what.c_str(), st.to_string().c_str());
  std::fflush(stderr);
  {
    std::lock_guard<std::mutex> lock(g_comms_mu);
    for (Comm* c : g_comms) c->abort("loom-harness: " + what + " failed on this rank");
  }
  std::fflush(stdout);
  // No destructors: a failed communicator may not be able to drain.
  std::_Exit(1);
}

void Group::wait(const Work& w, const char* kind, uint64_t bytes) {
  const double t0 = now_s();
  const Status st = w.wait();
  if (!st.is_ok()) fail(kind, st);
  stats_->add(kind, bytes, now_s() - t0);
}

void Group::allreduce_sum(float* p, size_t n) {
  if (size() == 1 || n == 0) return;
  const double t0 = now_s();
  Work w = check(comm_->allreduce(p, p, n, DataType::kFloat32, RedOp::kSum), "allreduce");
  const Status st = w.wait();
  if (!st.is_ok()) fail("allreduce", st);
  stats_->add("allreduce", n * sizeof(float), now_s() - t0);
}

void Group::allreduce_sum(double* p, size_t n) {
  if (size() == 1 || n == 0) return;
  const double t0 = now_s();
  Work w = check(comm_->allreduce(p, p, n, DataType::kFloat64, RedOp::kSum), "allreduce");
  const Status st = w.wait();
  if (!st.is_ok()) fail("allreduce", st);
  stats_->add("allreduce", n * sizeof(double), now_s() - t0);
}

Work Group::allreduce_sum_async(float* p, size_t n) {
  // Counted when waited on (wait()): with overlap, only the blocked time is a cost.
  return check(comm_->allreduce(p, p, n, DataType::kFloat32, RedOp::kSum), "allreduce");
}

void Group::reduce_scatter_sum(const float* send, float* recv, size_t n) {
  if (size() == 1) {
    std::copy(send, send + n, recv);
    return;
  }
  const double t0 = now_s();
  Work w = check(comm_->reduce_scatter(send, recv, n, DataType::kFloat32, RedOp::kSum), "reduce_scatter");
  const Status st = w.wait();
  if (!st.is_ok()) fail("reduce_scatter", st);
  stats_->add("reduce_scatter", n * size() * sizeof(float), now_s() - t0);
}

void Group::all_gather_inplace(float* p, size_t n) {
  if (size() == 1) return;
  const double t0 = now_s();
  Work w = check(comm_->all_gather(p + static_cast<size_t>(rank()) * n, p, n, DataType::kFloat32), "all_gather");
  const Status st = w.wait();
  if (!st.is_ok()) fail("all_gather", st);
  stats_->add("all_gather", n * sizeof(float), now_s() - t0);
}

void Group::reduce_sum_to_root(const float* send, float* recv, size_t n) {
  if (size() == 1) {
    std::copy(send, send + n, recv);
    return;
  }
  const double t0 = now_s();
  Work w = check(comm_->reduce(send, recv, n, DataType::kFloat32, RedOp::kSum, 0), "reduce");
  const Status st = w.wait();
  if (!st.is_ok()) fail("reduce", st);
  stats_->add("reduce", n * sizeof(float), now_s() - t0);
}

void Group::broadcast(int* p, size_t n, int root) {
  if (size() == 1) return;
  const double t0 = now_s();
  Work w = check(comm_->broadcast(p, p, n, DataType::kInt32, root), "broadcast");
  const Status st = w.wait();
  if (!st.is_ok()) fail("broadcast", st);
  stats_->add("broadcast", n * sizeof(int), now_s() - t0);
}

void Group::exchange(const std::vector<P2p>& ops) {
  if (ops.empty()) return;
  const double t0 = now_s();
  uint64_t bytes = 0;
  comm_->group_start();
  for (const P2p& op : ops) {
    Result<Work> r = op.send ? comm_->send(op.buf, op.count, DataType::kFloat32, op.peer)
                             : comm_->recv(op.buf, op.count, DataType::kFloat32, op.peer);
    if (!r.is_ok()) fail(op.send ? "send" : "recv", r.status());
    bytes += op.count * sizeof(float);
  }
  Work w = check(comm_->group_end(), "group_end");
  const Status st = w.wait();
  if (!st.is_ok()) fail("send/recv", st);
  stats_->add("sendrecv", bytes, now_s() - t0);
}

Result<Grid> make_grid(int tp, int pp, int dp, CommStats* stats, double timeout_s) {
  Grid g;
  g.tp = tp;
  g.pp = pp;
  g.dp = dp;
  const int want = tp * pp * dp;
  const bool launched = std::getenv("LOOM_WORLD_SIZE") || std::getenv("WORLD_SIZE") ||
                        std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("SLURM_NTASKS");
  if (want == 1 && !launched) {
    g.world = std::make_unique<Group>(nullptr, stats);
    g.tp_group = std::make_unique<Group>(nullptr, stats);
    g.pp_group = std::make_unique<Group>(nullptr, stats);
    g.dp_group = std::make_unique<Group>(nullptr, stats);
    return g;
  }
  Config cfg;
  cfg.timeout_s = timeout_s;
  cfg.name = "world";
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Comm> world, Comm::init_from_env(cfg));
  g.world_rank = world->rank();
  g.world_size = world->size();
  if (g.world_size != want)
    return invalid_argument("--tp " + std::to_string(tp) + " x --pp " + std::to_string(pp) + " x --dp " +
                            std::to_string(dp) + " = " + std::to_string(want) + " ranks, but the job has " +
                            std::to_string(g.world_size));
  g.tp_rank = g.world_rank % tp;
  g.pp_rank = (g.world_rank / tp) % pp;
  g.dp_rank = g.world_rank / (tp * pp);
  // Split order is the same on every rank (split is collective).
  LOOM_ASSIGN_OR_RETURN(auto tpc, world->split(g.dp_rank * pp + g.pp_rank, g.tp_rank));
  LOOM_ASSIGN_OR_RETURN(auto ppc, world->split(g.dp_rank * tp + g.tp_rank, g.pp_rank));
  LOOM_ASSIGN_OR_RETURN(auto dpc, world->split(g.pp_rank * tp + g.tp_rank, g.dp_rank));
  g.world = std::make_unique<Group>(std::move(world), stats);
  g.tp_group = std::make_unique<Group>(std::move(tpc), stats);
  g.pp_group = std::make_unique<Group>(std::move(ppc), stats);
  g.dp_group = std::make_unique<Group>(std::move(dpc), stats);
  return g;
}

}  // namespace loom::harness
