// Reference conversions for the kernel tests, written independently of
// src/kernels/float_conv.h: decoding by ldexp, encoding by searching for the
// nearest representable value in double precision, and the compiler's
// _Float16 / the CPU's F16C for binary16. Slow on purpose; tests only.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define LOOM_TEST_HAVE_X86 1
#endif

namespace loom::testref {

inline uint32_t float_bits(float f) { return std::bit_cast<uint32_t>(f); }
inline float bits_float(uint32_t b) { return std::bit_cast<float>(b); }

// ---- binary16 ----

#if defined(__FLT16_MAX__)
#define LOOM_TEST_HAVE_FLOAT16 1
inline float f16_ref_to_float(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }
inline uint16_t f16_ref_from_float(float f) { return std::bit_cast<uint16_t>(static_cast<_Float16>(f)); }
#endif

#if defined(LOOM_TEST_HAVE_X86)
inline bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
}
__attribute__((target("f16c"))) inline float f16c_to_float(uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
__attribute__((target("f16c"))) inline uint16_t f16c_from_float(float f) {
  return static_cast<uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}
#else
inline bool cpu_has_f16c() { return false; }
inline float f16c_to_float(uint16_t) { return 0; }
inline uint16_t f16c_from_float(float) { return 0; }
#endif

// ---- generic small float formats (IEEE layout, bias 2^(E-1)-1) ----

struct SmallFormat {
  int exp_bits;
  int man_bits;
  bool has_inf;  // false: E4M3-style, only S.1111.111 is NaN
};
inline constexpr SmallFormat kFp16{5, 10, true};
inline constexpr SmallFormat kBf16{8, 7, true};
inline constexpr SmallFormat kE4M3{4, 3, false};
inline constexpr SmallFormat kE5M2{5, 2, true};

inline bool small_is_nan(SmallFormat f, uint32_t code) {
  const uint32_t mag = code & ((1u << (f.exp_bits + f.man_bits)) - 1);
  const uint32_t exp = mag >> f.man_bits;
  const uint32_t man = mag & ((1u << f.man_bits) - 1);
  const uint32_t exp_all = (1u << f.exp_bits) - 1;
  if (f.has_inf) return exp == exp_all && man != 0;
  return exp == exp_all && man == (1u << f.man_bits) - 1;
}

// Value of a code as a double (NaN -> quiet NaN, inf -> inf).
inline double small_to_double(SmallFormat f, uint32_t code) {
  const int width = f.exp_bits + f.man_bits;
  const bool neg = (code >> width) & 1u;
  const uint32_t mag = code & ((1u << width) - 1);
  const int exp = static_cast<int>(mag >> f.man_bits);
  const int man = static_cast<int>(mag & ((1u << f.man_bits) - 1));
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  const int exp_all = (1 << f.exp_bits) - 1;
  double v;
  if (small_is_nan(f, code)) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (f.has_inf && exp == exp_all) {
    v = std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(man), 1 - bias - f.man_bits);
  } else {
    v = std::ldexp(1.0 + std::ldexp(static_cast<double>(man), -f.man_bits), exp - bias);
  }
  return neg ? -v : v;
}

// Largest finite magnitude code of a format.
inline uint32_t small_max_code(SmallFormat f) {
  const uint32_t exp_all = (1u << f.exp_bits) - 1;
  if (f.has_inf) return ((exp_all - 1) << f.man_bits) | ((1u << f.man_bits) - 1);
  return (exp_all << f.man_bits) | ((1u << f.man_bits) - 2);
}

// Round a finite double to the nearest code by binary search over the
// (monotonic) magnitude codes, ties to the even code. saturate: beyond the
// largest finite value -> max; otherwise IEEE overflow to inf (needs has_inf).
inline uint32_t small_from_double(SmallFormat f, double x, bool saturate) {
  const int width = f.exp_bits + f.man_bits;
  const uint32_t sign = std::signbit(x) ? (1u << width) : 0u;
  const double ax = std::fabs(x);
  const uint32_t max_code = small_max_code(f);
  const double max_val = small_to_double(f, max_code);
  if (ax >= max_val) {
    if (saturate || ax == max_val) return sign | max_code;
    // Overflow threshold: max + half an ulp of the max's binade; a tie goes to
    // the even neighbour, which is the (odd-mantissa max)'s successor = inf.
    const double ulp = max_val - small_to_double(f, max_code - 1);
    if (ax < max_val + ulp / 2) return sign | max_code;
    return sign | (max_code + 1);  // inf
  }
  // Largest code with value <= ax.
  uint32_t lo = 0, hi = max_code;
  while (lo < hi) {
    const uint32_t mid = (lo + hi + 1) / 2;
    if (small_to_double(f, mid) <= ax) lo = mid; else hi = mid - 1;
  }
  const double vlo = small_to_double(f, lo);
  if (vlo == ax) return sign | lo;
  const double vhi = small_to_double(f, lo + 1);
  const double dlo = ax - vlo, dhi = vhi - ax;  // exact: both fit in double
  if (dlo < dhi) return sign | lo;
  if (dhi < dlo) return sign | (lo + 1);
  return sign | ((lo & 1u) ? lo + 1 : lo);
}

// float -> bf16 reference: IEEE rounding (overflow to inf), NaN quieted with
// its top payload bits (the contract of float_to_bf16).
inline uint16_t bf16_ref_from_float(float f) {
  const uint32_t b = float_bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((b >> 16) | 0x40u);
  if (std::isinf(f)) return static_cast<uint16_t>(b >> 16);
  return static_cast<uint16_t>(small_from_double(kBf16, static_cast<double>(f), false));
}

inline float bf16_ref_to_float(uint16_t h) {
  if (small_is_nan(kBf16, h)) return bits_float(static_cast<uint32_t>(h) << 16);
  return static_cast<float>(small_to_double(kBf16, h));
}

// float -> fp8 reference: satfinite, NaN -> 0x7f (CUDA's behaviour).
inline uint8_t fp8_ref_from_float(SmallFormat f, float x) {
  if (std::isnan(x)) return 0x7f;
  return static_cast<uint8_t>(small_from_double(f, static_cast<double>(x), true));
}

inline float fp8_ref_to_float(SmallFormat f, uint8_t v) {
  return static_cast<float>(small_to_double(f, v));
}

// Binary16 reference used by the reduction tests: the compiler's _Float16 when
// it has one, else F16C, else the search-based converter above.
inline float f16_ref_decode(uint16_t h) {
#if defined(LOOM_TEST_HAVE_FLOAT16)
  return f16_ref_to_float(h);
#else
  return static_cast<float>(small_to_double(kFp16, h));
#endif
}
inline uint16_t f16_ref_encode(float f) {
#if defined(LOOM_TEST_HAVE_FLOAT16)
  return f16_ref_from_float(f);
#else
  if (std::isnan(f)) return static_cast<uint16_t>(0x7e00u | ((float_bits(f) >> 16) & 0x8000u));
  return static_cast<uint16_t>(small_from_double(kFp16, static_cast<double>(f), false));
#endif
}

}  // namespace loom::testref
