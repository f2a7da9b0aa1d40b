#include "harness/data.h"

#include <cerrno>
#include <fstream>
#include <iterator>

#include "harness/rng.h"

namespace loom::harness {

Result<std::vector<uint8_t>> load_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return system_error("cannot open training text " + path, errno);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 2) return invalid_argument("training text " + path + " is too short");
  return bytes;
}

Batch global_batch(const std::vector<uint8_t>& text, uint64_t seed, int step, int b, int t) {
  Batch batch;
  batch.b = b;
  batch.t = t;
  batch.inputs.resize(static_cast<size_t>(b) * t);
  batch.targets.resize(static_cast<size_t>(b) * t);
  Pcg32 rng(mix_seed(seed, 0xda7a0000ULL + static_cast<uint64_t>(step)));
  const auto span = static_cast<uint32_t>(text.size() > static_cast<size_t>(t) + 1 ? text.size() - t - 1 : 1);
  for (int i = 0; i < b; ++i) {
    const size_t off = rng.below(span);
    for (int j = 0; j < t; ++j) {
      batch.inputs[static_cast<size_t>(i) * t + j] = text[(off + j) % text.size()];
      batch.targets[static_cast<size_t>(i) * t + j] = text[(off + j + 1) % text.size()];
    }
  }
  return batch;
}

Batch slice_batch(const Batch& batch, int first, int count) {
  Batch s;
  s.b = count;
  s.t = batch.t;
  const size_t lo = static_cast<size_t>(first) * batch.t, hi = lo + static_cast<size_t>(count) * batch.t;
  s.inputs.assign(batch.inputs.begin() + lo, batch.inputs.begin() + hi);
  s.targets.assign(batch.targets.begin() + lo, batch.targets.begin() + hi);
  return s;
}

}  // namespace loom::harness
