// Scalar conversions between float and the 16- and 8-bit floating types that
// collectives carry (IEEE binary16, bfloat16, OCP FP8 E4M3 and E5M2).
//
// Contract (all conversions from float round to nearest, ties to even):
//  - fp16: IEEE binary16. Overflow rounds to +-inf. NaN stays NaN; the NaN is
//    quieted and keeps its top payload bits, exactly like x86 F16C
//    (vcvtph2ps / vcvtps2ph), so the SIMD and scalar reduction paths agree bit
//    for bit.
//  - bf16: the top 16 bits of a float. NaN is quieted (bit 6 set) and keeps its
//    top payload bits; sNaN bf16 -> float is a plain shift (not quieted).
//  - fp8 E4M3 ("E4M3FN"): bias 7, no infinities, NaN = 0x7f / 0xff, max 448.
//  - fp8 E5M2: bias 15, IEEE-like (inf = 0x7c / 0xfc), max finite 57344.
//  - float -> fp8 saturates like CUDA's __NV_SATFINITE, which NCCL uses: any
//    value beyond the largest finite magnitude (infinities included) becomes
//    +-max; NaN becomes 0x7f (sign dropped, as CUDA does). Underflow keeps the
//    sign (-0).
//  - fp8 -> float returns a quiet NaN with the input's sign for NaN codes.
//
// The functions are inline and constexpr because the scalar reduction loops
// call them per element. Do not call them from translation units compiled with
// -mavx2 (see host_reduce_avx2.cc): an out-of-line copy emitted there could be
// picked by the linker for every caller and crash CPUs without AVX2.
#pragma once

#include <bit>
#include <cstdint>

namespace loom::kernels {

namespace conv_detail {

// Rounds a finite, non-negative float (given as its bits, below the format's
// overflow threshold) to a small float format with kExpBits exponent bits and
// kManBits mantissa bits (IEEE layout, bias 2^(kExpBits-1)-1). Returns the
// magnitude code; subnormal results included.
template <int kExpBits, int kManBits>
constexpr uint32_t round_magnitude(uint32_t abs_bits) {
  constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  constexpr int kDrop = 23 - kManBits;  // float mantissa bits that go away
  // Biased float exponent of the format's smallest normal number.
  constexpr uint32_t kMinNormalExp = 127 - kBias + 1;
  const uint32_t exp = abs_bits >> 23;
  if (exp >= kMinNormalExp) {
    // Normal result: round the mantissa in place; a carry moves into the
    // exponent field, which is exactly what rounding up to the next binade needs.
    const uint32_t rounded = abs_bits + ((1u << (kDrop - 1)) - 1) + ((abs_bits >> kDrop) & 1);
    return (rounded >> kDrop) - (static_cast<uint32_t>(127 - kBias) << kManBits);
  }
  if (exp == 0) return 0;  // float zero or subnormal: far below any result
  // Subnormal result: count units of the smallest subnormal 2^(1-bias-man).
  const uint32_t mant = (abs_bits & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 150 + 1 - kBias - kManBits - exp;  // >= kDrop + 1
  if (shift >= 25) return 0;  // below half the smallest subnormal (mant < 2^24)
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) ++q;  // may become the min normal: correct
  return q;
}

// Small float magnitude code (no sign, not inf/NaN) -> float bits.
template <int kExpBits, int kManBits>
constexpr uint32_t magnitude_to_float_bits(uint32_t code) {
  constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  const uint32_t exp = code >> kManBits;
  uint32_t man = code & ((1u << kManBits) - 1);
  if (exp != 0) {
    return ((exp - kBias + 127) << 23) | (man << (23 - kManBits));
  }
  if (man == 0) return 0;
  // Subnormal: normalise so the leading one becomes the implicit bit.
  const int lead = std::bit_width(man) - 1;  // position of the leading one
  const uint32_t float_exp = static_cast<uint32_t>(127 + 1 - kBias - kManBits + lead);
  man &= ~(1u << lead);
  return (float_exp << 23) | (man << (23 - lead));
}

}  // namespace conv_detail

// ---- IEEE binary16 ----

constexpr float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) {
    // inf stays inf; NaN is quieted and keeps its payload (as F16C does).
    const uint32_t quiet = man != 0 ? 0x400000u : 0u;
    return std::bit_cast<float>(sign | 0x7f800000u | quiet | (man << 13));
  }
  return std::bit_cast<float>(sign | conv_detail::magnitude_to_float_bits<5, 10>(h & 0x7fffu));
}

constexpr uint16_t float_to_fp16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  // 65520 = 65504 + half an ulp: ties go to the even neighbour, which is 2^16 = inf.
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  return static_cast<uint16_t>(sign | conv_detail::round_magnitude<5, 10>(abs));
}

// ---- bfloat16 ----

constexpr float bf16_to_float(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

constexpr uint16_t float_to_bf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  // Round to nearest even on the low 16 bits; a carry out of the mantissa
  // bumps the exponent, and the largest floats correctly round to inf.
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// ---- fp8 E4M3 (no inf; NaN = S.1111.111) ----

inline constexpr uint8_t kFp8E4M3MaxCode = 0x7e;  // 448
inline constexpr uint8_t kFp8E5M2MaxCode = 0x7b;  // 57344
inline constexpr uint8_t kFp8NaNCode = 0x7f;      // what float->fp8 yields for NaN

constexpr float fp8e4m3_to_float(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  if ((v & 0x7fu) == 0x7fu) return std::bit_cast<float>(sign | 0x7fc00000u);
  return std::bit_cast<float>(sign | conv_detail::magnitude_to_float_bits<4, 3>(v & 0x7fu));
}

constexpr uint8_t float_to_fp8e4m3(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return kFp8NaNCode;
  // Saturate: everything at or beyond 448 (the largest finite value) is 448.
  if (abs >= 0x43e00000u) return static_cast<uint8_t>(sign | kFp8E4M3MaxCode);
  return static_cast<uint8_t>(sign | conv_detail::round_magnitude<4, 3>(abs));
}

// ---- fp8 E5M2 (IEEE-like: inf = S.11111.00, NaN = S.11111.{01,10,11}) ----

constexpr float fp8e5m2_to_float(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t mag = v & 0x7fu;
  if (mag == 0x7c) return std::bit_cast<float>(sign | 0x7f800000u);
  if (mag > 0x7c) return std::bit_cast<float>(sign | 0x7fc00000u);
  return std::bit_cast<float>(sign | conv_detail::magnitude_to_float_bits<5, 2>(mag));
}

constexpr uint8_t float_to_fp8e5m2(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return kFp8NaNCode;
  // Saturate (satfinite): at or beyond 57344 (infinities included) -> 57344.
  if (abs >= 0x47600000u) return static_cast<uint8_t>(sign | kFp8E5M2MaxCode);
  return static_cast<uint8_t>(sign | conv_detail::round_magnitude<5, 2>(abs));
}

}  // namespace loom::kernels
