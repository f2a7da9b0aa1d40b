// Host (CPU) element-wise reductions: the arithmetic inside every host
// allreduce / reduce_scatter / reduce step. Memory-bandwidth bound; an AVX2
// path is chosen at run time when the CPU has AVX2 + F16C + FMA, with a
// portable scalar path for everything else (and for the tails).
//
// Semantics follow NCCL:
//  - Integer sum and prod wrap modulo 2^bits (signed types too: the arithmetic
//    is done on the unsigned representation, so there is no UB).
//  - fp16 / bf16 / fp8: each reduce2 converts both inputs to float, applies the
//    operator in float and rounds the result back once (round to nearest even;
//    fp8 saturates to its largest finite value). Accumulating N ranks therefore
//    rounds once per pairwise step, as NCCL does.
//  - float / double: ordinary IEEE arithmetic in that precision. sum and prod
//    of two NaNs give a's NaN (quieted) on every path; of one NaN, that one.
//  - max / min on floating types: the ordinary comparison (a > b ? a : b,
//    a < b ? a : b), except that NaN propagates: if either input is NaN the
//    result is NaN (a's NaN when a is NaN, otherwise b's). This differs from
//    NCCL's fmaxf-based max, which drops a NaN when the other input is a number;
//    a NaN gradient should surface rather than vanish depending on ring order.
//    For +0 vs -0 the result is b (both compare equal).
//  - kAvg reduces as kSum; the division happens once at the end via divide(),
//    except for fp16 / bf16 / fp8, which NCCL averages by pre-multiplying
//    each input by T(1/n) and summing (avg_premultiplies, scale, reciprocal):
//    their sums overflow or saturate long before the division.
//
// Pointers need no particular alignment (not even element alignment). dst may
// alias a or b (or src) exactly, never partially. count == 0 does nothing (null
// pointers are then fine). No function here allocates, locks or throws.
// An invalid DataType / RedOp is a caller bug; the call then does nothing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/float_conv.h"
#include "loom/types.h"

namespace loom::kernels {

// dst[i] = a[i] OP b[i] for i < count.
void reduce2(void* dst, const void* a, const void* b, size_t count, DataType dt, RedOp op);

// dst[i] = src[i] / n. Integer types: C++ integer division (signed values
// truncate toward zero). fp16 / bf16 / fp8: float(src) / float(n), rounded back
// to the type. float: float division by float(n); double: double division.
// n must be >= 1; n == 0 copies src for integer types and gives inf/NaN for
// floating types (no UB, no trap).
void divide(void* dst, const void* src, size_t count, DataType dt, uint64_t n);

// Generic element access for tests and tools (slow; not for hot loops).
double load_element(const void* base, size_t index, DataType dt);
// Stores value rounded to the type: floating types via float (so fp16/bf16/fp8
// round like the float->type conversions above; double stores exactly). Integer
// types take the value truncated toward zero and wrapped modulo 2^bits; NaN
// stores 0 and values beyond +-2^64 are unspecified (but not UB).
void store_element(void* base, size_t index, DataType dt, double value);

// memcpy for large copies whose destination is not read again soon: the
// bulk goes with non-temporal (streaming) stores, which skip reading each
// destination line into the cache first (a third of the memory traffic of a
// copy that misses the cache). dst and src must not overlap. Without AVX2 it
// is memcpy.
void stream_copy(void* dst, const void* src, size_t bytes);

// "avx2" or "scalar": the path reduce2/divide use on this machine, for logs.
const char* reduce_isa();

// Entry points of the individual paths, for tests that compare them bit for bit.
namespace detail {

void reduce2_scalar(void* dst, const void* a, const void* b, size_t count, DataType dt, RedOp op);
void divide_scalar(void* dst, const void* src, size_t count, DataType dt, uint64_t n);

// True when this build contains the AVX2 kernels (x86 and a compiler with -mavx2).
bool avx2_compiled();
// True when this build has the AVX2 kernels and the CPU can run them.
bool avx2_usable();

// The AVX2 path; returns false (and does nothing) when it has no kernel for
// (dt, op), in which case the scalar path is the implementation. Must only be
// called when avx2_usable().
bool reduce2_avx2(void* dst, const void* a, const void* b, size_t count, DataType dt, RedOp op);
bool divide_avx2(void* dst, const void* src, size_t count, DataType dt, uint64_t n);
void stream_copy_avx2(void* dst, const void* src, size_t bytes);

}  // namespace detail

// dst[i] = src[i] * scalar (one element of dt at `scalar`) in the type's own
// arithmetic: integers wrap, the 16- and 8-bit float types multiply in float
// and round once (round to nearest even, fp8 saturating). dst may be src.
void scale(void* dst, const void* src, size_t count, DataType dt, const void* scalar);

// True for the types whose average is a sum of inputs pre-multiplied by
// T(1/n), as NCCL computes it (fp16, bf16, fp8): their sum of n inputs
// overflows (fp16 4 x 30000) or saturates (e4m3 4 x 256) before a division.
bool avg_premultiplies(DataType dt);
// Writes T(1/n), one element of dt, to out (floating types only).
void reciprocal(DataType dt, int n, void* out);

}  // namespace loom::kernels
