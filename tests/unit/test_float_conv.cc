// Conversions of src/kernels/float_conv.h against independent references:
// binary16 against the compiler's _Float16 and the CPU's F16C (all 65536 codes
// one way, boundary-rich samples of floats the other way), bf16 and fp8 against
// a nearest-value search in double precision, plus known values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/float_conv.h"
#include "unit/float_reference.h"

namespace loom::kernels {
namespace {

using testref::bits_float;
using testref::float_bits;

// Floats that exercise every rounding boundary of a small format: each code's
// exact value, its neighbours one float ulp away, the midpoint to the next code
// and the midpoint's float neighbours; plus random bit patterns and specials.
std::vector<float> boundary_sample(testref::SmallFormat fmt, uint32_t num_codes, size_t random_count) {
  std::vector<float> out;
  for (uint32_t c = 0; c + 1 < num_codes; ++c) {
    const double v = testref::small_to_double(fmt, c);
    const double next = testref::small_to_double(fmt, c + 1);
    if (std::isnan(v)) continue;
    const float fv = static_cast<float>(v);
    out.push_back(fv);
    out.push_back(std::nextafter(fv, 0.0f));
    out.push_back(std::nextafter(fv, INFINITY));
    if (!std::isnan(next) && !std::isinf(v)) {
      const float mid = static_cast<float>((v + next) / 2);  // exact when the format is narrow
      out.push_back(mid);
      out.push_back(std::nextafter(mid, 0.0f));
      out.push_back(std::nextafter(mid, INFINITY));
    }
  }
  const size_t structured = out.size();
  for (size_t i = 0; i < structured; ++i) out.push_back(-out[i]);
  std::mt19937 rng(1234);
  for (size_t i = 0; i < random_count; ++i) out.push_back(bits_float(static_cast<uint32_t>(rng())));
  for (float f : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e30f, -1e30f, 1e-30f, -1e-30f,
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min()}) {
    out.push_back(f);
  }
  return out;
}

// ---------------- binary16 ----------------

TEST(Fp16, ToFloatAllCodesMatchFloat16AndF16c) {
  const bool f16c = testref::cpu_has_f16c();
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = fp16_to_float(static_cast<uint16_t>(h));
#if defined(LOOM_TEST_HAVE_FLOAT16)
    const float ref = testref::f16_ref_to_float(static_cast<uint16_t>(h));
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
      ASSERT_EQ(std::signbit(got), std::signbit(ref)) << std::hex << h;
    } else {
      ASSERT_EQ(float_bits(got), float_bits(ref)) << std::hex << h;
    }
#endif
    // The contract promises F16C's exact bits, NaN payloads included.
    if (f16c) {
      ASSERT_EQ(float_bits(got), float_bits(testref::f16c_to_float(static_cast<uint16_t>(h)))) << std::hex << h;
    }
    // Independent decoding by ldexp.
    const double ldexp_ref = testref::small_to_double(testref::kFp16, h);
    if (!std::isnan(ldexp_ref)) {
      ASSERT_EQ(static_cast<double>(got), ldexp_ref) << std::hex << h;
    }
  }
}

TEST(Fp16, FromFloatSampleMatchesFloat16AndF16c) {
  const bool f16c = testref::cpu_has_f16c();
  const std::vector<float> sample = boundary_sample(testref::kFp16, 0x7c01, 2'000'000);
  size_t checked = 0;
  for (float f : sample) {
    const uint16_t got = float_to_fp16(f);
#if defined(LOOM_TEST_HAVE_FLOAT16)
    const uint16_t ref = testref::f16_ref_from_float(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(testref::small_is_nan(testref::kFp16, got)) << f;
    } else {
      ASSERT_EQ(got, ref) << std::hexfloat << f;
    }
#endif
    if (f16c) {
      ASSERT_EQ(got, testref::f16c_from_float(f)) << std::hexfloat << f << " bits " << std::hex << float_bits(f);
    }
    if (!std::isnan(f)) {
      ASSERT_EQ(got, testref::small_from_double(testref::kFp16, f, false)) << std::hexfloat << f;
    }
    ++checked;
  }
  EXPECT_GT(checked, 2'000'000u);
}

TEST(Fp16, KnownValues) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65519.996f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);  // tie rounds to even = inf
  EXPECT_EQ(float_to_fp16(-1e10f), 0xfc00);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: 0
  EXPECT_EQ(float_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: tie to even 2
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_fp16(bits_float(0x7fc00000u)), 0x7e00);
  EXPECT_EQ(float_to_fp16(bits_float(0x7f800001u)), 0x7e00);  // sNaN is quieted, never becomes inf
  EXPECT_EQ(fp16_to_float(0x3555), 0x1.554p-2f);
  EXPECT_EQ(fp16_to_float(0x0400), std::ldexp(1.0f, -14));
  EXPECT_TRUE(std::isinf(fp16_to_float(0xfc00)));
  static_assert(float_to_fp16(0.5f) == 0x3800, "conversions are constexpr");
}

// ---------------- bfloat16 ----------------

TEST(Bf16, ToFloatAllCodes) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = bf16_to_float(static_cast<uint16_t>(h));
    ASSERT_EQ(float_bits(got), float_bits(testref::bf16_ref_to_float(static_cast<uint16_t>(h)))) << std::hex << h;
  }
}

TEST(Bf16, FromFloatSampleMatchesReference) {
  const std::vector<float> sample = boundary_sample(testref::kBf16, 0x7f81, 2'000'000);
  for (float f : sample) {
    ASSERT_EQ(float_to_bf16(f), testref::bf16_ref_from_float(f)) << std::hexfloat << f << " bits " << std::hex << float_bits(f);
  }
}

TEST(Bf16, KnownValues) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(bits_float(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(bits_float(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(float_to_bf16(bits_float(0x3f808001u)), 0x3f81);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(float_to_bf16(bits_float(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(float_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(float_to_bf16(bits_float(0x7f800001u)), 0x7fc0);  // sNaN quieted, not inf
  EXPECT_EQ(float_to_bf16(bits_float(0xffffffffu)), 0xffff);
  EXPECT_EQ(float_to_bf16(bits_float(0x00008000u)), 0x0000);  // subnormal tie to even
  EXPECT_EQ(float_to_bf16(bits_float(0x00018000u)), 0x0002);
}

// ---------------- fp8 ----------------

struct Fp8Case {
  const char* name;
  testref::SmallFormat fmt;
  float (*decode)(uint8_t);
  uint8_t (*encode)(float);
  uint8_t max_code;
};

const Fp8Case kFp8Cases[] = {
    {"e4m3", testref::kE4M3, fp8e4m3_to_float, float_to_fp8e4m3, 0x7e},
    {"e5m2", testref::kE5M2, fp8e5m2_to_float, float_to_fp8e5m2, 0x7b},
};

TEST(Fp8, DecodeAllCodesAndRoundTrip) {
  for (const Fp8Case& c : kFp8Cases) {
    SCOPED_TRACE(c.name);
    for (uint32_t v = 0; v < 256; ++v) {
      const uint8_t code = static_cast<uint8_t>(v);
      const float got = c.decode(code);
      const double ref = testref::small_to_double(c.fmt, v);
      if (std::isnan(ref)) {
        ASSERT_TRUE(std::isnan(got)) << v;
        ASSERT_EQ(std::signbit(got), (v & 0x80) != 0) << v;
        ASSERT_EQ(c.encode(got), 0x7f) << v;  // NaN encodes as 0x7f, sign dropped (CUDA)
        continue;
      }
      ASSERT_EQ(static_cast<double>(got), ref) << v;
      ASSERT_EQ(std::signbit(got), (v & 0x80) != 0) << v;
      const uint8_t back = c.encode(got);
      if (std::isinf(ref)) {
        ASSERT_EQ(back, (v & 0x80) | c.max_code) << v;  // satfinite: inf -> max
      } else {
        ASSERT_EQ(back, code) << v;
      }
    }
  }
}

TEST(Fp8, EncodeSampleMatchesNearestSearch) {
  for (const Fp8Case& c : kFp8Cases) {
    SCOPED_TRACE(c.name);
    const std::vector<float> sample = boundary_sample(c.fmt, 256, 300'000);
    for (float f : sample) {
      ASSERT_EQ(c.encode(f), testref::fp8_ref_from_float(c.fmt, f)) << std::hexfloat << f;
    }
  }
}

TEST(Fp8, E4M3KnownValuesAndSaturation) {
  EXPECT_EQ(fp8e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(fp8e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3_to_float(0xfe), -448.0f);
  EXPECT_EQ(fp8e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(fp8e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(fp8e4m3_to_float(0xff)));
  EXPECT_FALSE(std::isnan(fp8e4m3_to_float(0x78)));  // 256: exponent all ones is finite here
  EXPECT_EQ(fp8e4m3_to_float(0x78), 256.0f);
  EXPECT_EQ(float_to_fp8e4m3(448.0f), 0x7e);
  EXPECT_EQ(float_to_fp8e4m3(464.0f), 0x7e);
  EXPECT_EQ(float_to_fp8e4m3(1e6f), 0x7e);
  EXPECT_EQ(float_to_fp8e4m3(-1e6f), 0xfe);
  EXPECT_EQ(float_to_fp8e4m3(INFINITY), 0x7e);
  EXPECT_EQ(float_to_fp8e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(float_to_fp8e4m3(NAN), 0x7f);
  EXPECT_EQ(float_to_fp8e4m3(std::ldexp(1.0f, -10)), 0x00);   // half the min subnormal: tie to 0
  EXPECT_EQ(float_to_fp8e4m3(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(float_to_fp8e4m3(-std::ldexp(1.0f, -12)), 0x80);  // underflow keeps the sign
  EXPECT_EQ(float_to_fp8e4m3(1.0625f), 0x38);                 // tie between 1.0 and 1.125 -> even
  EXPECT_EQ(float_to_fp8e4m3(1.1875f), 0x3a);                 // tie between 1.125 and 1.25 -> even
}

TEST(Fp8, E5M2KnownValuesAndSaturation) {
  EXPECT_EQ(fp8e5m2_to_float(0x3c), 1.0f);
  EXPECT_EQ(fp8e5m2_to_float(0x7b), 57344.0f);
  EXPECT_EQ(fp8e5m2_to_float(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(fp8e5m2_to_float(0x04), std::ldexp(1.0f, -14));
  EXPECT_TRUE(std::isinf(fp8e5m2_to_float(0x7c)));
  EXPECT_TRUE(std::isinf(fp8e5m2_to_float(0xfc)));
  for (uint8_t v : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff}) EXPECT_TRUE(std::isnan(fp8e5m2_to_float(v))) << int(v);
  EXPECT_EQ(float_to_fp8e5m2(57344.0f), 0x7b);
  EXPECT_EQ(float_to_fp8e5m2(61440.0f), 0x7b);
  EXPECT_EQ(float_to_fp8e5m2(1e9f), 0x7b);
  EXPECT_EQ(float_to_fp8e5m2(INFINITY), 0x7b);
  EXPECT_EQ(float_to_fp8e5m2(-INFINITY), 0xfb);
  EXPECT_EQ(float_to_fp8e5m2(NAN), 0x7f);
  EXPECT_EQ(float_to_fp8e5m2(1.125f), 0x3c);  // tie between 1.0 and 1.25 -> even
  EXPECT_EQ(float_to_fp8e5m2(1.375f), 0x3e);  // tie between 1.25 and 1.5 -> even
}

}  // namespace
}  // namespace loom::kernels
