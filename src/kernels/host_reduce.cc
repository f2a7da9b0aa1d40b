// Portable scalar reductions, the run-time choice between them and the AVX2
// kernels (host_reduce_avx2.cc), and the generic element accessors.
#include "kernels/host_reduce.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace loom::kernels {

namespace {

// memcpy-based element access: pointers need not be element-aligned, and the
// compiler turns these into plain moves.
template <class T>
inline T ld(const void* base, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(base) + i * sizeof(T), sizeof(T));
  return v;
}

template <class T>
inline void st(void* base, size_t i, T v) {
  std::memcpy(static_cast<char*>(base) + i * sizeof(T), &v, sizeof(T));
}

// ---- element operators ----
// Integers: wrap-around arithmetic on the unsigned representation (no UB).
// Floating: see the NaN contract in host_reduce.h; the AVX2 kernels implement
// exactly the same expressions (vmaxps(a, b) == (a > b ? a : b)).

struct OpSum {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      // Both NaN: a's, quieted (a + a), on every path. x86 returns the first
      // operand's NaN and the compiler may swap a commutative a + b, so the
      // scalar and AVX2 paths picked differently (fp16: 4.2 M pairs of 2^32).
      // One NaN: a + b gives that one, quieted, in either order.
      return a != a ? a + a : a + b;
    }
  }
};

struct OpProd {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      // uint8 promotes to int; 255 * 255 still fits, so no signed overflow.
      return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    } else {
      return a != a ? a * a : a * b;  // both NaN: a's (see OpSum)
    }
  }
};

struct OpMax {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (!std::is_integral_v<T>) {
      if (a != a) return a;  // NaN in a propagates; NaN in b falls out below
    }
    return a > b ? a : b;
  }
};

struct OpMin {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (!std::is_integral_v<T>) {
      if (a != a) return a;
    }
    return a < b ? a : b;
  }
};

// ---- storage formats: how an element is read as a computation value and
// written back. Native types compute in themselves; the narrow floating types
// compute in float. ----

template <class T>
struct Native {
  using Storage = T;
  using Compute = T;
  static Compute decode(Storage v) { return v; }
  static Storage encode(Compute v) { return v; }
};

struct Half {
  using Storage = uint16_t;
  using Compute = float;
  static float decode(uint16_t v) { return fp16_to_float(v); }
  static uint16_t encode(float v) { return float_to_fp16(v); }
};

struct BFloat {
  using Storage = uint16_t;
  using Compute = float;
  static float decode(uint16_t v) { return bf16_to_float(v); }
  static uint16_t encode(float v) { return float_to_bf16(v); }
};

// fp8 decoding goes through a 1 KiB table: the bit manipulation per element
// would otherwise dominate this (scalar-only) path.
template <float (*kDecode)(uint8_t)>
constexpr std::array<float, 256> make_fp8_table() {
  std::array<float, 256> t{};
  for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = kDecode(static_cast<uint8_t>(i));
  return t;
}
constexpr std::array<float, 256> kE4M3Table = make_fp8_table<fp8e4m3_to_float>();
constexpr std::array<float, 256> kE5M2Table = make_fp8_table<fp8e5m2_to_float>();

struct E4M3 {
  using Storage = uint8_t;
  using Compute = float;
  static float decode(uint8_t v) { return kE4M3Table[v]; }
  static uint8_t encode(float v) { return float_to_fp8e4m3(v); }
};

struct E5M2 {
  using Storage = uint8_t;
  using Compute = float;
  static float decode(uint8_t v) { return kE5M2Table[v]; }
  static uint8_t encode(float v) { return float_to_fp8e5m2(v); }
};

template <class Fmt, class Op>
void reduce_loop(void* dst, const void* a, const void* b, size_t count) {
  using S = typename Fmt::Storage;
  for (size_t i = 0; i < count; ++i) {
    // Both loads happen before the store, so exact aliasing of dst is fine.
    const auto x = Fmt::decode(ld<S>(a, i));
    const auto y = Fmt::decode(ld<S>(b, i));
    st<S>(dst, i, Fmt::encode(Op::apply(x, y)));
  }
}

template <class Fmt>
void reduce_op(void* dst, const void* a, const void* b, size_t count, RedOp op) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg:
      return reduce_loop<Fmt, OpSum>(dst, a, b, count);
    case RedOp::kProd:
      return reduce_loop<Fmt, OpProd>(dst, a, b, count);
    case RedOp::kMax:
      return reduce_loop<Fmt, OpMax>(dst, a, b, count);
    case RedOp::kMin:
      return reduce_loop<Fmt, OpMin>(dst, a, b, count);
  }
}

// Integer division by a run-time n, C++ semantics, for any n >= 1.
template <class T>
T int_divide(T x, uint64_t n) {
  if constexpr (std::is_signed_v<T>) {
    constexpr uint64_t kMaxSigned = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    if (n > kMaxSigned) {
      // |x| < n except for INT64_MIN / 2^63, the one quotient that is not 0.
      const bool minus_one = x == std::numeric_limits<T>::min() && sizeof(T) == 8 && n == kMaxSigned + 1;
      return static_cast<T>(minus_one ? -1 : 0);
    }
    return static_cast<T>(static_cast<int64_t>(x) / static_cast<int64_t>(n));
  } else {
    return static_cast<T>(static_cast<uint64_t>(x) / n);
  }
}

template <class T>
void divide_int(void* dst, const void* src, size_t count, uint64_t n) {
  if (n == 0) {
    if (dst != src) std::memmove(dst, src, count * sizeof(T));
    return;
  }
  for (size_t i = 0; i < count; ++i) st<T>(dst, i, int_divide(ld<T>(src, i), n));
}

template <class Fmt>
void divide_float(void* dst, const void* src, size_t count, uint64_t n) {
  using S = typename Fmt::Storage;
  using C = typename Fmt::Compute;
  const C divisor = static_cast<C>(n);
  for (size_t i = 0; i < count; ++i) st<S>(dst, i, Fmt::encode(Fmt::decode(ld<S>(src, i)) / divisor));
}

#if defined(LOOM_HAVE_AVX2_KERNELS) && (defined(__x86_64__) || defined(__i386__))
// cpuid rather than __builtin_cpu_supports: clang 14 does not know "f16c".
// The AVX2 file is compiled with -mavx2 -mf16c -mfma and the compiler may use
// any of them there, so all three are required, plus OS support for saving the
// YMM registers (XCR0 bits 1 and 2).
bool detect_avx2() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  const bool fma = ecx & (1u << 12), osxsave = ecx & (1u << 27), avx = ecx & (1u << 28),
             f16c = ecx & (1u << 29);
  if (!(fma && osxsave && avx && f16c)) return false;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 6u) != 6u) return false;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return ebx & (1u << 5);
}
#else
bool detect_avx2() { return false; }
#endif

bool use_avx2() {
  static const bool kUse = detect_avx2();
  return kUse;
}

// Integer stores for store_element: truncate, then wrap modulo 2^64 (and then
// to the type's width). Out-of-range doubles would be UB in a plain cast.
uint64_t double_to_wrapped_u64(double v) {
  if (std::isnan(v)) return 0;
  v = std::trunc(v);
  constexpr double kTwo63 = 9223372036854775808.0;
  constexpr double kTwo64 = 18446744073709551616.0;
  if (v >= -kTwo63 && v < kTwo63) return static_cast<uint64_t>(static_cast<int64_t>(v));
  if (v >= kTwo63 && v < kTwo64) return static_cast<uint64_t>(v);
  return 0;  // documented as unspecified
}

}  // namespace

namespace detail {

void reduce2_scalar(void* dst, const void* a, const void* b, size_t count, DataType dt, RedOp op) {
  if (count == 0) return;
  switch (dt) {
    case DataType::kInt8: return reduce_op<Native<int8_t>>(dst, a, b, count, op);
    case DataType::kUint8: return reduce_op<Native<uint8_t>>(dst, a, b, count, op);
    case DataType::kInt32: return reduce_op<Native<int32_t>>(dst, a, b, count, op);
    case DataType::kUint32: return reduce_op<Native<uint32_t>>(dst, a, b, count, op);
    case DataType::kInt64: return reduce_op<Native<int64_t>>(dst, a, b, count, op);
    case DataType::kUint64: return reduce_op<Native<uint64_t>>(dst, a, b, count, op);
    case DataType::kFloat16: return reduce_op<Half>(dst, a, b, count, op);
    case DataType::kFloat32: return reduce_op<Native<float>>(dst, a, b, count, op);
    case DataType::kFloat64: return reduce_op<Native<double>>(dst, a, b, count, op);
    case DataType::kBfloat16: return reduce_op<BFloat>(dst, a, b, count, op);
    case DataType::kFp8E4M3: return reduce_op<E4M3>(dst, a, b, count, op);
    case DataType::kFp8E5M2: return reduce_op<E5M2>(dst, a, b, count, op);
  }
}

void divide_scalar(void* dst, const void* src, size_t count, DataType dt, uint64_t n) {
  if (count == 0) return;
  switch (dt) {
    case DataType::kInt8: return divide_int<int8_t>(dst, src, count, n);
    case DataType::kUint8: return divide_int<uint8_t>(dst, src, count, n);
    case DataType::kInt32: return divide_int<int32_t>(dst, src, count, n);
    case DataType::kUint32: return divide_int<uint32_t>(dst, src, count, n);
    case DataType::kInt64: return divide_int<int64_t>(dst, src, count, n);
    case DataType::kUint64: return divide_int<uint64_t>(dst, src, count, n);
    case DataType::kFloat16: return divide_float<Half>(dst, src, count, n);
    case DataType::kFloat32: return divide_float<Native<float>>(dst, src, count, n);
    case DataType::kFloat64: return divide_float<Native<double>>(dst, src, count, n);
    case DataType::kBfloat16: return divide_float<BFloat>(dst, src, count, n);
    case DataType::kFp8E4M3: return divide_float<E4M3>(dst, src, count, n);
    case DataType::kFp8E5M2: return divide_float<E5M2>(dst, src, count, n);
  }
}

bool avx2_usable() { return use_avx2(); }

bool avx2_compiled() {
#if defined(LOOM_HAVE_AVX2_KERNELS)
  return true;
#else
  return false;
#endif
}

#if !defined(LOOM_HAVE_AVX2_KERNELS)
// Builds without the AVX2 file (non-x86, or a compiler without -mavx2).
bool reduce2_avx2(void*, const void*, const void*, size_t, DataType, RedOp) { return false; }
bool divide_avx2(void*, const void*, size_t, DataType, uint64_t) { return false; }
void stream_copy_avx2(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
#endif

}  // namespace detail

void reduce2(void* dst, const void* a, const void* b, size_t count, DataType dt, RedOp op) {
  if (count == 0) return;
  // Less than one 32-byte vector: the vector kernel would only dispatch to
  // this scalar loop for its tail (~100 instructions of an 8 B allreduce).
  if (count * dtype_size(dt) >= 32 && use_avx2() && detail::reduce2_avx2(dst, a, b, count, dt, op)) return;
  detail::reduce2_scalar(dst, a, b, count, dt, op);
}

void stream_copy(void* dst, const void* src, size_t bytes) {
  if (use_avx2()) detail::stream_copy_avx2(dst, src, bytes);
  else std::memcpy(dst, src, bytes);
}

void divide(void* dst, const void* src, size_t count, DataType dt, uint64_t n) {
  if (count == 0) return;
  if (use_avx2() && detail::divide_avx2(dst, src, count, dt, n)) return;
  detail::divide_scalar(dst, src, count, dt, n);
}

const char* reduce_isa() { return use_avx2() ? "avx2" : "scalar"; }

double load_element(const void* base, size_t index, DataType dt) {
  switch (dt) {
    case DataType::kInt8: return ld<int8_t>(base, index);
    case DataType::kUint8: return ld<uint8_t>(base, index);
    case DataType::kInt32: return ld<int32_t>(base, index);
    case DataType::kUint32: return ld<uint32_t>(base, index);
    case DataType::kInt64: return static_cast<double>(ld<int64_t>(base, index));
    case DataType::kUint64: return static_cast<double>(ld<uint64_t>(base, index));
    case DataType::kFloat16: return fp16_to_float(ld<uint16_t>(base, index));
    case DataType::kFloat32: return ld<float>(base, index);
    case DataType::kFloat64: return ld<double>(base, index);
    case DataType::kBfloat16: return bf16_to_float(ld<uint16_t>(base, index));
    case DataType::kFp8E4M3: return fp8e4m3_to_float(ld<uint8_t>(base, index));
    case DataType::kFp8E5M2: return fp8e5m2_to_float(ld<uint8_t>(base, index));
  }
  return 0.0;
}

void store_element(void* base, size_t index, DataType dt, double value) {
  const float f = static_cast<float>(value);
  switch (dt) {
    case DataType::kInt8:
      return st<int8_t>(base, index, static_cast<int8_t>(double_to_wrapped_u64(value)));
    case DataType::kUint8:
      return st<uint8_t>(base, index, static_cast<uint8_t>(double_to_wrapped_u64(value)));
    case DataType::kInt32:
      return st<int32_t>(base, index, static_cast<int32_t>(double_to_wrapped_u64(value)));
    case DataType::kUint32:
      return st<uint32_t>(base, index, static_cast<uint32_t>(double_to_wrapped_u64(value)));
    case DataType::kInt64:
      return st<int64_t>(base, index, static_cast<int64_t>(double_to_wrapped_u64(value)));
    case DataType::kUint64:
      return st<uint64_t>(base, index, double_to_wrapped_u64(value));
    case DataType::kFloat16: return st<uint16_t>(base, index, float_to_fp16(f));
    case DataType::kFloat32: return st<float>(base, index, f);
    case DataType::kFloat64: return st<double>(base, index, value);
    case DataType::kBfloat16: return st<uint16_t>(base, index, float_to_bf16(f));
    case DataType::kFp8E4M3: return st<uint8_t>(base, index, float_to_fp8e4m3(f));
    case DataType::kFp8E5M2: return st<uint8_t>(base, index, float_to_fp8e5m2(f));
  }
}

}  // namespace loom::kernels
