/*
 * Closed-form data for nccl_functional.c: element codecs for all 12 NCCL
 * types (exact values only), the inputs each rank contributes, and the
 * expected results, computed from (rank, index) alone.
 *
 * Reduction inputs are 1 or 2, so every partial sum (<= 8), product (a power
 * of two <= 16) and average (a multiple of 1/4) is exact even in FP8 E5M2:
 * any reduction order must give exactly the closed form.
 */
#ifndef LOOM_FUNCTIONAL_DATA_H_
#define LOOM_FUNCTIONAL_DATA_H_

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static size_t dtype_size(int t) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return sizes[t];
}

static const char* dtype_label(int t) {
  static const char* names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                                "float16", "float32", "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};
  return names[t];
}

static const char* op_label(int op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return names[op];
}

/* Small float with `eb` exponent and `mb` mantissa bits (IEEE layout), for
 * values that are exactly representable (checked by self_test_encoding). */
static uint32_t enc_mini(double v, int eb, int mb) {
  int bias = (1 << (eb - 1)) - 1;
  uint32_t sign = v < 0 ? 1u : 0u;
  v = fabs(v);
  if (v == 0) return sign << (eb + mb);
  int e;
  (void)frexp(v, &e);
  e -= 1; /* v = 1.m * 2^e */
  if (e < 1 - bias) return (sign << (eb + mb)) | (uint32_t)ldexp(v, bias - 1 + mb);
  uint32_t man = (uint32_t)ldexp(v, mb - e) - (1u << mb);
  return (sign << (eb + mb)) | ((uint32_t)(e + bias) << mb) | man;
}

static double dec_mini(uint32_t b, int eb, int mb) {
  int bias = (1 << (eb - 1)) - 1;
  int sign = (b >> (eb + mb)) & 1;
  uint32_t e = (b >> mb) & ((1u << eb) - 1), m = b & ((1u << mb) - 1);
  double v = e == 0 ? ldexp((double)m, 1 - bias - mb) : ldexp((double)(m | (1u << mb)), (int)e - bias - mb);
  return sign ? -v : v;
}

static void put_value(int t, void* buf, size_t i, double v) {
  unsigned char* p = (unsigned char*)buf + i * dtype_size(t);
  switch (t) {
    case 0: { int8_t x = (int8_t)v; memcpy(p, &x, 1); break; }
    case 1: { uint8_t x = (uint8_t)v; memcpy(p, &x, 1); break; }
    case 2: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
    case 3: { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); break; }
    case 4: { int64_t x = (int64_t)v; memcpy(p, &x, 8); break; }
    case 5: { uint64_t x = (uint64_t)v; memcpy(p, &x, 8); break; }
    case 6: { uint16_t x = (uint16_t)enc_mini(v, 5, 10); memcpy(p, &x, 2); break; }
    case 7: { float x = (float)v; memcpy(p, &x, 4); break; }
    case 8: { memcpy(p, &v, 8); break; }
    case 9: { float f = (float)v; uint32_t u; memcpy(&u, &f, 4); uint16_t x = (uint16_t)(u >> 16); memcpy(p, &x, 2); break; }
    case 10: { uint8_t x = (uint8_t)enc_mini(v, 4, 3); memcpy(p, &x, 1); break; }
    case 11: { uint8_t x = (uint8_t)enc_mini(v, 5, 2); memcpy(p, &x, 1); break; }
  }
}

static double get_value(int t, const void* buf, size_t i) {
  const unsigned char* p = (const unsigned char*)buf + i * dtype_size(t);
  switch (t) {
    case 0: { int8_t x; memcpy(&x, p, 1); return x; }
    case 1: { uint8_t x; memcpy(&x, p, 1); return x; }
    case 2: { int32_t x; memcpy(&x, p, 4); return x; }
    case 3: { uint32_t x; memcpy(&x, p, 4); return x; }
    case 4: { int64_t x; memcpy(&x, p, 8); return (double)x; }
    case 5: { uint64_t x; memcpy(&x, p, 8); return (double)x; }
    case 6: { uint16_t x; memcpy(&x, p, 2); return dec_mini(x, 5, 10); }
    case 7: { float x; memcpy(&x, p, 4); return x; }
    case 8: { double x; memcpy(&x, p, 8); return x; }
    case 9: { uint16_t x; memcpy(&x, p, 2); uint32_t u = (uint32_t)x << 16; float f; memcpy(&f, &u, 4); return f; }
    case 10: { uint8_t x; memcpy(&x, p, 1); return dec_mini(x, 4, 3); }
    case 11: { uint8_t x; memcpy(&x, p, 1); return dec_mini(x, 5, 2); }
  }
  return NAN;
}

static int is_integer_type(int t) { return t <= 5; }

/* Rank r's reduction input at index i: 1 or 2, mixing rank and index. */
static double red_input(int r, size_t i) { return 1.0 + (double)(((size_t)r * 7 + i * 3) >> 1 & 1); }

static double red_expected(int t, int op, int nranks, size_t i) {
  double sum = 0, prod = 1, mx = -1e300, mn = 1e300;
  for (int r = 0; r < nranks; ++r) {
    double x = red_input(r, i);
    sum += x;
    prod *= x;
    mx = x > mx ? x : mx;
    mn = x < mn ? x : mn;
  }
  switch (op) {
    case 0: return sum;
    case 1: return prod;
    case 2: return mx;
    case 3: return mn;
    default: /* avg: integers divide the sum (truncating), floats are exact */
      return is_integer_type(t) ? (double)((long long)sum / nranks) : sum / nranks;
  }
}

/* PreMulSum: rank r scales by s_r. FP8 keeps every partial sum <= 6 (exact
 * in E5M2) with inputs of 1 and scalars of 1 or 2; the rest use r+1. */
static int is_fp8(int t) { return t == 10 || t == 11; }
static double premul_scalar(int t, int r) { return is_fp8(t) ? 1.0 + (r % 2) : (double)(r + 1); }
static double premul_input(int t, int r, size_t i) { return is_fp8(t) ? 1.0 : red_input(r, i); }
static double premul_expected(int t, int nranks, size_t i) {
  double sum = 0;
  for (int r = 0; r < nranks; ++r) sum += premul_scalar(t, r) * premul_input(t, r, i);
  return sum;
}

/* Data-movement pattern: byte k of rank r's buffer. */
static unsigned char pattern_byte(int r, size_t k) {
  return (unsigned char)((size_t)r * 73 + k * 7 + (k >> 8) * 13 + 1);
}

/* The codecs must round-trip every value the test uses. */
static int self_test_encoding(void) {
  static const double values[] = {0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20};
  for (int t = 0; t < 12; ++t)
    for (size_t k = 0; k < sizeof values / sizeof values[0]; ++k) {
      double v = values[k];
      if (is_integer_type(t) && v != floor(v)) continue;
      if (is_fp8(t) && v > 8 && v != 10 && v != 12 && v != 16) continue; /* not used for FP8 */
      unsigned char buf[8];
      put_value(t, buf, 0, v);
      if (get_value(t, buf, 0) != v) {
        fprintf(stderr, "FAIL: codec %s does not round-trip %g (got %g)\n", dtype_label(t), v, get_value(t, buf, 0));
        return 1;
      }
    }
  return 0;
}

#endif
