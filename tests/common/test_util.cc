#include "common/test_util.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "kernels/host_reduce.h"

namespace loom::testing {
namespace {

bool is_signed_int(DataType dt) {
  return dt == DataType::kInt8 || dt == DataType::kInt32 || dt == DataType::kInt64;
}
bool is_fp8(DataType dt) { return dt == DataType::kFp8E4M3 || dt == DataType::kFp8E5M2; }
bool is_int(DataType dt) { return !is_floating(dt); }

// Rounds a value the way storing it into dt would.
double round_to(DataType dt, double v) {
  uint64_t tmp = 0;
  kernels::store_element(&tmp, 0, dt, v);
  return kernels::load_element(&tmp, 0, dt);
}

}  // namespace

double input_value(int rank, size_t index, DataType dt, RedOp op) {
  const size_t r = static_cast<size_t>(rank);
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg:
      if (is_fp8(dt)) return ((r + index) % 3 == 0) ? 1 : 0;  // partial sums <= 8: exact in e5m2
      return static_cast<double>((r * 7 + index * 3) % 5) - (is_signed_int(dt) || is_floating(dt) ? 2 : 0);
    case RedOp::kProd:
      return ((r + index) % 4 == 0) ? 2 : 1;  // products are powers of two <= 2^6
    case RedOp::kMax:
    case RedOp::kMin: {
      size_t m = is_fp8(dt) ? 7 : 11;
      double v = static_cast<double>((r * 13 + index * 7) % m);
      return (is_signed_int(dt) || is_floating(dt)) ? v - static_cast<double>(m / 2) : v;
    }
  }
  return 0;
}

double expected_value(size_t index, DataType dt, RedOp op, int nranks) {
  double acc = input_value(0, index, dt, op);
  for (int r = 1; r < nranks; ++r) {
    double v = input_value(r, index, dt, op);
    switch (op) {
      case RedOp::kSum:
      case RedOp::kAvg: acc += v; break;
      case RedOp::kProd: acc *= v; break;
      case RedOp::kMax: acc = std::max(acc, v); break;
      case RedOp::kMin: acc = std::min(acc, v); break;
    }
  }
  if (op == RedOp::kAvg) {
    if (is_int(dt)) {
      // Integer avg truncates toward zero, like C++ division.
      acc = static_cast<double>(static_cast<int64_t>(acc) / nranks);
    } else if (dt == DataType::kFloat64) {
      acc = acc / nranks;
    } else {
      // Loom divides in float then rounds once to the type.
      float q = static_cast<float>(acc) / static_cast<float>(nranks);
      acc = static_cast<double>(q);
    }
  }
  return round_to(dt, acc);
}

void fill(void* buf, size_t count, DataType dt, RedOp op, int rank, size_t index_offset) {
  for (size_t i = 0; i < count; ++i) kernels::store_element(buf, i, dt, input_value(rank, index_offset + i, dt, op));
}

size_t count_wrong_reduced(const void* buf, size_t count, DataType dt, RedOp op, int nranks, size_t index_offset,
                           std::string* first) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    double want = expected_value(index_offset + i, dt, op, nranks);
    double got = kernels::load_element(buf, i, dt);
    if (got != want) {
      if (wrong == 0 && first)
        *first = fmt::format("element {} (global index {}): got {} want {}", i, index_offset + i, got, want);
      ++wrong;
    }
  }
  return wrong;
}

size_t count_wrong_copied(const void* buf, size_t count, DataType dt, RedOp op, int rank, size_t index_offset,
                          std::string* first) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    double want = round_to(dt, input_value(rank, index_offset + i, dt, op));
    double got = kernels::load_element(buf, i, dt);
    if (got != want) {
      if (wrong == 0 && first)
        *first = fmt::format("element {} (from rank {}, index {}): got {} want {}", i, rank, index_offset + i, got, want);
      ++wrong;
    }
  }
  return wrong;
}

std::string Case::name() const {
  return fmt::format("{} {} {} count={} {}{}", collective_name(coll), dtype_name(dt), redop_name(op), count,
                     in_place ? "in-place" : "out-of-place",
                     (coll == Collective::kBroadcast || coll == Collective::kReduce) ? fmt::format(" root={}", root) : "");
}

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
  std::vector<std::byte> sendv(send_count * es + kGuard, std::byte{0x5a}), recvv(big * es + kGuard, std::byte{0xa5});
  std::byte* sendp = sendv.data();
  std::byte* recvp = recvv.data();
  const bool reduces = c.coll == Collective::kAllReduce || c.coll == Collective::kReduceScatter || c.coll == Collective::kReduce;
  const RedOp fill_op = reduces ? c.op : RedOp::kSum;
  if (c.in_place) {
    switch (c.coll) {
      case Collective::kReduceScatter:
        fill(recvp, send_count, c.dt, fill_op, r);
        sendp = recvp;
        recvp = recvp + r * c.count * es;
        break;
      case Collective::kAllGather:
        fill(recvp + r * c.count * es, c.count, c.dt, fill_op, r);
        sendp = recvp + r * c.count * es;
        break;
      case Collective::kAllToAll:
        fill(recvp, send_count, c.dt, fill_op, r);
        sendp = recvp;
        break;
      default:
        fill(recvp, send_count, c.dt, fill_op, r);
        sendp = recvp;
        break;
    }
  } else {
    fill(sendp, send_count, c.dt, fill_op, r);
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
