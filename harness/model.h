// The GPT (token + position embedding, pre-LayerNorm blocks with causal
// multi-head attention and a GELU MLP, tied LM head), or the part of it that
// one rank owns: a range of layers (a pipeline stage) and a slice of every
// block (a tensor-parallel shard, Megatron's column/row split).
//
// The single-rank model is simply Shard{} — tp_size 1, all layers — and runs
// the same code, which is what makes the golden comparison meaningful.
// Communication is not done here: tensor parallelism needs a sum across the
// tp group inside forward and backward, which the caller provides as the
// `tp_allreduce` hook (Loom in the harness, threads in the unit tests).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/memory.h"
#include "loom/status.h"

namespace loom::harness {

struct ModelConfig {
  int vocab = 256;   // byte-level
  int ctx = 128;     // rows of the position table: longest sequence (train or generate)
  int layers = 2;
  int dim = 64;
  int heads = 4;
  int head_size() const { return dim / heads; }
  Status validate() const;
  bool operator==(const ModelConfig&) const = default;
};

// What one rank owns. Layers [layer_begin, layer_end); layer_end < 0 = all.
struct Shard {
  int tp_rank = 0;
  int tp_size = 1;
  int layer_begin = 0;
  int layer_end = -1;
};

// Layers of pipeline stage `stage` of `stages`: an even split, earlier stages
// take the remainder.
void stage_layers(int layers, int stages, int stage, int* begin, int* end);

// How a tensor of the full model maps onto a shard.
enum class Split {
  kReplicated,  // every tp rank holds all of it
  kRows,        // output rows split (column-parallel linear); `groups` blocks split separately
  kCols,        // input columns split (row-parallel linear)
};

struct TensorInfo {
  std::string name;        // "h0.qkvw", "wte", ...
  size_t offset = 0;       // local, in elements
  size_t size = 0;         // local element count
  size_t full_offset = 0;  // in the canonical single-rank layout
  int rows = 0, cols = 1;  // full shape
  Split split = Split::kReplicated;
  int groups = 1;          // kRows: q|k|v are split separately (groups = 3)
  int layer = -1;          // -1: embedding / final LayerNorm
};

// Total parameter count of the full model (canonical layout).
size_t full_param_count(const ModelConfig& cfg);
// Fills the canonical layout deterministically from `seed` (GPT-2's init:
// N(0, 0.02), residual projections scaled by 1/sqrt(2*layers), LayerNorm 1/0).
std::vector<float> init_full_params(const ModelConfig& cfg, uint64_t seed);

template <typename F>
struct LayerParams {
  F *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
};

template <typename F>
class Gpt {
 public:
  // `pad_to`: the flat buffers are padded with zeros to a multiple of this
  // (ZeRO shards them evenly across the data-parallel group).
  Gpt(const ModelConfig& cfg, const Shard& shard, size_t pad_to = 1);

  const ModelConfig& config() const { return cfg_; }
  const Shard& shard() const { return shard_; }
  bool first() const { return shard_.layer_begin == 0; }
  bool last() const { return shard_.layer_end == cfg_.layers; }
  int local_heads() const { return cfg_.heads / shard_.tp_size; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  size_t num_params() const { return num_params_; }  // without padding

  std::vector<F>& params() { return params_; }
  // Gradients live in loom::mem_alloc memory (large buffers): the dp
  // allreduce / reduce_scatter peers on this host read them through a
  // mapping instead of process_vm_readv (include/loom/memory.h).
  using GradVec = std::vector<F, loom::MemAllocator<F>>;
  GradVec& grads() { return grads_; }
  const std::vector<F>& params() const { return params_; }

  // Copies this shard's slices out of / into a canonical full-model buffer.
  // store_full writes only what this rank is the owner of when `owned_only`
  // (replicated tensors on tp rank 0; wte on the first stage), so summing
  // the buffers of all ranks rebuilds the full model exactly.
  void load_full(const float* full);
  void store_full(float* full, bool owned_only) const;

  struct Range {
    size_t offset = 0, count = 0;
  };
  // Gradient buckets in the order backward finishes them: last layer first,
  // then embedding / head / final LayerNorm. Empty buckets are omitted.
  const std::vector<Range>& grad_buckets() const { return buckets_; }
  // The tied embedding on this rank (null where neither first nor last stage).
  Range wte_range() const { return wte_; }

  LayerParams<F> layer(int l) { return layer_ptrs(params_.data(), l); }
  const F* wte() const { return has(wte_) ? params_.data() + wte_.offset : nullptr; }
  const F* wpe() const { return has(wpe_) ? params_.data() + wpe_.offset : nullptr; }
  const F* lnfw() const { return has(lnf_) ? params_.data() + lnf_.offset : nullptr; }
  const F* lnfb() const { return has(lnf_) ? lnfw() + cfg_.dim : nullptr; }

  // Sums `n` values in place across the tp group. Required when tp_size > 1.
  std::function<void(F*, size_t)> tp_allreduce;

  // Forward of one micro-batch of b sequences of length t into slot `slot`
  // (activations are kept per slot until its backward). The first stage
  // reads `tokens` [b*t], later stages `x_in` [b*t, dim]; the last stage
  // reads `targets` [b*t] and computes the loss.
  void forward(int slot, int b, int t, const int* tokens, const F* x_in, const int* targets);
  // Residual stream leaving this stage (not on the last stage).
  const F* output(int slot) const;
  // Sum of per-token cross-entropy of the slot's micro-batch (last stage).
  double loss_sum(int slot) const;
  // Backward of slot's micro-batch. The last stage starts from the loss,
  // scaled by `loss_scale` (1 / tokens of the global batch), others from
  // `dx_out`. Gradients accumulate into grads(). `bucket_ready(i)` is called
  // as soon as bucket i's gradients will not change any more in this call.
  void backward(int slot, const F* dx_out, F loss_scale,
                const std::function<void(int bucket)>& bucket_ready = {});
  // Gradient w.r.t. this stage's input (not on the first stage); valid until
  // the next backward.
  const F* input_grad() const { return dres_.data(); }
  void zero_grads();

 private:
  struct Acts;
  static bool has(const Range& r) { return r.count > 0; }
  LayerParams<F> layer_ptrs(F* base, int l) const;
  void allreduce_tp(F* p, size_t n);
  Acts& slot_acts(int slot, int b, int t);

  ModelConfig cfg_;
  Shard shard_;
  std::vector<TensorInfo> tensors_;
  size_t num_params_ = 0;
  std::vector<F> params_;
  GradVec grads_;
  Range wte_, wpe_, lnf_;
  std::vector<size_t> layer_offset_;  // local offset of each owned layer's block
  std::vector<Range> buckets_;
  std::vector<std::unique_ptr<Acts>> acts_;
  // Backward scratch, shared by all slots.
  std::vector<F> dres_, dln_, dqkv_, datty_, dfch_, dfchg_, dlogits_;

 public:
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;
};

extern template class Gpt<float>;
extern template class Gpt<double>;

}  // namespace loom::harness
