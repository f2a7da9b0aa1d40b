// Training text and batches. The vocabulary is bytes, so the text is the
// token stream. Batches are drawn from a per-step random stream that any rank
// can recreate, so every rank agrees on the global batch without talking.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/status.h"

namespace loom::harness {

// Ships with Debian's base-files on every machine.
inline constexpr const char* kDefaultText = "/usr/share/common-licenses/GPL-3";

Result<std::vector<uint8_t>> load_text(const std::string& path);

struct Batch {
  int b = 0, t = 0;
  std::vector<int> inputs, targets;  // [b*t]; targets are inputs shifted by one
};

// The global batch of `step`: b windows of t+1 bytes at random offsets.
Batch global_batch(const std::vector<uint8_t>& text, uint64_t seed, int step, int b, int t);

// Sequences [first, first+count) of a batch.
Batch slice_batch(const Batch& batch, int first, int count);

}  // namespace loom::harness
