#include "perf_colls.h"

#include <cstring>

#include "verifiable.h"

namespace loom::perf {

size_t block_count(size_t total, size_t es, int n) {
  const size_t per = total / static_cast<size_t>(n);
  return es <= 16 ? per & ~(16 / es - 1) : per;
}

Shape shape_for(Bench b, size_t bytes, size_t es, int n) {
  const size_t total = bytes / es;
  // The per-rank block of the collectives whose size is n blocks, as current
  // nccl-tests cuts it (all_gather.cu, reduce_scatter.cu, alltoall.cu,
  // hypercube.cu: (count/nranks) & -(16/eltSize)): a multiple of 16 bytes,
  // so its rows have nccl-tests' sizes (a 1 MiB float all_gather on 3 ranks
  // is 1048560 B; 8 B on 2 ranks is 0).
  const size_t per = block_count(total, es, n);
  const double nd = n;
  Shape s;
  switch (b) {
    case Bench::kAllReduce:
      s = {total, total, total, total * es, 0, 2.0 * (nd - 1) / nd};
      break;
    case Bench::kReduceScatter:
      s = {per * n, per, per, per * n * es, 0, (nd - 1) / nd};
      break;
    case Bench::kAllGather:
      s = {per, per * n, per, per * n * es, 0, (nd - 1) / nd};
      break;
    case Bench::kAllToAll:
      s = {per * n, per * n, per, per * n * es, 0, (nd - 1) / nd};
      break;
    case Bench::kBroadcast:
    case Bench::kReduce:
    case Bench::kSendRecv:
      s = {total, total, total, total * es, 0, 1.0};
      break;
    case Bench::kHypercube:
      // nccl-tests: algbw counts the (n-1) blocks each rank receives.
      s = {per, per * n, per, per * n * es, 0, 1.0};
      s.algbw_bytes = static_cast<double>(per * es) * (nd - 1);
      return s;
  }
  s.algbw_bytes = static_cast<double>(s.size_bytes);
  return s;
}

void freshen_input(const Buffers& buf, const Shape& s, size_t elem_size, int iter) {
  if (buf.send && s.send_count) std::memset(buf.send, 0x30 + (iter & 7), s.send_count * elem_size);
}

Buffers buffers_for(Bench b, std::byte* send, std::byte* recv, const Shape& s, size_t es, int r, bool in_place) {
  if (!in_place) return {send, recv};
  const size_t block = s.count * es * static_cast<size_t>(r);
  if (b == Bench::kReduceScatter) return {recv, recv + block};
  if (b == Bench::kAllGather || b == Bench::kHypercube) return {recv + block, recv};
  return {recv, recv};
}

namespace {

Result<Work> issue_hypercube(Comm& comm, const Buffers& buf, const Shape& s, const Options& o, IssueState* st) {
  const int n = comm.size(), r = comm.rank();
  const size_t block = s.count * dtype_size(o.dt);
  std::byte* mine = buf.recv + block * static_cast<size_t>(r);
  if (buf.send != mine) {
    // The previous iteration may still be sending this block.
    if (st->last.valid()) {
      Status w = st->last.wait();
      if (!w.is_ok()) return w;
    }
    std::memcpy(mine, buf.send, block);
  }
  Work last;
  for (int mask = 1; mask < n; mask <<= 1) {
    const size_t have = static_cast<size_t>(r & ~(mask - 1));  // first block this rank holds
    const size_t want = have ^ static_cast<size_t>(mask);
    const int peer = r ^ mask;
    comm.group_start();
    auto sw = comm.send(buf.recv + have * block, s.count * mask, o.dt, peer);
    auto rw = comm.recv(buf.recv + want * block, s.count * mask, o.dt, peer);
    auto gw = comm.group_end();
    if (!sw.is_ok()) return sw.status();
    if (!rw.is_ok()) return rw.status();
    if (!gw.is_ok()) return gw.status();
    last = *gw;
  }
  st->last = last;
  return last;
}

}  // namespace

Result<Work> issue(Comm& comm, Bench b, const Buffers& buf, const Shape& s, const Options& o, IssueState* st) {
  const int n = comm.size(), r = comm.rank();
  switch (b) {
    case Bench::kAllReduce: return comm.allreduce(buf.send, buf.recv, s.count, o.dt, o.op);
    case Bench::kReduceScatter: return comm.reduce_scatter(buf.send, buf.recv, s.count, o.dt, o.op);
    case Bench::kAllGather: return comm.all_gather(buf.send, buf.recv, s.count, o.dt);
    case Bench::kBroadcast: return comm.broadcast(buf.send, buf.recv, s.count, o.dt, o.root);
    case Bench::kReduce: return comm.reduce(buf.send, buf.recv, s.count, o.dt, o.op, o.root);
    case Bench::kAllToAll: return comm.all_to_all(buf.send, buf.recv, s.count, o.dt);
    case Bench::kSendRecv: {
      comm.group_start();
      Result<Work> sw = Work(), rw = Work();
      if (!o.oneway) {
        sw = comm.send(buf.send, s.count, o.dt, (r + 1) % n);
        rw = comm.recv(buf.recv, s.count, o.dt, (r - 1 + n) % n);
      } else if (r % 2 == 0 && r + 1 < n) {
        sw = comm.send(buf.send, s.count, o.dt, r + 1);
      } else if (r % 2 == 1) {
        rw = comm.recv(buf.recv, s.count, o.dt, r - 1);
      }  // --oneway with an odd rank count: the last rank idles
      auto gw = comm.group_end();
      if (!sw.is_ok()) return sw.status();
      if (!rw.is_ok()) return rw.status();
      return gw;
    }
    case Bench::kHypercube: return issue_hypercube(comm, buf, s, o, st);
  }
  return invalid_argument("unknown benchmark");
}

void fill_inputs(Bench b, const Buffers& buf, const Shape& s, const Options& o, int rank, int nranks) {
  const RedOp fop = bench_reduces(b) ? o.op : RedOp::kSum;
  if (b == Bench::kBroadcast && rank != o.root) return;  // only the root's input is read
  verifiable::fill(buf.send, s.send_count, o.dt, fop, rank, nranks);
}

size_t count_wrong(Bench b, const Buffers& buf, const Shape& s, const Options& o, int r, int n, std::string* first) {
  const size_t es = dtype_size(o.dt);
  const RedOp fop = bench_reduces(b) ? o.op : RedOp::kSum;
  const std::byte* rp = buf.recv;
  switch (b) {
    case Bench::kAllReduce: return verifiable::count_wrong_reduced(rp, s.count, o.dt, o.op, n, 0, first);
    case Bench::kReduceScatter: return verifiable::count_wrong_reduced(rp, s.count, o.dt, o.op, n, r * s.count, first);
    case Bench::kReduce:
      return r == o.root ? verifiable::count_wrong_reduced(rp, s.count, o.dt, o.op, n, 0, first) : 0;
    case Bench::kBroadcast: return verifiable::count_wrong_copied(rp, s.count, o.dt, fop, o.root, 0, first);
    case Bench::kAllGather:
    case Bench::kHypercube: {
      size_t w = 0;
      for (int k = 0; k < n; ++k) w += verifiable::count_wrong_copied(rp + k * s.count * es, s.count, o.dt, fop, k, 0, first);
      return w;
    }
    case Bench::kAllToAll: {
      size_t w = 0;
      for (int k = 0; k < n; ++k)
        w += verifiable::count_wrong_copied(rp + k * s.count * es, s.count, o.dt, fop, k, r * s.count, first);
      return w;
    }
    case Bench::kSendRecv:
      if (o.oneway && r % 2 == 0) return 0;  // senders only
      return verifiable::count_wrong_copied(rp, s.count, o.dt, fop, (r - 1 + n) % n, 0, first);
  }
  return 0;
}

}  // namespace loom::perf
