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

namespace {

// The average of a floating type: NCCL pre-multiplies each input by T(1/n)
// and sums for fp16 / bf16 / fp8 (kernels::avg_premultiplies); float and
// double are summed and divided once. Inputs are n * m (m small) so that the
// pre-multiplied input is exactly m and every partial sum is exact in any
// order; where the type cannot hold that (fp8 with some n), one rank per
// element contributes T(n) and the others 0, so no partial sum rounds.
double premultiplied(DataType dt, double x, int nranks) {
  uint64_t in = 0, c = 0, out = 0;
  kernels::store_element(&in, 0, dt, x);
  kernels::reciprocal(dt, nranks, &c);
  kernels::scale(&out, &in, 1, dt, &c);
  return kernels::load_element(&out, 0, dt);
}
bool avg_multiples_exact(DataType dt, int nranks) {
  if (!kernels::avg_premultiplies(dt)) return true;
  for (int m = 1; m <= (is_fp8(dt) ? 1 : 2); ++m) {
    const double x = static_cast<double>(nranks) * m;
    if (round_to(dt, x) != x || premultiplied(dt, x, nranks) != m) return false;
  }
  return true;
}

}  // namespace

double input_value(int rank, size_t index, DataType dt, RedOp op, int nranks) {
  const size_t r = static_cast<size_t>(rank);
  switch (op) {
    case RedOp::kAvg:
      if (is_floating(dt)) {
        const double n = static_cast<double>(nranks);
        if (!avg_multiples_exact(dt, nranks))
          return r == index % static_cast<size_t>(nranks) ? round_to(dt, n) : 0;
        if (is_fp8(dt)) return ((r + index) % 3 == 0) ? n : 0;  // partial sums <= 8
        return n * (static_cast<double>((r * 7 + index * 3) % 5) - 2);
      }
      [[fallthrough]];
    case RedOp::kSum:
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
  if (op == RedOp::kAvg && kernels::avg_premultiplies(dt)) {
    double acc = 0;  // exact: the inputs make every partial sum exact
    for (int r = 0; r < nranks; ++r) acc += premultiplied(dt, input_value(r, index, dt, op, nranks), nranks);
    return round_to(dt, acc);
  }
  double acc = input_value(0, index, dt, op, nranks);
  for (int r = 1; r < nranks; ++r) {
    double v = input_value(r, index, dt, op, nranks);
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
    } else {
      acc = acc / nranks;  // float and double: one division at the end (exact here)
    }
  }
  return round_to(dt, acc);
}

void fill(void* buf, size_t count, DataType dt, RedOp op, int rank, int nranks, size_t index_offset) {
  for (size_t i = 0; i < count; ++i)
    kernels::store_element(buf, i, dt, input_value(rank, index_offset + i, dt, op, nranks));
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
    double want = round_to(dt, input_value(rank, index_offset + i, dt, op, 0));  // op: never avg
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
