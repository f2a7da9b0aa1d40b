/*
 * Shared by abi_check.c and abi_check.cc: expands abi_items.h against Loom's
 * nccl.h and the REAL_* values generated from NVIDIA's. Compile-time items
 * are static assertions (the build fails on a mismatch); run-time items are
 * counted and reported by main().
 */
#ifndef LOOM_ABI_CHECK_H_
#define LOOM_ABI_CHECK_H_

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "abi_items.h"
#include "abi_real.h"

#ifdef __cplusplus
#define LOOM_STATIC_ASSERT static_assert
#define LOOM_ALIGNOF alignof
#else
#define LOOM_STATIC_ASSERT _Static_assert
#define LOOM_ALIGNOF _Alignof
#endif

#define CHECK_SIZE(type) \
  LOOM_STATIC_ASSERT(sizeof(type) == REAL_SIZE_##type, "sizeof(" #type ") differs from NCCL");
#define CHECK_ALIGN(type) \
  LOOM_STATIC_ASSERT(LOOM_ALIGNOF(type) == REAL_ALIGN_##type, "alignof(" #type ") differs from NCCL");
#define CHECK_OFFSET(type, field)                                      \
  LOOM_STATIC_ASSERT(offsetof(type, field) == REAL_OFFSET_##type##__##field, \
                     "offsetof(" #type ", " #field ") differs from NCCL");
#define CHECK_VALUE(name) \
  LOOM_STATIC_ASSERT((long long)(name) == REAL_VALUE_##name, #name " differs from NCCL");
#define CHECK_EXPR(id, expr) \
  LOOM_STATIC_ASSERT((long long)(expr) == REAL_EXPR_##id, #id " differs from NCCL");
#define CHECK_NOTHING_1(a)
#define CHECK_NOTHING_2(a, b)
#define CHECK_NOTHING_3(a, b, c)

/* Compile-time part. */
LOOM_ABI_ITEMS(CHECK_SIZE, CHECK_ALIGN, CHECK_OFFSET, CHECK_VALUE, CHECK_EXPR, CHECK_NOTHING_2,
               CHECK_NOTHING_3, CHECK_NOTHING_1, CHECK_NOTHING_1)

static int loom_abi_failures = 0;
static int loom_abi_checked = 0;

static void loom_abi_report(int ok, const char* what) {
  ++loom_abi_checked;
  if (!ok) {
    ++loom_abi_failures;
    fprintf(stderr, "ABI MISMATCH: %s\n", what);
  }
}

#define RUN_RUNTIME(id, expr) loom_abi_report((double)(expr) == REAL_RUNTIME_##id, #id);
#define RUN_INIT(type, init, field)                                                          \
  {                                                                                          \
    type v = init;                                                                           \
    long long bits = 0;                                                                      \
    memcpy(&bits, &v.field, sizeof(v.field) < sizeof bits ? sizeof(v.field) : sizeof bits); \
    loom_abi_report(bits == REAL_INIT_##type##__##field, #init "." #field);                  \
  }
#define RUN_STRING(name) loom_abi_report(strcmp(name, REAL_STRING_##name) == 0, #name);

/* Run-time part shared by C and C++ (function types are checked in C++). */
static void loom_abi_run_common(void) {
  LOOM_ABI_ITEMS(CHECK_NOTHING_1, CHECK_NOTHING_1, CHECK_NOTHING_2, CHECK_NOTHING_1,
                 CHECK_NOTHING_2, RUN_RUNTIME, RUN_INIT, CHECK_NOTHING_1, RUN_STRING)
}

#endif
