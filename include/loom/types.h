// Data types and reduction operators. Numeric values equal NCCL 2.28's
// ncclDataType_t / ncclRedOp_t so the shim converts by cast.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace loom {

enum class DataType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
  kFp8E4M3 = 10,
  kFp8E5M2 = 11,
};
inline constexpr int kNumDataTypes = 12;

enum class RedOp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4 };
inline constexpr int kNumRedOps = 5;

enum class Collective : int {
  kAllReduce = 0,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kAllToAll,
  kSendRecv,  // a group of point-to-point sends and receives
};
inline constexpr int kNumCollectives = 7;

// Inline: asked several times per operation on the per-op path.
constexpr bool is_valid(DataType dt) { return static_cast<int>(dt) >= 0 && static_cast<int>(dt) < kNumDataTypes; }
constexpr bool is_valid(RedOp op) { return static_cast<int>(op) >= 0 && static_cast<int>(op) < kNumRedOps; }
// Size in bytes of one element; 0 for an invalid type.
constexpr size_t dtype_size(DataType dt) {
  constexpr unsigned char kBytes[kNumDataTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return is_valid(dt) ? kBytes[static_cast<int>(dt)] : 0;
}
bool is_floating(DataType dt);
const char* dtype_name(DataType dt);   // "float32", "bfloat16", "fp8_e4m3", ...
const char* redop_name(RedOp op);      // "sum", "prod", ...
const char* collective_name(Collective c);  // "allreduce", "broadcast", ...
std::optional<DataType> parse_dtype(std::string_view s);  // also accepts nccl-tests names ("float", "half", "bfloat16", "int8", ...)
std::optional<RedOp> parse_redop(std::string_view s);
std::optional<Collective> parse_collective(std::string_view s);

}  // namespace loom
