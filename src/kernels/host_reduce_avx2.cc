// AVX2 (+F16C) reduction kernels. This file alone is compiled with
// -mavx2 -mf16c -mfma; host_reduce.cc calls into it only after checking the
// CPU at run time.
//
// Everything here lives in an anonymous namespace and the file calls no inline
// function shared with other files (float_conv.h included): an out-of-line copy
// of such a function compiled here would carry AVX2 instructions, and the linker
// may keep that copy for every caller, crashing CPUs without AVX2. Tails go to
// detail::reduce2_scalar / divide_scalar, so tail elements get exactly the
// scalar semantics.
//
// Each kernel processes one 256-bit vector of output (or 128 bits for fp16,
// whose float working set is 256 bits); the driver unrolls four of them so the
// loop is bound by memory bandwidth rather than by the loop overhead.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/host_reduce.h"

namespace loom::kernels::detail {

namespace {

// Runs step(i) for i = 0, kStep, 2*kStep, ... while a full step fits; returns
// the number of elements processed (the caller does the tail).
template <size_t kStep, class Step>
inline size_t drive(size_t count, Step step) {
  size_t i = 0;
  for (; i + 4 * kStep <= count; i += 4 * kStep) {
    step(i);
    step(i + kStep);
    step(i + 2 * kStep);
    step(i + 3 * kStep);
  }
  for (; i + kStep <= count; i += kStep) step(i);
  return i;
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline void store256(void* p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline void store128(void* p, __m128i v) { _mm_storeu_si128(static_cast<__m128i*>(p), v); }

// ---- floating operators (float and double lanes) ----
// max/min: vmaxps(a, b) returns b when either is NaN or both are equal, i.e.
// (a > b ? a : b); a NaN in a is then put back, matching the scalar contract.

// sum/prod: with both inputs NaN the instruction returns its first source's
// NaN (quieted), and the compiler may swap the operands of a commutative
// intrinsic; inline assembly pins a as the first source, so a's NaN wins as
// on the scalar path (OpSum), at no cost per vector.
#define LOOM_A_FIRST(fn, insn, T)                          \
  inline T fn(T a, T b) {                                  \
    T r;                                                   \
    asm(insn " %2, %1, %0" : "=x"(r) : "x"(a), "x"(b));    \
    return r;                                              \
  }
LOOM_A_FIRST(add_a_first, "vaddps", __m256)
LOOM_A_FIRST(add_a_first, "vaddpd", __m256d)
LOOM_A_FIRST(mul_a_first, "vmulps", __m256)
LOOM_A_FIRST(mul_a_first, "vmulpd", __m256d)
#undef LOOM_A_FIRST

struct VSum {
  static __m256 f(__m256 a, __m256 b) { return add_a_first(a, b); }
  static __m256d d(__m256d a, __m256d b) { return add_a_first(a, b); }
};
struct VProd {
  static __m256 f(__m256 a, __m256 b) { return mul_a_first(a, b); }
  static __m256d d(__m256d a, __m256d b) { return mul_a_first(a, b); }
};
struct VMax {
  static __m256 f(__m256 a, __m256 b) {
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static __m256d d(__m256d a, __m256d b) {
    return _mm256_blendv_pd(_mm256_max_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
};
struct VMin {
  static __m256 f(__m256 a, __m256 b) {
    return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static __m256d d(__m256d a, __m256d b) {
    return _mm256_blendv_pd(_mm256_min_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
};

// ---- integer operators ----

// Products modulo 256 from 16-bit multiplies: the low byte of a 16-bit product
// depends only on the low bytes of its factors (same for signed and unsigned).
inline __m256i mul_epi8(__m256i a, __m256i b) {
  const __m256i even = _mm256_and_si256(_mm256_mullo_epi16(a, b), _mm256_set1_epi16(0x00ff));
  const __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
  return _mm256_or_si256(even, _mm256_slli_epi16(odd, 8));
}

// 64-bit product modulo 2^64 from 32x32->64 multiplies (AVX2 has no vpmullq).
inline __m256i mul_epi64(__m256i a, __m256i b) {
  const __m256i lo = _mm256_mul_epu32(a, b);
  const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
                                         _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
  return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
}

inline __m256i max_epi64(__m256i a, __m256i b) {
  return _mm256_blendv_epi8(b, a, _mm256_cmpgt_epi64(a, b));
}
inline __m256i min_epi64(__m256i a, __m256i b) {
  return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b));
}
// Unsigned 64-bit compare: flip the sign bits, compare signed.
inline __m256i gt_epu64(__m256i a, __m256i b) {
  const __m256i flip = _mm256_set1_epi64x(static_cast<int64_t>(0x8000000000000000ull));
  return _mm256_cmpgt_epi64(_mm256_xor_si256(a, flip), _mm256_xor_si256(b, flip));
}
inline __m256i max_epu64(__m256i a, __m256i b) { return _mm256_blendv_epi8(b, a, gt_epu64(a, b)); }
inline __m256i min_epu64(__m256i a, __m256i b) { return _mm256_blendv_epi8(a, b, gt_epu64(a, b)); }

// ---- bfloat16 <-> float lanes ----
// A 256-bit load holds 16 bf16 values; as 32-bit lanes, the even elements sit
// in the low halves and the odd ones in the high halves. Widening is then a
// shift (even) or a mask (odd), and narrowing an OR: no cross-lane shuffles.

inline __m256 bf16_even_to_float(__m256i x) { return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)); }
inline __m256 bf16_odd_to_float(__m256i x) {
  return _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

// Rounds 8 floats to bf16 in the top 16 bits of each lane (the low 16 bits are
// garbage): round to nearest even by adding 0x7fff + lsb; NaN lanes get no
// rounding bias (it could carry into the exponent / sign) and the quiet bit.
inline __m256i round_bf16_high(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_andnot_si256(is_nan, bias));
  return _mm256_or_si256(rounded, _mm256_and_si256(is_nan, _mm256_set1_epi32(0x00400000)));
}

inline __m256i pack_bf16(__m256 even, __m256 odd) {
  return _mm256_or_si256(_mm256_srli_epi32(round_bf16_high(even), 16),
                         _mm256_and_si256(round_bf16_high(odd), _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

constexpr int kF16Round = _MM_FROUND_TO_NEAREST_INT;

// ---- typed loops ----

template <class Op>
size_t float_loop(void* d, const void* a, const void* b, size_t n) {
  auto* dp = static_cast<float*>(d);
  const auto* ap = static_cast<const float*>(a);
  const auto* bp = static_cast<const float*>(b);
  return drive<8>(n, [&](size_t i) {
    _mm256_storeu_ps(dp + i, Op::f(_mm256_loadu_ps(ap + i), _mm256_loadu_ps(bp + i)));
  });
}

template <class Op>
size_t double_loop(void* d, const void* a, const void* b, size_t n) {
  auto* dp = static_cast<double*>(d);
  const auto* ap = static_cast<const double*>(a);
  const auto* bp = static_cast<const double*>(b);
  return drive<4>(n, [&](size_t i) {
    _mm256_storeu_pd(dp + i, Op::d(_mm256_loadu_pd(ap + i), _mm256_loadu_pd(bp + i)));
  });
}

template <class Op>
size_t fp16_loop(void* d, const void* a, const void* b, size_t n) {
  auto* dp = static_cast<uint16_t*>(d);
  const auto* ap = static_cast<const uint16_t*>(a);
  const auto* bp = static_cast<const uint16_t*>(b);
  return drive<8>(n, [&](size_t i) {
    const __m256 x = _mm256_cvtph_ps(load128(ap + i));
    const __m256 y = _mm256_cvtph_ps(load128(bp + i));
    store128(dp + i, _mm256_cvtps_ph(Op::f(x, y), kF16Round));
  });
}

template <class Op>
size_t bf16_loop(void* d, const void* a, const void* b, size_t n) {
  auto* dp = static_cast<uint16_t*>(d);
  const auto* ap = static_cast<const uint16_t*>(a);
  const auto* bp = static_cast<const uint16_t*>(b);
  return drive<16>(n, [&](size_t i) {
    const __m256i x = load256(ap + i);
    const __m256i y = load256(bp + i);
    store256(dp + i, pack_bf16(Op::f(bf16_even_to_float(x), bf16_even_to_float(y)),
                               Op::f(bf16_odd_to_float(x), bf16_odd_to_float(y))));
  });
}

// Integer loops: kElem bytes per element, IntOp(a, b) -> __m256i.
template <size_t kElem, class IntOp>
size_t int_loop(void* d, const void* a, const void* b, size_t n, IntOp op) {
  auto* dp = static_cast<char*>(d);
  const auto* ap = static_cast<const char*>(a);
  const auto* bp = static_cast<const char*>(b);
  return drive<32 / kElem>(n, [&](size_t i) {
    const size_t off = i * kElem;
    store256(dp + off, op(load256(ap + off), load256(bp + off)));
  });
}

template <class Op>
size_t floating_dispatch(DataType dt, void* d, const void* a, const void* b, size_t n) {
  switch (dt) {
    case DataType::kFloat32: return float_loop<Op>(d, a, b, n);
    case DataType::kFloat64: return double_loop<Op>(d, a, b, n);
    case DataType::kFloat16: return fp16_loop<Op>(d, a, b, n);
    case DataType::kBfloat16: return bf16_loop<Op>(d, a, b, n);
    default: return 0;
  }
}

// Returns the number of elements done, or SIZE_MAX when (dt, op) has no
// AVX2 kernel.
constexpr size_t kUnsupported = SIZE_MAX;

size_t integer_dispatch(DataType dt, RedOp op, void* d, const void* a, const void* b, size_t n) {
  const bool sum = op == RedOp::kSum || op == RedOp::kAvg;
  switch (dt) {
    case DataType::kInt8:
    case DataType::kUint8: {
      const bool s = dt == DataType::kInt8;
      if (sum) return int_loop<1>(d, a, b, n, [](__m256i x, __m256i y) { return _mm256_add_epi8(x, y); });
      if (op == RedOp::kProd) {
        return int_loop<1>(d, a, b, n, [](__m256i x, __m256i y) { return mul_epi8(x, y); });
      }
      if (op == RedOp::kMax) {
        return s ? int_loop<1>(d, a, b, n, [](__m256i x, __m256i y) { return _mm256_max_epi8(x, y); })
                 : int_loop<1>(d, a, b, n, [](__m256i x, __m256i y) { return _mm256_max_epu8(x, y); });
      }
      if (op == RedOp::kMin) {
        return s ? int_loop<1>(d, a, b, n, [](__m256i x, __m256i y) { return _mm256_min_epi8(x, y); })
                 : int_loop<1>(d, a, b, n, [](__m256i x, __m256i y) { return _mm256_min_epu8(x, y); });
      }
      return kUnsupported;
    }
    case DataType::kInt32:
    case DataType::kUint32: {
      const bool s = dt == DataType::kInt32;
      if (sum) return int_loop<4>(d, a, b, n, [](__m256i x, __m256i y) { return _mm256_add_epi32(x, y); });
      if (op == RedOp::kProd) {
        return int_loop<4>(d, a, b, n, [](__m256i x, __m256i y) { return _mm256_mullo_epi32(x, y); });
      }
      if (op == RedOp::kMax) {
        return s ? int_loop<4>(d, a, b, n, [](__m256i x, __m256i y) { return _mm256_max_epi32(x, y); })
                 : int_loop<4>(d, a, b, n, [](__m256i x, __m256i y) { return _mm256_max_epu32(x, y); });
      }
      if (op == RedOp::kMin) {
        return s ? int_loop<4>(d, a, b, n, [](__m256i x, __m256i y) { return _mm256_min_epi32(x, y); })
                 : int_loop<4>(d, a, b, n, [](__m256i x, __m256i y) { return _mm256_min_epu32(x, y); });
      }
      return kUnsupported;
    }
    case DataType::kInt64:
    case DataType::kUint64: {
      const bool s = dt == DataType::kInt64;
      if (sum) return int_loop<8>(d, a, b, n, [](__m256i x, __m256i y) { return _mm256_add_epi64(x, y); });
      if (op == RedOp::kProd) {
        return int_loop<8>(d, a, b, n, [](__m256i x, __m256i y) { return mul_epi64(x, y); });
      }
      if (op == RedOp::kMax) {
        return s ? int_loop<8>(d, a, b, n, [](__m256i x, __m256i y) { return max_epi64(x, y); })
                 : int_loop<8>(d, a, b, n, [](__m256i x, __m256i y) { return max_epu64(x, y); });
      }
      if (op == RedOp::kMin) {
        return s ? int_loop<8>(d, a, b, n, [](__m256i x, __m256i y) { return min_epi64(x, y); })
                 : int_loop<8>(d, a, b, n, [](__m256i x, __m256i y) { return min_epu64(x, y); });
      }
      return kUnsupported;
    }
    default:
      return kUnsupported;
  }
}

size_t reduce_vector_part(DataType dt, RedOp op, void* d, const void* a, const void* b, size_t n) {
  switch (dt) {
    case DataType::kFloat32:
    case DataType::kFloat64:
    case DataType::kFloat16:
    case DataType::kBfloat16:
      switch (op) {
        case RedOp::kSum:
        case RedOp::kAvg: return floating_dispatch<VSum>(dt, d, a, b, n);
        case RedOp::kProd: return floating_dispatch<VProd>(dt, d, a, b, n);
        case RedOp::kMax: return floating_dispatch<VMax>(dt, d, a, b, n);
        case RedOp::kMin: return floating_dispatch<VMin>(dt, d, a, b, n);
      }
      return kUnsupported;
    default:
      return integer_dispatch(dt, op, d, a, b, n);
  }
}

size_t divide_vector_part(DataType dt, void* d, const void* s, size_t n, uint64_t divisor) {
  switch (dt) {
    case DataType::kFloat32: {
      const __m256 v = _mm256_set1_ps(static_cast<float>(divisor));
      auto* dp = static_cast<float*>(d);
      const auto* sp = static_cast<const float*>(s);
      return drive<8>(n, [&](size_t i) { _mm256_storeu_ps(dp + i, _mm256_div_ps(_mm256_loadu_ps(sp + i), v)); });
    }
    case DataType::kFloat64: {
      const __m256d v = _mm256_set1_pd(static_cast<double>(divisor));
      auto* dp = static_cast<double*>(d);
      const auto* sp = static_cast<const double*>(s);
      return drive<4>(n, [&](size_t i) { _mm256_storeu_pd(dp + i, _mm256_div_pd(_mm256_loadu_pd(sp + i), v)); });
    }
    case DataType::kFloat16: {
      const __m256 v = _mm256_set1_ps(static_cast<float>(divisor));
      auto* dp = static_cast<uint16_t*>(d);
      const auto* sp = static_cast<const uint16_t*>(s);
      return drive<8>(n, [&](size_t i) {
        store128(dp + i, _mm256_cvtps_ph(_mm256_div_ps(_mm256_cvtph_ps(load128(sp + i)), v), kF16Round));
      });
    }
    case DataType::kBfloat16: {
      const __m256 v = _mm256_set1_ps(static_cast<float>(divisor));
      auto* dp = static_cast<uint16_t*>(d);
      const auto* sp = static_cast<const uint16_t*>(s);
      return drive<16>(n, [&](size_t i) {
        const __m256i x = load256(sp + i);
        store256(dp + i, pack_bf16(_mm256_div_ps(bf16_even_to_float(x), v), _mm256_div_ps(bf16_odd_to_float(x), v)));
      });
    }
    default:
      // Integer division has no AVX2 instruction and fp8 has no conversion
      // instructions: the scalar path handles those.
      return kUnsupported;
  }
}

// The element size, here rather than loom::dtype_size (an inline function of
// types.h: at -O0 an out-of-line copy of it compiled in this file is a weak
// symbol the linker may pick for every caller; see the top of the file).
size_t element_bytes(DataType dt) {
  switch (dt) {
    case DataType::kInt8: case DataType::kUint8: case DataType::kFp8E4M3: case DataType::kFp8E5M2: return 1;
    case DataType::kFloat16: case DataType::kBfloat16: return 2;
    case DataType::kInt32: case DataType::kUint32: case DataType::kFloat32: return 4;
    case DataType::kInt64: case DataType::kUint64: case DataType::kFloat64: return 8;
  }
  return 1;
}

}  // namespace

bool reduce2_avx2(void* dst, const void* a, const void* b, size_t count, DataType dt, RedOp op) {
  const size_t done = reduce_vector_part(dt, op, dst, a, b, count);
  if (done == kUnsupported) return false;
  if (done < count) {
    const size_t off = done * element_bytes(dt);
    reduce2_scalar(static_cast<char*>(dst) + off, static_cast<const char*>(a) + off,
                   static_cast<const char*>(b) + off, count - done, dt, op);
  }
  return true;
}

void stream_copy_avx2(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  // Head up to a 32-byte aligned destination, then 128 bytes per iteration
  // with streaming stores, then the tail: the ends through memcpy.
  const size_t to_aligned = static_cast<size_t>((32 - reinterpret_cast<uintptr_t>(d) % 32) % 32);
  const size_t head = to_aligned < bytes ? to_aligned : bytes;  // not std::min: see the top of the file
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 128 <= bytes; i += 128) {
    const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i v2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i v3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), v0);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), v1);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 64), v2);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 96), v3);
  }
  // Streaming stores are weakly ordered: fence before anyone is told the
  // bytes are there (a flag store, a FIFO tail).
  _mm_sfence();
  std::memcpy(d + i, s + i, bytes - i);
}

bool divide_avx2(void* dst, const void* src, size_t count, DataType dt, uint64_t n) {
  const size_t done = divide_vector_part(dt, dst, src, count, n);
  if (done == kUnsupported) return false;
  if (done < count) {
    const size_t off = done * element_bytes(dt);
    divide_scalar(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, count - done, dt, n);
  }
  return true;
}

}  // namespace loom::kernels::detail
