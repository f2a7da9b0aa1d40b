// Host reductions (src/kernels/host_reduce.h) against a scalar reference
// written here: every dtype x op x count x aliasing mode, through the dispatched
// entry point, the scalar path and the AVX2 path; bit-identical AVX2 vs scalar;
// divide(); the generic element accessors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/host_reduce.h"
#include "unit/float_reference.h"

namespace loom::kernels {
namespace {

constexpr DataType kAllTypes[] = {
    DataType::kInt8,    DataType::kUint8,   DataType::kInt32,    DataType::kUint32,
    DataType::kInt64,   DataType::kUint64,  DataType::kFloat16,  DataType::kFloat32,
    DataType::kFloat64, DataType::kBfloat16, DataType::kFp8E4M3, DataType::kFp8E5M2,
};
constexpr RedOp kAllOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg};
constexpr size_t kCounts[] = {0, 1, 7, 31, 33, 1000, 4099};

bool is_signed_int(DataType dt) {
  return dt == DataType::kInt8 || dt == DataType::kInt32 || dt == DataType::kInt64;
}
bool is_int(DataType dt) { return !is_floating(dt); }

// ---------------- the reference ----------------

// Elements are handled as raw little-endian bits in a uint64_t.
uint64_t load_bits(const void* base, size_t i, size_t size) {
  uint64_t v = 0;
  std::memcpy(&v, static_cast<const char*>(base) + i * size, size);
  return v;
}
void store_bits(void* base, size_t i, size_t size, uint64_t v) {
  std::memcpy(static_cast<char*>(base) + i * size, &v, size);
}

float ref_decode_narrow(DataType dt, uint64_t bits) {
  switch (dt) {
    case DataType::kFloat16: return testref::f16_ref_decode(static_cast<uint16_t>(bits));
    case DataType::kBfloat16: return testref::bf16_ref_to_float(static_cast<uint16_t>(bits));
    case DataType::kFp8E4M3: return testref::fp8_ref_to_float(testref::kE4M3, static_cast<uint8_t>(bits));
    case DataType::kFp8E5M2: return testref::fp8_ref_to_float(testref::kE5M2, static_cast<uint8_t>(bits));
    default: ADD_FAILURE(); return 0;
  }
}
uint64_t ref_encode_narrow(DataType dt, float f) {
  switch (dt) {
    case DataType::kFloat16: return testref::f16_ref_encode(f);
    case DataType::kBfloat16: return testref::bf16_ref_from_float(f);
    case DataType::kFp8E4M3: return testref::fp8_ref_from_float(testref::kE4M3, f);
    case DataType::kFp8E5M2: return testref::fp8_ref_from_float(testref::kE5M2, f);
    default: ADD_FAILURE(); return 0;
  }
}

bool ref_is_nan(DataType dt, uint64_t bits) {
  switch (dt) {
    case DataType::kFloat32: return std::isnan(std::bit_cast<float>(static_cast<uint32_t>(bits)));
    case DataType::kFloat64: return std::isnan(std::bit_cast<double>(bits));
    case DataType::kFloat16: return testref::small_is_nan(testref::kFp16, static_cast<uint32_t>(bits));
    case DataType::kBfloat16: return testref::small_is_nan(testref::kBf16, static_cast<uint32_t>(bits));
    case DataType::kFp8E4M3: return testref::small_is_nan(testref::kE4M3, static_cast<uint32_t>(bits));
    case DataType::kFp8E5M2: return testref::small_is_nan(testref::kE5M2, static_cast<uint32_t>(bits));
    default: return false;
  }
}

// The documented floating contract: NaN propagates (a's first), otherwise the
// ordinary comparison, and b on equality (+0 vs -0).
template <class F>
F ref_float_op(RedOp op, F a, F b) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg: return a + b;
    case RedOp::kProd: return a * b;
    case RedOp::kMax:
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
      return a > b ? a : b;
    case RedOp::kMin:
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
      return a < b ? a : b;
  }
  return a;
}

uint64_t ref_reduce(DataType dt, RedOp op, uint64_t a, uint64_t b) {
  const size_t size = dtype_size(dt);
  if (is_int(dt)) {
    const uint64_t mask = size == 8 ? ~0ull : (1ull << (8 * size)) - 1;
    const int shift = 64 - 8 * static_cast<int>(size);
    // Sign-extend for signed comparisons.
    const int64_t sa = static_cast<int64_t>(a << shift) >> shift;
    const int64_t sb = static_cast<int64_t>(b << shift) >> shift;
    const bool s = is_signed_int(dt);
    switch (op) {
      case RedOp::kSum:
      case RedOp::kAvg: return (a + b) & mask;
      case RedOp::kProd: return (a * b) & mask;
      case RedOp::kMax: return (s ? sa > sb : a > b) ? a : b;
      case RedOp::kMin: return (s ? sa < sb : a < b) ? a : b;
    }
    return 0;
  }
  if (dt == DataType::kFloat32) {
    const float r = ref_float_op(op, std::bit_cast<float>(static_cast<uint32_t>(a)),
                                 std::bit_cast<float>(static_cast<uint32_t>(b)));
    return std::bit_cast<uint32_t>(r);
  }
  if (dt == DataType::kFloat64) {
    return std::bit_cast<uint64_t>(ref_float_op(op, std::bit_cast<double>(a), std::bit_cast<double>(b)));
  }
  return ref_encode_narrow(dt, ref_float_op(op, ref_decode_narrow(dt, a), ref_decode_narrow(dt, b)));
}

// ---------------- test data ----------------

uint64_t random_element(DataType dt, std::mt19937_64& rng) {
  const size_t size = dtype_size(dt);
  const uint64_t raw = rng();
  if (dt == DataType::kFloat32 || dt == DataType::kFloat64) {
    // Mostly ordinary numbers (so sums and products are meaningful), some
    // specials and some arbitrary bit patterns.
    const unsigned pick = static_cast<unsigned>(raw % 100);
    double v;
    if (pick < 70) {
      v = std::ldexp(static_cast<double>(static_cast<int64_t>(rng() >> 11)) / 9007199254740992.0 - 0.5,
                     static_cast<int>(rng() % 40) - 20);
    } else if (pick < 85) {
      return dt == DataType::kFloat32 ? (rng() & 0xffffffffull) : rng();
    } else {
      const double specials[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, -NAN, 1.0, -1.0,
                                 1e-40, -1e-310, 3e38, -3e38, 1e300};
      v = specials[rng() % (sizeof(specials) / sizeof(specials[0]))];
    }
    if (dt == DataType::kFloat32) return std::bit_cast<uint32_t>(static_cast<float>(v));
    return std::bit_cast<uint64_t>(v);
  }
  return size == 8 ? raw : raw & ((1ull << (8 * size)) - 1);
}

enum class Path { kDispatch, kScalar, kAvx2 };
const char* path_name(Path p) {
  return p == Path::kDispatch ? "dispatch" : p == Path::kScalar ? "scalar" : "avx2";
}

// Returns false when the path has no kernel for (dt, op).
bool run_reduce(Path path, void* d, const void* a, const void* b, size_t n, DataType dt, RedOp op) {
  switch (path) {
    case Path::kDispatch: reduce2(d, a, b, n, dt, op); return true;
    case Path::kScalar: detail::reduce2_scalar(d, a, b, n, dt, op); return true;
    case Path::kAvx2: return detail::reduce2_avx2(d, a, b, n, dt, op);
  }
  return false;
}

std::vector<Path> usable_paths() {
  std::vector<Path> p = {Path::kDispatch, Path::kScalar};
  if (detail::avx2_usable()) p.push_back(Path::kAvx2);
  return p;
}

enum class Alias { kDistinct, kDstIsA, kDstIsB, kByteMisaligned };
const char* alias_name(Alias a) {
  switch (a) {
    case Alias::kDistinct: return "distinct";
    case Alias::kDstIsA: return "dst==a";
    case Alias::kDstIsB: return "dst==b";
    case Alias::kByteMisaligned: return "distinct,byte-misaligned";
  }
  return "?";
}

constexpr size_t kPad = 64;  // guard bytes around every buffer
constexpr uint8_t kGuard = 0xa5;

// Checks that only dst's [0, n*size) bytes of the buffer changed.
void expect_guards(const std::vector<uint8_t>& before, const std::vector<uint8_t>& after, size_t begin,
                   size_t end) {
  for (size_t i = 0; i < before.size(); ++i) {
    if (i >= begin && i < end) continue;
    ASSERT_EQ(before[i], after[i]) << "byte " << i << " outside dst [" << begin << "," << end << ") changed";
  }
}

void check_reduce_case(DataType dt, RedOp op, size_t count, Alias alias, Path path, uint64_t seed) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + " " + redop_name(op) + " count=" + std::to_string(count) + " " +
               alias_name(alias) + " path=" + path_name(path));
  const size_t size = dtype_size(dt);
  const size_t bytes = count * size;
  std::vector<uint8_t> ma(bytes + 3 * kPad, kGuard), mb(bytes + 3 * kPad, kGuard), md(bytes + 3 * kPad, kGuard);
  // Element offsets that differ between the three buffers, so vector loads and
  // stores are misaligned relative to each other; or odd byte offsets.
  size_t oa = kPad + size, ob = kPad + 3 * size, od = kPad + 2 * size;
  if (alias == Alias::kByteMisaligned) oa = kPad + 1, ob = kPad + 2, od = kPad + 3;
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> va(count), vb(count);
  for (size_t i = 0; i < count; ++i) {
    va[i] = random_element(dt, rng);
    vb[i] = random_element(dt, rng);
    store_bits(ma.data() + oa, i, size, va[i]);
    store_bits(mb.data() + ob, i, size, vb[i]);
  }
  std::vector<uint8_t>* dbuf = &md;
  size_t doff = od;
  if (alias == Alias::kDstIsA) dbuf = &ma, doff = oa;
  if (alias == Alias::kDstIsB) dbuf = &mb, doff = ob;
  const std::vector<uint8_t> before = *dbuf;

  if (!run_reduce(path, dbuf->data() + doff, ma.data() + oa, mb.data() + ob, count, dt, op)) {
    // The AVX2 path may decline only the fp8 types (no conversion instructions).
    EXPECT_TRUE(dt == DataType::kFp8E4M3 || dt == DataType::kFp8E5M2) << "AVX2 path declined";
    return;
  }
  ASSERT_NO_FATAL_FAILURE(expect_guards(before, *dbuf, doff, doff + bytes));
  int failures = 0;
  for (size_t i = 0; i < count && failures < 5; ++i) {
    const uint64_t want = ref_reduce(dt, op, va[i], vb[i]);
    const uint64_t got = load_bits(dbuf->data() + doff, i, size);
    const bool ok = ref_is_nan(dt, want) ? ref_is_nan(dt, got) : got == want;
    if (!ok) {
      ++failures;
      ADD_FAILURE() << "element " << i << ": a=0x" << std::hex << va[i] << " b=0x" << vb[i] << " want 0x" << want
                    << " got 0x" << got;
    }
  }
}

class ReduceTest : public ::testing::TestWithParam<std::tuple<DataType, RedOp>> {};

TEST_P(ReduceTest, MatchesReferenceForAllCountsAliasingAndPaths) {
  const auto [dt, op] = GetParam();
  uint64_t seed = 1;
  for (Path path : usable_paths()) {
    for (size_t count : kCounts) {
      for (Alias alias : {Alias::kDistinct, Alias::kDstIsA, Alias::kDstIsB, Alias::kByteMisaligned}) {
        check_reduce_case(dt, op, count, alias, path, seed++);
      }
    }
  }
}

// Scalar and AVX2 paths must agree bit for bit (NaN payloads included) so that
// results do not depend on which machine reduced which chunk.
TEST_P(ReduceTest, Avx2AndScalarGiveIdenticalBits) {
  if (!detail::avx2_usable()) GTEST_SKIP() << "CPU or build without AVX2";
  const auto [dt, op] = GetParam();
  const size_t size = dtype_size(dt);
  const size_t count = 100'003;
  std::mt19937_64 rng(77 + static_cast<int>(dt) * 10 + static_cast<int>(op));
  std::vector<uint8_t> a(count * size), b(count * size), d_scalar(count * size), d_avx2(count * size);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t x = random_element(dt, rng);
    const uint64_t y = random_element(dt, rng);
    // Both NaN included: sum and prod take a's on both paths. Regression:
    // which payload won followed the compiler's operand order and differed
    // between the paths (fp16: 4.2 M of 2^32 pairs).
    store_bits(a.data(), i, size, x);
    store_bits(b.data(), i, size, y);
  }
  detail::reduce2_scalar(d_scalar.data(), a.data(), b.data(), count, dt, op);
  if (!detail::reduce2_avx2(d_avx2.data(), a.data(), b.data(), count, dt, op)) {
    EXPECT_TRUE(dt == DataType::kFp8E4M3 || dt == DataType::kFp8E5M2);
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(load_bits(d_scalar.data(), i, size), load_bits(d_avx2.data(), i, size)) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndOps, ReduceTest,
                         ::testing::Combine(::testing::ValuesIn(kAllTypes), ::testing::ValuesIn(kAllOps)),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_" +
                                  redop_name(std::get<1>(info.param));
                         });

TEST(Reduce, ZeroCountTouchesNothing) {
  for (DataType dt : kAllTypes) {
    for (RedOp op : kAllOps) {
      reduce2(nullptr, nullptr, nullptr, 0, dt, op);
      detail::reduce2_scalar(nullptr, nullptr, nullptr, 0, dt, op);
      if (detail::avx2_usable()) detail::reduce2_avx2(nullptr, nullptr, nullptr, 0, dt, op);
    }
    divide(nullptr, nullptr, 0, dt, 3);
  }
}

TEST(Reduce, IsaNameMatchesCpu) {
  const std::string isa = reduce_isa();
  EXPECT_EQ(isa, detail::avx2_usable() ? "avx2" : "scalar");
#if defined(LOOM_TEST_HAVE_X86)
  // A CPU with AVX2 + F16C + FMA must get the AVX2 path when the build has it
  // (Linux always enables the YMM state on such CPUs).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool leaf1 = __get_cpuid(1, &eax, &ebx, &ecx, &edx);
  const bool f16c_fma = leaf1 && (ecx & (1u << 29)) && (ecx & (1u << 12));
  const bool avx2 = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ebx & (1u << 5));
  if (detail::avx2_compiled() && f16c_fma && avx2) {
    EXPECT_EQ(isa, "avx2");
  }
#endif
}

// Pairwise accumulation over several "ranks" rounds once per step, as NCCL does.
TEST(Reduce, Fp16AccumulationRoundsPerStep) {
  const uint16_t one = 0x3c00, tiny = 0x1000;  // 1.0 and 2^-11 (half an ulp of 1.0)
  std::vector<uint16_t> acc(9, one), in(9, tiny);
  for (int step = 0; step < 3; ++step) reduce2(acc.data(), acc.data(), in.data(), acc.size(), DataType::kFloat16, RedOp::kSum);
  // Each step is a tie that rounds back to 1.0; a single rounding of the exact
  // sum 1 + 3*2^-11 (a tie between 1 + 2^-10 and 1 + 2^-9)
  // would give 1 + 2^-9 instead.
  for (uint16_t v : acc) EXPECT_EQ(v, one);
}

// ---------------- divide ----------------

uint64_t ref_divide(DataType dt, uint64_t x, uint64_t n) {
  const size_t size = dtype_size(dt);
  if (is_int(dt)) {
    const uint64_t mask = size == 8 ? ~0ull : (1ull << (8 * size)) - 1;
    if (is_signed_int(dt)) {
      const int shift = 64 - 8 * static_cast<int>(size);
      const __int128 sx = static_cast<int64_t>(x << shift) >> shift;
      return static_cast<uint64_t>(static_cast<int64_t>(sx / static_cast<__int128>(n))) & mask;
    }
    return (x / n) & mask;
  }
  if (dt == DataType::kFloat32) {
    return std::bit_cast<uint32_t>(std::bit_cast<float>(static_cast<uint32_t>(x)) / static_cast<float>(n));
  }
  if (dt == DataType::kFloat64) return std::bit_cast<uint64_t>(std::bit_cast<double>(x) / static_cast<double>(n));
  return ref_encode_narrow(dt, ref_decode_narrow(dt, x) / static_cast<float>(n));
}

bool run_divide(Path path, void* d, const void* s, size_t n, DataType dt, uint64_t div) {
  switch (path) {
    case Path::kDispatch: divide(d, s, n, dt, div); return true;
    case Path::kScalar: detail::divide_scalar(d, s, n, dt, div); return true;
    case Path::kAvx2: return detail::divide_avx2(d, s, n, dt, div);
  }
  return false;
}

class DivideTest : public ::testing::TestWithParam<DataType> {};

TEST_P(DivideTest, MatchesReference) {
  const DataType dt = GetParam();
  const size_t size = dtype_size(dt);
  const uint64_t divisors[] = {1, 2, 3, 7, 8, 1000, 1ull << 63, ~0ull};
  uint64_t seed = 99;
  for (Path path : usable_paths()) {
    for (uint64_t n : divisors) {
      for (size_t count : kCounts) {
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + " n=" + std::to_string(n) + " count=" + std::to_string(count) +
                       (in_place ? " in-place" : " distinct") + " path=" + path_name(path));
          std::mt19937_64 rng(seed++);
          std::vector<uint8_t> src(count * size + 2 * kPad, kGuard), dst(count * size + 2 * kPad, kGuard);
          std::vector<uint64_t> vs(count);
          for (size_t i = 0; i < count; ++i) {
            vs[i] = random_element(dt, rng);
            if (i == 0 && is_signed_int(dt)) vs[i] = 1ull << (8 * size - 1);  // the most negative value
            store_bits(src.data() + kPad + 1, i, size, vs[i]);
          }
          std::vector<uint8_t>& out = in_place ? src : dst;
          const size_t ooff = in_place ? kPad + 1 : kPad + 3;
          const std::vector<uint8_t> before = out;
          if (!run_divide(path, out.data() + ooff, src.data() + kPad + 1, count, dt, n)) {
            EXPECT_TRUE(is_int(dt) || dt == DataType::kFp8E4M3 || dt == DataType::kFp8E5M2);
            continue;
          }
          ASSERT_NO_FATAL_FAILURE(expect_guards(before, out, ooff, ooff + count * size));
          for (size_t i = 0; i < count; ++i) {
            const uint64_t want = ref_divide(dt, vs[i], n);
            const uint64_t got = load_bits(out.data() + ooff, i, size);
            const bool ok = ref_is_nan(dt, want) ? ref_is_nan(dt, got) : got == want;
            ASSERT_TRUE(ok) << "element " << i << " x=0x" << std::hex << vs[i] << " want 0x" << want << " got 0x"
                            << got;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DivideTest, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Divide, KnownValues) {
  int32_t i32[] = {-7, 7, std::numeric_limits<int32_t>::min()};
  divide(i32, i32, 3, DataType::kInt32, 2);
  EXPECT_EQ(i32[0], -3);  // truncation toward zero
  EXPECT_EQ(i32[1], 3);
  EXPECT_EQ(i32[2], std::numeric_limits<int32_t>::min() / 2);
  int64_t i64[] = {std::numeric_limits<int64_t>::min(), -5};
  divide(i64, i64, 2, DataType::kInt64, 1ull << 63);
  EXPECT_EQ(i64[0], -1);
  EXPECT_EQ(i64[1], 0);
  uint8_t u8[] = {255, 3};
  divide(u8, u8, 2, DataType::kUint8, 0);  // n == 0: documented to leave the values
  EXPECT_EQ(u8[0], 255);
  EXPECT_EQ(u8[1], 3);
  float f[] = {1.0f, 3.0f};
  divide(f, f, 2, DataType::kFloat32, 3);
  EXPECT_EQ(f[0], 1.0f / 3.0f);
  EXPECT_EQ(f[1], 1.0f);
}

// ---------------- element accessors ----------------

TEST(Elements, StoreThenLoadRoundsLikeTheConversions) {
  uint8_t buf[64];
  for (DataType dt : kAllTypes) {
    SCOPED_TRACE(dtype_name(dt));
    std::memset(buf, 0, sizeof(buf));
    store_element(buf, 2, dt, 3.0);
    EXPECT_EQ(load_element(buf, 2, dt), 3.0);
    EXPECT_EQ(load_element(buf, 1, dt), 0.0);  // neighbours untouched
    EXPECT_EQ(load_element(buf, 3, dt), 0.0);
    if (is_floating(dt)) {
      store_element(buf, 0, dt, -0.5);
      EXPECT_EQ(load_element(buf, 0, dt), -0.5);
    }
  }
  store_element(buf, 0, DataType::kFloat16, 0.1);
  EXPECT_EQ(load_bits(buf, 0, 2), 0x2e66u);
  store_element(buf, 0, DataType::kBfloat16, 0.1);
  EXPECT_EQ(load_bits(buf, 0, 2), 0x3dcdu);
  store_element(buf, 0, DataType::kFp8E4M3, 1000.0);
  EXPECT_EQ(load_bits(buf, 0, 1), 0x7eu);  // saturates
  store_element(buf, 0, DataType::kInt32, -2.75);
  EXPECT_EQ(load_element(buf, 0, DataType::kInt32), -2.0);
  store_element(buf, 0, DataType::kUint8, 300.0);
  EXPECT_EQ(load_element(buf, 0, DataType::kUint8), 44.0);  // wraps modulo 256
  store_element(buf, 0, DataType::kUint64, 18446744073709549568.0);  // 2^64 - 2048
  EXPECT_EQ(load_bits(buf, 0, 8), 18446744073709549568ull);
  store_element(buf, 0, DataType::kInt64, -1e18);
  EXPECT_EQ(static_cast<int64_t>(load_bits(buf, 0, 8)), -1000000000000000000ll);
  store_element(buf, 1, DataType::kFloat64, 0.1);
  EXPECT_EQ(load_element(buf, 1, DataType::kFloat64), 0.1);
}

// Streaming copy: every head/tail split around the 32-byte aligned middle and
// the 128-byte blocks, and nothing written outside [dst, dst + bytes).
TEST(StreamCopy, CopiesEveryLengthAndAlignmentExactly) {
  std::vector<unsigned char> src(4096 + 64), dst(4096 + 128);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  size_t cases = 0;
  for (size_t doff : {0, 1, 7, 31, 32, 33}) {
    for (size_t soff : {0, 3, 32}) {
      for (size_t n : {0, 1, 31, 32, 33, 127, 128, 129, 255, 256, 300, 1000, 4000}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        stream_copy(dst.data() + doff, src.data() + soff, n);
        ASSERT_EQ(std::memcmp(dst.data() + doff, src.data() + soff, n), 0) << doff << " " << soff << " " << n;
        for (size_t i = 0; i < dst.size(); ++i)
          if (i < doff || i >= doff + n) {
            ASSERT_EQ(dst[i], 0xEE) << "byte " << i << " outside the copy";
          }
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 6u * 3u * 13u);
  // Large enough for the streaming loop to dominate.
  std::vector<unsigned char> big_src(9 << 20), big_dst(9 << 20);
  for (size_t i = 0; i < big_src.size(); ++i) big_src[i] = static_cast<unsigned char>(i ^ (i >> 9));
  stream_copy(big_dst.data() + 5, big_src.data() + 1, big_src.size() - 8);
  EXPECT_EQ(std::memcmp(big_dst.data() + 5, big_src.data() + 1, big_src.size() - 8), 0);
}

}  // namespace
}  // namespace loom::kernels
