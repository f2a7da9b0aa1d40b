#include "harness/model.h"

#include <cmath>
#include <cstring>

#include "harness/ops.h"
#include "harness/rng.h"

namespace loom::harness {

Status ModelConfig::validate() const {
  if (vocab <= 0 || ctx <= 0 || layers <= 0 || dim <= 0 || heads <= 0)
    return invalid_argument("model: every size must be positive");
  if (dim % heads != 0) return invalid_argument("model: dim must be a multiple of heads");
  // Far above what the harness runs, low enough that no size computation
  // overflows an int (4 * dim) and a foreign checkpoint header cannot ask
  // for billions of tensors (regression: a header with ctx = 2^30 ended in
  // std::bad_alloc, an abort).
  if (vocab > (1 << 24) || ctx > (1 << 20) || layers > (1 << 12) || dim > (1 << 16))
    return invalid_argument("model: a size is out of range (vocab <= 2^24, ctx <= 2^20, layers <= 4096, dim <= 65536)");
  return Status::ok();
}

void stage_layers(int layers, int stages, int stage, int* begin, int* end) {
  const int base = layers / stages, extra = layers % stages;
  *begin = stage * base + std::min(stage, extra);
  *end = *begin + base + (stage < extra ? 1 : 0);
}

namespace {

// The full model's tensors in canonical (checkpoint) order.
std::vector<TensorInfo> canonical_tensors(const ModelConfig& cfg) {
  const int c = cfg.dim;
  std::vector<TensorInfo> t;
  auto add = [&](std::string name, int rows, int cols, Split split, int groups, int layer) {
    TensorInfo ti;
    ti.name = std::move(name);
    ti.rows = rows;
    ti.cols = cols;
    ti.split = split;
    ti.groups = groups;
    ti.layer = layer;
    t.push_back(ti);
  };
  add("wte", cfg.vocab, c, Split::kReplicated, 1, -1);
  add("wpe", cfg.ctx, c, Split::kReplicated, 1, -1);
  add("lnfw", c, 1, Split::kReplicated, 1, -1);
  add("lnfb", c, 1, Split::kReplicated, 1, -1);
  for (int l = 0; l < cfg.layers; ++l) {
    // Built with append: g++ 12 -O3 warns falsely (-Wrestrict) on "h" + to_string().
    std::string p = "h";
    p.append(std::to_string(l)).append(".");
    add(p + "ln1w", c, 1, Split::kReplicated, 1, l);
    add(p + "ln1b", c, 1, Split::kReplicated, 1, l);
    add(p + "qkvw", 3 * c, c, Split::kRows, 3, l);
    add(p + "qkvb", 3 * c, 1, Split::kRows, 3, l);
    add(p + "attprojw", c, c, Split::kCols, 1, l);
    add(p + "attprojb", c, 1, Split::kReplicated, 1, l);
    add(p + "ln2w", c, 1, Split::kReplicated, 1, l);
    add(p + "ln2b", c, 1, Split::kReplicated, 1, l);
    add(p + "fcw", 4 * c, c, Split::kRows, 1, l);
    add(p + "fcb", 4 * c, 1, Split::kRows, 1, l);
    add(p + "fcprojw", c, 4 * c, Split::kCols, 1, l);
    add(p + "fcprojb", c, 1, Split::kReplicated, 1, l);
  }
  size_t off = 0;
  for (auto& ti : t) {
    ti.full_offset = off;
    ti.size = static_cast<size_t>(ti.rows) * ti.cols;
    off += ti.size;
  }
  return t;
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// Calls f(local_index, full_index) for every element of tensor `ti` on `shard`.
template <typename Fn>
void for_each_element(const TensorInfo& ti, const Shard& sh, Fn&& f) {
  switch (ti.split) {
    case Split::kReplicated:
      for (size_t i = 0; i < ti.size; ++i) f(ti.offset + i, ti.full_offset + i);
      break;
    case Split::kRows: {
      const int per_group = ti.rows / ti.groups, local = per_group / sh.tp_size;
      for (int g = 0; g < ti.groups; ++g)
        for (int j = 0; j < local; ++j) {
          const size_t lrow = static_cast<size_t>(g) * local + j;
          const size_t frow = static_cast<size_t>(g) * per_group + static_cast<size_t>(sh.tp_rank) * local + j;
          for (int k = 0; k < ti.cols; ++k)
            f(ti.offset + lrow * ti.cols + k, ti.full_offset + frow * ti.cols + k);
        }
      break;
    }
    case Split::kCols: {
      const int local = ti.cols / sh.tp_size;
      for (int r = 0; r < ti.rows; ++r)
        for (int j = 0; j < local; ++j)
          f(ti.offset + static_cast<size_t>(r) * local + j,
            ti.full_offset + static_cast<size_t>(r) * ti.cols + static_cast<size_t>(sh.tp_rank) * local + j);
      break;
    }
  }
}

}  // namespace

size_t full_param_count(const ModelConfig& cfg) {
  size_t n = 0;
  for (const auto& t : canonical_tensors(cfg)) n += t.size;
  return n;
}

std::vector<float> init_full_params(const ModelConfig& cfg, uint64_t seed) {
  std::vector<float> p(full_param_count(cfg));
  Pcg32 rng(mix_seed(seed, 0x5eed));
  const double proj_std = 0.02 / std::sqrt(2.0 * cfg.layers);
  for (const auto& t : canonical_tensors(cfg)) {
    float* d = p.data() + t.full_offset;
    const bool layernorm = t.name == "lnfw" || t.name == "lnfb" || ends_with(t.name, "ln1w") ||
                           ends_with(t.name, "ln1b") || ends_with(t.name, "ln2w") || ends_with(t.name, "ln2b");
    if (layernorm) {
      const float v = ends_with(t.name, "w") ? 1.0f : 0.0f;
      for (size_t i = 0; i < t.size; ++i) d[i] = v;
    } else if (t.cols == 1) {  // biases
      for (size_t i = 0; i < t.size; ++i) d[i] = 0.0f;
    } else {
      const double sd = (ends_with(t.name, "projw")) ? proj_std : 0.02;
      for (size_t i = 0; i < t.size; ++i) d[i] = static_cast<float>(rng.normal() * sd);
    }
  }
  return p;
}

template <typename F>
struct Gpt<F>::Acts {
  struct Layer {
    std::vector<F> ln1, ln1_mean, ln1_rstd, qkv, atty, att, x2, ln2, ln2_mean, ln2_rstd, fch, fchg;
  };
  int b = 0, t = 0;
  std::vector<int> tokens, targets;
  std::vector<F> res;  // residual stream entering each owned layer, plus the output
  std::vector<Layer> layers;
  std::vector<F> lnf, lnf_mean, lnf_rstd, probs;
  double loss = 0;
};

template <typename F>
Gpt<F>::Gpt(const ModelConfig& cfg, const Shard& shard, size_t pad_to) : cfg_(cfg), shard_(shard) {
  if (shard_.layer_end < 0) shard_.layer_end = cfg_.layers;
  const bool is_first = first(), is_last = last();
  size_t off = 0;
  auto place = [&](TensorInfo t) {
    t.offset = off;
    if (t.split != Split::kReplicated) t.size /= shard_.tp_size;
    off += t.size;
    tensors_.push_back(t);
  };
  layer_offset_.assign(cfg_.layers, 0);
  for (const auto& t : canonical_tensors(cfg_)) {
    if (t.layer < 0) {
      const bool keep = t.name == "wte" ? (is_first || is_last)
                        : t.name == "wpe" ? is_first
                                          : is_last;  // final LayerNorm
      if (!keep) continue;
      if (t.name == "wte") wte_ = {off, t.size};
      if (t.name == "wpe") wpe_ = {off, t.size};
      if (t.name == "lnfw") lnf_ = {off, 2 * t.size};
      place(t);
    } else if (t.layer >= shard_.layer_begin && t.layer < shard_.layer_end) {
      if (ends_with(t.name, ".ln1w")) layer_offset_[t.layer] = off;
      place(t);
    }
  }
  num_params_ = off;
  const size_t padded = (off + pad_to - 1) / pad_to * pad_to;
  params_.assign(padded, F(0));
  grads_.assign(padded, F(0));
  const size_t globals_end = shard_.layer_end > shard_.layer_begin ? layer_offset_[shard_.layer_begin] : off;
  for (int l = shard_.layer_end - 1; l >= shard_.layer_begin; --l) {
    const size_t end = (l + 1 < shard_.layer_end) ? layer_offset_[l + 1] : off;
    buckets_.push_back({layer_offset_[l], end - layer_offset_[l]});
  }
  if (globals_end > 0) buckets_.push_back({0, globals_end});
}

template <typename F>
Gpt<F>::~Gpt() = default;

template <typename F>
void Gpt<F>::load_full(const float* full) {
  for (const auto& t : tensors_)
    for_each_element(t, shard_, [&](size_t li, size_t fi) { params_[li] = static_cast<F>(full[fi]); });
}

template <typename F>
void Gpt<F>::store_full(float* full, bool owned_only) const {
  for (const auto& t : tensors_) {
    if (owned_only) {
      if (t.split == Split::kReplicated && shard_.tp_rank != 0) continue;
      if (t.name == "wte" && !first()) continue;
    }
    for_each_element(t, shard_, [&](size_t li, size_t fi) { full[fi] = static_cast<float>(params_[li]); });
  }
}

template <typename F>
LayerParams<F> Gpt<F>::layer_ptrs(F* base, int l) const {
  const int c = cfg_.dim, cl = c / shard_.tp_size;
  F* p = base + layer_offset_[l];
  LayerParams<F> lp;
  auto take = [&p](size_t n) {
    F* r = p;
    p += n;
    return r;
  };
  lp.ln1w = take(c);
  lp.ln1b = take(c);
  lp.qkvw = take(static_cast<size_t>(3) * cl * c);
  lp.qkvb = take(3 * cl);
  lp.attprojw = take(static_cast<size_t>(c) * cl);
  lp.attprojb = take(c);
  lp.ln2w = take(c);
  lp.ln2b = take(c);
  lp.fcw = take(static_cast<size_t>(4) * cl * c);
  lp.fcb = take(4 * cl);
  lp.fcprojw = take(static_cast<size_t>(c) * 4 * cl);
  lp.fcprojb = take(c);
  return lp;
}

template <typename F>
void Gpt<F>::allreduce_tp(F* p, size_t n) {
  if (shard_.tp_size > 1) tp_allreduce(p, n);
}

template <typename F>
void Gpt<F>::zero_grads() {
  std::fill(grads_.begin(), grads_.end(), F(0));
}

template <typename F>
typename Gpt<F>::Acts& Gpt<F>::slot_acts(int slot, int b, int t) {
  if (static_cast<int>(acts_.size()) <= slot) acts_.resize(slot + 1);
  auto& a = acts_[slot];
  if (a && a->b == b && a->t == t) return *a;
  a = std::make_unique<Acts>();
  a->b = b;
  a->t = t;
  const size_t n = static_cast<size_t>(b) * t, c = cfg_.dim, cl = c / shard_.tp_size;
  const size_t nh = local_heads(), nl = shard_.layer_end - shard_.layer_begin;
  a->tokens.resize(n);
  a->targets.resize(n);
  a->res.resize((nl + 1) * n * c);
  a->layers.resize(nl);
  for (auto& L : a->layers) {
    L.ln1.resize(n * c), L.ln1_mean.resize(n), L.ln1_rstd.resize(n);
    L.qkv.resize(n * 3 * cl), L.atty.resize(n * cl), L.att.resize(b * nh * t * t);
    L.x2.resize(n * c), L.ln2.resize(n * c), L.ln2_mean.resize(n), L.ln2_rstd.resize(n);
    L.fch.resize(n * 4 * cl), L.fchg.resize(n * 4 * cl);
  }
  if (last()) {
    a->lnf.resize(n * c), a->lnf_mean.resize(n), a->lnf_rstd.resize(n);
    a->probs.resize(n * cfg_.vocab);
  }
  return *a;
}

template <typename F>
void Gpt<F>::forward(int slot, int b, int t, const int* tokens, const F* x_in, const int* targets) {
  Acts& a = slot_acts(slot, b, t);
  const int n = b * t, c = cfg_.dim, cl = c / shard_.tp_size, nh = local_heads(), hs = cfg_.head_size();
  const size_t nc = static_cast<size_t>(n) * c;
  if (first()) {
    std::copy(tokens, tokens + n, a.tokens.begin());
    encoder_forward(a.res.data(), tokens, wte(), wpe(), n, t, c);
  } else {
    std::copy(x_in, x_in + nc, a.res.begin());
  }
  std::vector<F> tmp(nc);
  for (int l = shard_.layer_begin; l < shard_.layer_end; ++l) {
    const int k = l - shard_.layer_begin;
    auto& L = a.layers[k];
    const LayerParams<F> p = layer(l);
    const F* x = a.res.data() + k * nc;
    F* out = a.res.data() + (k + 1) * nc;
    layernorm_forward(L.ln1.data(), L.ln1_mean.data(), L.ln1_rstd.data(), x, p.ln1w, p.ln1b, n, c);
    matmul_forward(L.qkv.data(), L.ln1.data(), p.qkvw, p.qkvb, n, c, 3 * cl);
    attention_forward(L.atty.data(), L.att.data(), L.qkv.data(), b, t, nh, hs);
    // Row-parallel projection: each tp rank holds a partial sum; the bias is
    // added once, after the sum.
    matmul_forward(tmp.data(), L.atty.data(), p.attprojw, static_cast<const F*>(nullptr), n, cl, c);
    allreduce_tp(tmp.data(), nc);
    for (size_t i = 0; i < nc; ++i) L.x2[i] = x[i] + (tmp[i] + p.attprojb[i % c]);
    layernorm_forward(L.ln2.data(), L.ln2_mean.data(), L.ln2_rstd.data(), L.x2.data(), p.ln2w, p.ln2b, n, c);
    matmul_forward(L.fch.data(), L.ln2.data(), p.fcw, p.fcb, n, c, 4 * cl);
    gelu_forward(L.fchg.data(), L.fch.data(), static_cast<size_t>(n) * 4 * cl);
    matmul_forward(tmp.data(), L.fchg.data(), p.fcprojw, static_cast<const F*>(nullptr), n, 4 * cl, c);
    allreduce_tp(tmp.data(), nc);
    for (size_t i = 0; i < nc; ++i) out[i] = L.x2[i] + (tmp[i] + p.fcprojb[i % c]);
  }
  if (last()) {
    const F* x = a.res.data() + (shard_.layer_end - shard_.layer_begin) * nc;
    std::copy(targets, targets + n, a.targets.begin());
    layernorm_forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), x, lnfw(), lnfb(), n, c);
    std::vector<F> logits(static_cast<size_t>(n) * cfg_.vocab);
    matmul_forward(logits.data(), a.lnf.data(), wte(), static_cast<const F*>(nullptr), n, c, cfg_.vocab);
    a.loss = softmax_crossentropy_forward(a.probs.data(), logits.data(), targets, n, cfg_.vocab);
  }
}

template <typename F>
const F* Gpt<F>::output(int slot) const {
  const Acts& a = *acts_.at(slot);
  const size_t nc = static_cast<size_t>(a.b) * a.t * cfg_.dim;
  return a.res.data() + (shard_.layer_end - shard_.layer_begin) * nc;
}

template <typename F>
double Gpt<F>::loss_sum(int slot) const {
  return acts_.at(slot)->loss;
}

template <typename F>
void Gpt<F>::backward(int slot, const F* dx_out, F loss_scale, const std::function<void(int)>& bucket_ready) {
  Acts& a = *acts_.at(slot);
  const int b = a.b, t = a.t, n = b * t, c = cfg_.dim, cl = c / shard_.tp_size, nh = local_heads(),
            hs = cfg_.head_size(), v = cfg_.vocab;
  const size_t nc = static_cast<size_t>(n) * c, nl = shard_.layer_end - shard_.layer_begin;
  dres_.assign(nc, F(0));
  dln_.resize(nc);
  dqkv_.resize(static_cast<size_t>(n) * 3 * cl);
  datty_.resize(static_cast<size_t>(n) * cl);
  dfch_.resize(static_cast<size_t>(n) * 4 * cl);
  dfchg_.resize(static_cast<size_t>(n) * 4 * cl);
  F* g = grads_.data();
  if (last()) {
    dlogits_.resize(static_cast<size_t>(n) * v);
    softmax_crossentropy_backward(dlogits_.data(), a.probs.data(), a.targets.data(), n, v, loss_scale);
    std::fill(dln_.begin(), dln_.end(), F(0));
    matmul_backward(dln_.data(), g + wte_.offset, static_cast<F*>(nullptr), dlogits_.data(), a.lnf.data(),
                    wte(), n, c, v);
    const F* x = a.res.data() + nl * nc;
    layernorm_backward(dres_.data(), g + lnf_.offset, g + lnf_.offset + c, dln_.data(), x, lnfw(),
                       a.lnf_mean.data(), a.lnf_rstd.data(), n, c);
  } else {
    std::copy(dx_out, dx_out + nc, dres_.begin());
  }
  int bucket = 0;
  for (int l = shard_.layer_end - 1; l >= shard_.layer_begin; --l) {
    const int k = l - shard_.layer_begin;
    auto& L = a.layers[k];
    const LayerParams<F> p = layer(l);
    const LayerParams<F> d = layer_ptrs(g, l);
    const F* x = a.res.data() + k * nc;
    // MLP: x3 = x2 + fcproj(gelu(fc(ln2(x2)))) + b
    std::fill(dfchg_.begin(), dfchg_.end(), F(0));
    matmul_backward(dfchg_.data(), d.fcprojw, d.fcprojb, dres_.data(), L.fchg.data(), p.fcprojw, n, 4 * cl, c);
    std::fill(dfch_.begin(), dfch_.end(), F(0));
    gelu_backward(dfch_.data(), L.fch.data(), dfchg_.data(), dfch_.size());
    std::fill(dln_.begin(), dln_.end(), F(0));
    matmul_backward(dln_.data(), d.fcw, d.fcb, dfch_.data(), L.ln2.data(), p.fcw, n, c, 4 * cl);
    allreduce_tp(dln_.data(), nc);  // column-parallel input: sum the partial gradients
    layernorm_backward(dres_.data(), d.ln2w, d.ln2b, dln_.data(), L.x2.data(), p.ln2w, L.ln2_mean.data(),
                       L.ln2_rstd.data(), n, c);
    // Attention: x2 = x + attproj(attn(qkv(ln1(x)))) + b
    std::fill(datty_.begin(), datty_.end(), F(0));
    matmul_backward(datty_.data(), d.attprojw, d.attprojb, dres_.data(), L.atty.data(), p.attprojw, n, cl, c);
    std::fill(dqkv_.begin(), dqkv_.end(), F(0));
    attention_backward(dqkv_.data(), datty_.data(), L.qkv.data(), L.att.data(), b, t, nh, hs);
    std::fill(dln_.begin(), dln_.end(), F(0));
    matmul_backward(dln_.data(), d.qkvw, d.qkvb, dqkv_.data(), L.ln1.data(), p.qkvw, n, c, 3 * cl);
    allreduce_tp(dln_.data(), nc);
    layernorm_backward(dres_.data(), d.ln1w, d.ln1b, dln_.data(), x, p.ln1w, L.ln1_mean.data(),
                       L.ln1_rstd.data(), n, c);
    if (bucket_ready) bucket_ready(bucket);
    ++bucket;
  }
  if (first()) encoder_backward(g + wte_.offset, g + wpe_.offset, dres_.data(), a.tokens.data(), n, t, c);
  if (bucket < static_cast<int>(buckets_.size()) && bucket_ready) bucket_ready(bucket);
}

template class Gpt<float>;
template class Gpt<double>;

}  // namespace loom::harness
