// Scaling: dst = src * scalar, element-wise, in the data type. Used where a
// rank's input is pre-multiplied before a sum: the shim's PreMulSum ops, and
// the average of the narrow float types (CommImpl::run_sub), as NCCL does.
// Loom has no fused pre-multiply reduction: the caller scales each rank's
// input into a temporary buffer and reduces that with sum. Integers wrap
// modulo 2^bits (as on the GPU); narrow floats multiply in float and round
// once: the product of two values of any of these types is exact in float,
// so the result equals the narrow type's own multiplication. Conversions are
// the kernels' (round to nearest even, FP8 saturating like NCCL's).
#include <cstring>
#include <type_traits>

#include "kernels/float_conv.h"
#include "kernels/host_reduce.h"

namespace loom::kernels {

namespace {

template <typename T>
T load(const void* p, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const std::byte*>(p) + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
void store(void* p, size_t i, T v) {
  std::memcpy(static_cast<std::byte*>(p) + i * sizeof(T), &v, sizeof(T));
}

template <typename T>
void scale_int(void* dst, const void* src, size_t n, const void* scalar) {
  using U = std::make_unsigned_t<T>;
  const U s = static_cast<U>(load<T>(scalar, 0));
  for (size_t i = 0; i < n; ++i)
    store<T>(dst, i, static_cast<T>(static_cast<U>(static_cast<U>(load<T>(src, i)) * s)));
}

template <typename T>
void scale_native(void* dst, const void* src, size_t n, const void* scalar) {
  const T s = load<T>(scalar, 0);
  for (size_t i = 0; i < n; ++i) store<T>(dst, i, static_cast<T>(load<T>(src, i) * s));
}

template <typename Bits, typename ToFloat, typename FromFloat>
void scale_narrow(void* dst, const void* src, size_t n, const void* scalar, ToFloat to_f,
                  FromFloat from_f) {
  const float s = to_f(load<Bits>(scalar, 0));
  for (size_t i = 0; i < n; ++i) store<Bits>(dst, i, static_cast<Bits>(from_f(to_f(load<Bits>(src, i)) * s)));
}

}  // namespace

void scale(void* dst, const void* src, size_t n, DataType dt, const void* scalar) {
  switch (dt) {
    case DataType::kInt8: return scale_int<int8_t>(dst, src, n, scalar);
    case DataType::kUint8: return scale_int<uint8_t>(dst, src, n, scalar);
    case DataType::kInt32: return scale_int<int32_t>(dst, src, n, scalar);
    case DataType::kUint32: return scale_int<uint32_t>(dst, src, n, scalar);
    case DataType::kInt64: return scale_int<int64_t>(dst, src, n, scalar);
    case DataType::kUint64: return scale_int<uint64_t>(dst, src, n, scalar);
    case DataType::kFloat32: return scale_native<float>(dst, src, n, scalar);
    case DataType::kFloat64: return scale_native<double>(dst, src, n, scalar);
    case DataType::kFloat16: return scale_narrow<uint16_t>(dst, src, n, scalar, fp16_to_float,
                                                      float_to_fp16);
    case DataType::kBfloat16:
      return scale_narrow<uint16_t>(dst, src, n, scalar, bf16_to_float,
                                    float_to_bf16);
    case DataType::kFp8E4M3:
      return scale_narrow<uint8_t>(dst, src, n, scalar, fp8e4m3_to_float,
                                   float_to_fp8e4m3);
    case DataType::kFp8E5M2:
      return scale_narrow<uint8_t>(dst, src, n, scalar, fp8e5m2_to_float,
                                   float_to_fp8e5m2);
  }
}


bool avg_premultiplies(DataType dt) {
  return dt == DataType::kFloat16 || dt == DataType::kBfloat16 || dt == DataType::kFp8E4M3 || dt == DataType::kFp8E5M2;
}

void reciprocal(DataType dt, int n, void* out) {
  const float r = 1.0f / static_cast<float>(n);
  switch (dt) {
    case DataType::kFloat16: store<uint16_t>(out, 0, float_to_fp16(r)); break;
    case DataType::kBfloat16: store<uint16_t>(out, 0, float_to_bf16(r)); break;
    case DataType::kFp8E4M3: store<uint8_t>(out, 0, float_to_fp8e4m3(r)); break;
    case DataType::kFp8E5M2: store<uint8_t>(out, 0, float_to_fp8e5m2(r)); break;
    case DataType::kFloat32: store<float>(out, 0, r); break;
    case DataType::kFloat64: store<double>(out, 0, 1.0 / n); break;
    default: break;  // integers average by a division (divide)
  }
}

}  // namespace loom::kernels
