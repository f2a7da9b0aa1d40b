// FNV-1a, 64 bits: the one string hash of the library (host identities,
// secrets, settings and topologies compared between ranks). Not for
// adversarial input.
#pragma once

#include <cstdint>
#include <string_view>

namespace loom {

inline uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace loom
