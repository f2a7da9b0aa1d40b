// The hand-written backward of the harness GPT against central finite
// differences, in double precision, for every parameter of a tiny model.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "harness/data.h"
#include "harness/model.h"

namespace loom::harness {
namespace {

ModelConfig tiny_config() {
  ModelConfig cfg;
  cfg.ctx = 8;
  cfg.layers = 2;
  cfg.dim = 8;
  cfg.heads = 2;
  return cfg;
}

// Deterministic tokens that use only a handful of bytes, so the embedding
// rows that get a gradient are few and their gradients are large.
Batch tiny_batch(int b, int t) {
  std::vector<uint8_t> text;
  const char* s = "the quick brown fox jumps over the lazy dog";
  for (const char* p = s; *p; ++p) text.push_back(static_cast<uint8_t>(*p));
  return global_batch(text, 7, 0, b, t);
}

double loss_of(Gpt<double>& m, const Batch& batch) {
  m.forward(0, batch.b, batch.t, batch.inputs.data(), nullptr, batch.targets.data());
  return m.loss_sum(0) / (batch.b * batch.t);
}

TEST(HarnessGradcheck, BackwardMatchesFiniteDifferences) {
  const ModelConfig cfg = tiny_config();
  Gpt<double> m(cfg, Shard{});
  // A larger init than GPT-2's so every path carries signal the check can see.
  std::vector<float> full = init_full_params(cfg, 1);
  for (float& v : full) v *= 10.0f;
  m.load_full(full.data());
  const Batch batch = tiny_batch(2, 5);

  m.zero_grads();
  loss_of(m, batch);
  m.backward(0, nullptr, 1.0 / (batch.b * batch.t));
  const std::vector<double> analytic(m.grads().begin(), m.grads().end());

  const double eps = 1e-6;
  double max_err = 0, max_grad = 0;
  size_t checked = 0, nonzero = 0;
  auto& p = m.params();
  for (size_t i = 0; i < m.num_params(); ++i) {
    const double saved = p[i];
    p[i] = saved + eps;
    const double up = loss_of(m, batch);
    p[i] = saved - eps;
    const double down = loss_of(m, batch);
    p[i] = saved;
    const double numeric = (up - down) / (2 * eps);
    const double err = std::abs(numeric - analytic[i]);
    EXPECT_LE(err, 1e-7 + 1e-5 * std::abs(numeric)) << "parameter " << i;
    max_err = std::max(max_err, err);
    max_grad = std::max(max_grad, std::abs(numeric));
    ++checked;
    if (std::abs(numeric) > 1e-6) ++nonzero;
  }
  // The check must have exercised real gradients, not a model of zeros.
  EXPECT_EQ(checked, m.num_params());
  EXPECT_GT(nonzero, m.num_params() / 4);
  EXPECT_GT(max_grad, 1e-3);
  std::printf("checked %zu parameters (%zu with |grad| > 1e-6), max |error| %.3g, max |grad| %.3g\n",
              checked, nonzero, max_err, max_grad);
}

// The float32 model (the one that trains) computes the same gradient as the
// double model to float precision.
TEST(HarnessGradcheck, FloatModelMatchesDouble) {
  const ModelConfig cfg = tiny_config();
  const std::vector<float> full = init_full_params(cfg, 3);
  Gpt<double> md(cfg, Shard{});
  Gpt<float> mf(cfg, Shard{});
  md.load_full(full.data());
  mf.load_full(full.data());
  const Batch batch = tiny_batch(2, 6);
  md.zero_grads();
  mf.zero_grads();
  md.forward(0, 2, 6, batch.inputs.data(), nullptr, batch.targets.data());
  mf.forward(0, 2, 6, batch.inputs.data(), nullptr, batch.targets.data());
  EXPECT_NEAR(md.loss_sum(0), mf.loss_sum(0), 1e-4);
  md.backward(0, nullptr, 1.0 / 12);
  mf.backward(0, nullptr, 1.0f / 12);
  double gmax = 0;
  for (size_t i = 0; i < md.num_params(); ++i) gmax = std::max(gmax, std::abs(md.grads()[i]));
  for (size_t i = 0; i < md.num_params(); ++i)
    EXPECT_NEAR(md.grads()[i], mf.grads()[i], 1e-5 * gmax + 1e-7) << "parameter " << i;
}

}  // namespace
}  // namespace loom::harness
