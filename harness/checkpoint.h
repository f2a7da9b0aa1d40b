// Checkpoint file: the model shape and the full model's weights in canonical
// (single-rank) order, so any tp/pp layout can save and load it.
//
// Format (little-endian): "LOOMGPT1", int32 vocab, ctx, layers, dim, heads,
// int32 step, int64 count, count float32 values.
#pragma once

#include <string>
#include <vector>

#include "harness/model.h"
#include "loom/status.h"

namespace loom::harness {

struct Checkpoint {
  ModelConfig config;
  int step = 0;
  std::vector<float> params;  // canonical layout, full_param_count(config) values
};

Status save_checkpoint(const std::string& path, const Checkpoint& ckpt);
Result<Checkpoint> load_checkpoint(const std::string& path);

}  // namespace loom::harness
