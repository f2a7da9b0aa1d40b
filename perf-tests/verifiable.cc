// Closed-form ("verifiable") data for tests and benchmarks: every input is a
// function of (rank, index, dtype, op) and every expected output is computed
// without a reference rank, like nccl-tests' verifiable/.
#include "verifiable.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "kernels/host_reduce.h"

namespace loom::verifiable {
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

}  // namespace loom::verifiable
