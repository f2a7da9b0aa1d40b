// AdamW (Loshchilov & Hutter), elementwise, so a ZeRO shard of the flat
// parameter buffer updates exactly as the same elements of the full buffer.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

namespace loom::harness {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

class AdamW {
 public:
  AdamW(size_t n, const AdamWConfig& cfg) : cfg_(cfg), m_(n, 0.0f), v_(n, 0.0f) {}
  // One update of params[0, n) with grads[0, n); `step` counts from 1.
  void update(float* params, const float* grads, int step) {
    const float c1 = 1.0f - std::pow(cfg_.beta1, static_cast<float>(step));
    const float c2 = 1.0f - std::pow(cfg_.beta2, static_cast<float>(step));
    for (size_t i = 0; i < m_.size(); ++i) {
      const float g = grads[i];
      m_[i] = cfg_.beta1 * m_[i] + (1.0f - cfg_.beta1) * g;
      v_[i] = cfg_.beta2 * v_[i] + (1.0f - cfg_.beta2) * g * g;
      const float mhat = m_[i] / c1, vhat = v_[i] / c2;
      params[i] -= cfg_.lr * (mhat / (std::sqrt(vhat) + cfg_.eps) + cfg_.weight_decay * params[i]);
    }
  }
  size_t size() const { return m_.size(); }

 private:
  AdamWConfig cfg_;
  std::vector<float> m_, v_;
};

}  // namespace loom::harness
