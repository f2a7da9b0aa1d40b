#include "loom/types.h"

#include <algorithm>
#include <array>
#include <string>

namespace loom {
namespace {

struct DtypeInfo {
  DataType dt;
  size_t size;
  bool floating;
  const char* name;
};

constexpr std::array<DtypeInfo, kNumDataTypes> kDtypes = {{
    {DataType::kInt8, 1, false, "int8"},
    {DataType::kUint8, 1, false, "uint8"},
    {DataType::kInt32, 4, false, "int32"},
    {DataType::kUint32, 4, false, "uint32"},
    {DataType::kInt64, 8, false, "int64"},
    {DataType::kUint64, 8, false, "uint64"},
    {DataType::kFloat16, 2, true, "float16"},
    {DataType::kFloat32, 4, true, "float32"},
    {DataType::kFloat64, 8, true, "float64"},
    {DataType::kBfloat16, 2, true, "bfloat16"},
    {DataType::kFp8E4M3, 1, true, "fp8_e4m3"},
    {DataType::kFp8E5M2, 1, true, "fp8_e5m2"},
}};

constexpr std::array<const char*, kNumRedOps> kRedops = {"sum", "prod", "max", "min", "avg"};
constexpr std::array<const char*, kNumCollectives> kCollectives = {
    "allreduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "sendrecv"};

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

// The inline dtype_size (types.h) and this table must agree.
constexpr bool sizes_agree() {
  for (const auto& d : kDtypes)
    if (dtype_size(d.dt) != d.size) return false;
  return true;
}
static_assert(sizes_agree(), "dtype_size in loom/types.h disagrees with kDtypes");

}  // namespace

bool is_floating(DataType dt) { return is_valid(dt) && kDtypes[static_cast<int>(dt)].floating; }
const char* dtype_name(DataType dt) { return is_valid(dt) ? kDtypes[static_cast<int>(dt)].name : "invalid"; }
const char* redop_name(RedOp op) { return is_valid(op) ? kRedops[static_cast<int>(op)] : "invalid"; }
const char* collective_name(Collective c) {
  int i = static_cast<int>(c);
  return (i >= 0 && i < kNumCollectives) ? kCollectives[i] : "invalid";
}

std::optional<DataType> parse_dtype(std::string_view s) {
  std::string l = lower(s);
  for (const auto& d : kDtypes)
    if (l == d.name) return d.dt;
  // nccl-tests / NCCL spellings
  if (l == "char") return DataType::kInt8;
  if (l == "int") return DataType::kInt32;
  if (l == "half" || l == "fp16") return DataType::kFloat16;
  if (l == "float" || l == "fp32") return DataType::kFloat32;
  if (l == "double" || l == "fp64") return DataType::kFloat64;
  if (l == "bf16") return DataType::kBfloat16;
  if (l == "f8e4m3" || l == "e4m3" || l == "float8e4m3") return DataType::kFp8E4M3;
  if (l == "f8e5m2" || l == "e5m2" || l == "float8e5m2") return DataType::kFp8E5M2;
  return std::nullopt;
}

std::optional<RedOp> parse_redop(std::string_view s) {
  std::string l = lower(s);
  for (int i = 0; i < kNumRedOps; ++i)
    if (l == kRedops[i]) return static_cast<RedOp>(i);
  return std::nullopt;
}

std::optional<Collective> parse_collective(std::string_view s) {
  std::string l = lower(s);
  l.erase(std::remove(l.begin(), l.end(), '_'), l.end());
  for (int i = 0; i < kNumCollectives; ++i) {
    std::string name = kCollectives[i];
    name.erase(std::remove(name.begin(), name.end(), '_'), name.end());
    if (l == name) return static_cast<Collective>(i);
  }
  if (l == "alltoall") return Collective::kAllToAll;
  if (l == "bcast") return Collective::kBroadcast;
  return std::nullopt;
}

}  // namespace loom
