// The harness's Megatron split and pipeline split compute what the single
// model computes: tp shards (ranks as threads, summed through the model's
// tp_allreduce hook) and pipeline stages (called in order) give the same loss
// and, mapped back to the full layout, the same gradients. This checks the
// decomposition itself, independent of any communication library.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <thread>
#include <vector>

#include "harness/data.h"
#include "harness/model.h"

namespace loom::harness {
namespace {

ModelConfig small_config() {
  ModelConfig cfg;
  cfg.ctx = 16;
  cfg.layers = 3;
  cfg.dim = 16;
  cfg.heads = 4;
  return cfg;
}

Batch small_batch() {
  std::vector<uint8_t> text;
  const char* s = "It is not the critic who counts; not the man who points out how the strong man stumbles";
  for (const char* p = s; *p; ++p) text.push_back(static_cast<uint8_t>(*p));
  return global_batch(text, 11, 0, 3, 10);
}

// Gradients of `m`, written into the canonical layout (owned parts only).
std::vector<float> full_grads(Gpt<double>& m, std::vector<float> into) {
  const std::vector<double> saved = m.params();
  m.params().assign(m.grads().begin(), m.grads().end());
  m.store_full(into.data(), /*owned_only=*/true);
  m.params() = saved;
  return into;
}

struct Reference {
  double loss;
  std::vector<float> grads;
};

Reference single_rank(const ModelConfig& cfg, const std::vector<float>& full, const Batch& batch) {
  Gpt<double> m(cfg, Shard{});
  m.load_full(full.data());
  m.zero_grads();
  m.forward(0, batch.b, batch.t, batch.inputs.data(), nullptr, batch.targets.data());
  m.backward(0, nullptr, 1.0 / (batch.b * batch.t));
  return {m.loss_sum(0), full_grads(m, std::vector<float>(full.size(), 0.0f))};
}

void expect_grads_near(const std::vector<float>& want, const std::vector<float>& got) {
  ASSERT_EQ(want.size(), got.size());
  float gmax = 0;
  for (float g : want) gmax = std::max(gmax, std::abs(g));
  ASSERT_GT(gmax, 0.0f);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(want[i], got[i], 1e-5f * gmax) << "element " << i;
}

TEST(HarnessShard, TensorParallelMatchesSingleRank) {
  const ModelConfig cfg = small_config();
  const std::vector<float> full = init_full_params(cfg, 5);
  const Batch batch = small_batch();
  const Reference ref = single_rank(cfg, full, batch);

  for (int tp : {2, 4}) {
    std::vector<std::unique_ptr<Gpt<double>>> shards;
    for (int r = 0; r < tp; ++r) {
      Shard sh;
      sh.tp_rank = r;
      sh.tp_size = tp;
      shards.push_back(std::make_unique<Gpt<double>>(cfg, sh));
      shards.back()->load_full(full.data());
    }
    // A thread-based allreduce: every rank sums all buffers in rank order.
    std::barrier sync(tp);
    std::vector<double*> bufs(tp);
    std::vector<std::vector<double>> sums(tp);
    for (int r = 0; r < tp; ++r)
      shards[r]->tp_allreduce = [&, r](double* p, size_t n) {
        bufs[r] = p;
        sync.arrive_and_wait();
        sums[r].assign(n, 0.0);
        for (int q = 0; q < tp; ++q)
          for (size_t i = 0; i < n; ++i) sums[r][i] += bufs[q][i];
        sync.arrive_and_wait();
        std::copy(sums[r].begin(), sums[r].end(), p);
      };
    std::vector<std::thread> threads;
    for (int r = 0; r < tp; ++r)
      threads.emplace_back([&, r] {
        auto& m = *shards[r];
        m.zero_grads();
        m.forward(0, batch.b, batch.t, batch.inputs.data(), nullptr, batch.targets.data());
        m.backward(0, nullptr, 1.0 / (batch.b * batch.t));
      });
    for (auto& t : threads) t.join();
    std::vector<float> grads(full.size(), 0.0f);
    for (int r = 0; r < tp; ++r) {
      EXPECT_NEAR(shards[r]->loss_sum(0), ref.loss, 1e-9) << "tp " << tp << " rank " << r;
      grads = full_grads(*shards[r], grads);
    }
    expect_grads_near(ref.grads, grads);
  }
}

TEST(HarnessShard, PipelineStagesMatchSingleRank) {
  const ModelConfig cfg = small_config();
  const std::vector<float> full = init_full_params(cfg, 9);
  const Batch batch = small_batch();
  const Reference ref = single_rank(cfg, full, batch);

  const int stages = 3;
  std::vector<std::unique_ptr<Gpt<double>>> st;
  for (int s = 0; s < stages; ++s) {
    Shard sh;
    stage_layers(cfg.layers, stages, s, &sh.layer_begin, &sh.layer_end);
    st.push_back(std::make_unique<Gpt<double>>(cfg, sh));
    st.back()->load_full(full.data());
    st.back()->zero_grads();
  }
  // Two micro-batches, as the pipeline schedule runs them.
  const Batch mb[2] = {slice_batch(batch, 0, 2), slice_batch(batch, 2, 1)};
  double loss = 0;
  for (int i = 0; i < 2; ++i) {
    const double* x = nullptr;
    for (int s = 0; s < stages; ++s) {
      st[s]->forward(i, mb[i].b, mb[i].t, mb[i].inputs.data(), x, mb[i].targets.data());
      if (s + 1 < stages) x = st[s]->output(i);
    }
    loss += st[stages - 1]->loss_sum(i);
  }
  for (int i = 0; i < 2; ++i) {
    std::vector<double> dx;
    for (int s = stages - 1; s >= 0; --s) {
      st[s]->backward(i, dx.empty() ? nullptr : dx.data(), 1.0 / (batch.b * batch.t));
      if (s > 0) dx.assign(st[s]->input_grad(), st[s]->input_grad() + batch.t * mb[i].b * cfg.dim);
    }
  }
  EXPECT_NEAR(loss, ref.loss, 1e-9);
  // The tied embedding lives on the first and the last stage: its gradient is
  // the sum of both, as the trainer's tie exchange computes.
  std::vector<float> grads(full.size(), 0.0f);
  for (int s = 0; s < stages; ++s) grads = full_grads(*st[s], grads);
  const auto wte_first = st[0]->grads();
  const auto wte_last = st[stages - 1]->grads();
  const auto r0 = st[0]->wte_range(), r1 = st[stages - 1]->wte_range();
  ASSERT_EQ(r0.count, r1.count);
  for (size_t i = 0; i < r0.count; ++i)
    grads[i] = static_cast<float>(wte_first[r0.offset + i] + wte_last[r1.offset + i]);
  expect_grads_near(ref.grads, grads);
}

}  // namespace
}  // namespace loom::harness
