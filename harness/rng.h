// A small, fully specified random number generator (PCG32, O'Neill 2014) and
// the distributions the harness needs. std:: distributions are avoided on
// purpose: their output differs between standard libraries, and the golden
// tests need every rank and every build to draw the same numbers.
#pragma once

#include <cmath>
#include <cstdint>

namespace loom::harness {

class Pcg32 {
 public:
  explicit Pcg32(uint64_t seed, uint64_t stream = 0x853c49e6748fea9bULL) {
    inc_ = (stream << 1u) | 1u;
    next_u32();
    state_ += seed;
    next_u32();
  }
  uint32_t next_u32() {
    const uint64_t old = state_;
    state_ = old * 6364136223846793005ULL + inc_;
    const auto xorshifted = static_cast<uint32_t>(((old >> 18u) ^ old) >> 27u);
    const auto rot = static_cast<uint32_t>(old >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((32 - rot) & 31));
  }
  // Uniform in [0, 1) with 24 random bits (exactly representable as float).
  float uniform() { return static_cast<float>(next_u32() >> 8) / 16777216.0f; }
  // Uniform integer in [0, n); the modulo bias is irrelevant at our n.
  uint32_t below(uint32_t n) { return next_u32() % n; }
  // Standard normal by Box-Muller (one value per call; the twin is dropped
  // to keep the state sequence trivial to reason about).
  double normal() {
    double u1 = (static_cast<double>(next_u32()) + 1.0) / 4294967296.0;  // (0, 1]
    double u2 = static_cast<double>(next_u32()) / 4294967296.0;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }

 private:
  uint64_t state_ = 0;
  uint64_t inc_ = 0;
};

// Mixes two values into a seed (splitmix64 finaliser), so per-step streams are
// independent and any rank can recreate any step's stream.
inline uint64_t mix_seed(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9e3779b97f4a7c15ULL * (b + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace loom::harness
