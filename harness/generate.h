// Inference: load a checkpoint, prefill the prompt and decode token by token
// with a KV cache, tensor-parallel over --tp ranks (attention heads and MLP
// split as in training; two allreduces per layer per forward).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness/model.h"

namespace loom::harness {

struct GenerateOptions {
  int tp = 1;
  std::string ckpt;
  std::string prompt = "The ";
  int tokens = 64;
  int top_k = 0;            // 0 or 1: greedy
  float temperature = 1.0f;
  uint64_t seed = 1;
  double timeout_s = 0;
  // Called after each decoded token (train --generate: a heartbeat the
  // ranks that do not generate take part in).
  std::function<void()> on_token;
};

// KV-cached forward of a (tensor-parallel shard of a) whole model.
class Decoder {
 public:
  // `model` must hold all layers; its tp_allreduce hook is used for tp > 1.
  explicit Decoder(Gpt<float>& model);
  // Runs `n` tokens at positions [pos(), pos()+n) through the model, appending
  // their keys and values to the cache; returns the last token's logits.
  const std::vector<float>& step(const int* tokens, int n);
  int pos() const { return pos_; }
  void reset() { pos_ = 0; }

 private:
  Gpt<float>& m_;
  int pos_ = 0;
  std::vector<std::vector<float>> kcache_, vcache_;  // per layer [ctx, local channels]
  std::vector<float> x_, ln_, qkv_, atty_, tmp_, fch_, fchg_, mean_, rstd_, logits_, att_;
};

// Picks the next token: argmax for top_k <= 1, else samples among the k most
// likely with `temperature`.
int pick_token(const std::vector<float>& logits, int top_k, float temperature, uint64_t seed, int index);

class Group;
class CommStats;
// Prefills o.prompt and decodes o.tokens tokens on the ranks of `tp` (each
// holding its shard in `model`); tp rank 0 picks the tokens and prints the
// text, tokens/s, per-token latency and the share of time in collectives.
void generate_and_report(Gpt<float>& model, Group& tp, CommStats& stats, const GenerateOptions& o);

int run_generate(const GenerateOptions& opts);

}  // namespace loom::harness
