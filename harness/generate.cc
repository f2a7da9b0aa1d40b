#include "harness/generate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "harness/checkpoint.h"
#include "harness/dist.h"
#include "harness/ops.h"
#include "harness/rng.h"

namespace loom::harness {

Decoder::Decoder(Gpt<float>& model) : m_(model) {
  const ModelConfig& c = m_.config();
  const size_t cl = c.dim / m_.shard().tp_size;
  kcache_.assign(c.layers, std::vector<float>(c.ctx * cl));
  vcache_.assign(c.layers, std::vector<float>(c.ctx * cl));
}

const std::vector<float>& Decoder::step(const int* tokens, int n) {
  const ModelConfig& cfg = m_.config();
  const int c = cfg.dim, cl = c / m_.shard().tp_size, nh = m_.local_heads(), hs = cfg.head_size();
  const size_t nc = static_cast<size_t>(n) * c;
  const int p0 = pos_;
  x_.resize(nc), ln_.resize(nc), tmp_.resize(nc), mean_.resize(n), rstd_.resize(n);
  qkv_.resize(static_cast<size_t>(n) * 3 * cl), atty_.resize(static_cast<size_t>(n) * cl);
  fch_.resize(static_cast<size_t>(n) * 4 * cl), fchg_.resize(fch_.size()), att_.resize(cfg.ctx);
  encoder_forward(x_.data(), tokens, m_.wte(), m_.wpe(), n, n, c, p0);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  auto sum_tp = [&](float* p, size_t count) {
    if (m_.shard().tp_size > 1) m_.tp_allreduce(p, count);
  };
  for (int l = 0; l < cfg.layers; ++l) {
    const LayerParams<float> p = m_.layer(l);
    float* kc = kcache_[l].data();
    float* vc = vcache_[l].data();
    layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), x_.data(), p.ln1w, p.ln1b, n, c);
    matmul_forward(qkv_.data(), ln_.data(), p.qkvw, p.qkvb, n, c, 3 * cl);
    for (int i = 0; i < n; ++i) {
      const float* row = qkv_.data() + static_cast<size_t>(i) * 3 * cl;
      std::copy(row + cl, row + 2 * cl, kc + static_cast<size_t>(p0 + i) * cl);
      std::copy(row + 2 * cl, row + 3 * cl, vc + static_cast<size_t>(p0 + i) * cl);
    }
    // Same arithmetic as attention_forward, reading keys/values from the cache.
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < nh; ++h) {
        const float* q = qkv_.data() + static_cast<size_t>(i) * 3 * cl + h * hs;
        const int upto = p0 + i;
        float mx = -INFINITY;
        for (int j = 0; j <= upto; ++j) {
          const float* k = kc + static_cast<size_t>(j) * cl + h * hs;
          float dot = 0;
          for (int d = 0; d < hs; ++d) dot += q[d] * k[d];
          att_[j] = dot * scale;
          mx = std::max(mx, att_[j]);
        }
        float sum = 0;
        for (int j = 0; j <= upto; ++j) {
          att_[j] = std::exp(att_[j] - mx);
          sum += att_[j];
        }
        float* y = atty_.data() + static_cast<size_t>(i) * cl + h * hs;
        std::fill(y, y + hs, 0.0f);
        for (int j = 0; j <= upto; ++j) {
          const float a = att_[j] / sum;
          const float* v = vc + static_cast<size_t>(j) * cl + h * hs;
          for (int d = 0; d < hs; ++d) y[d] += a * v[d];
        }
      }
    matmul_forward(tmp_.data(), atty_.data(), p.attprojw, static_cast<const float*>(nullptr), n, cl, c);
    sum_tp(tmp_.data(), nc);
    for (size_t i = 0; i < nc; ++i) x_[i] = x_[i] + (tmp_[i] + p.attprojb[i % c]);
    layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), x_.data(), p.ln2w, p.ln2b, n, c);
    matmul_forward(fch_.data(), ln_.data(), p.fcw, p.fcb, n, c, 4 * cl);
    gelu_forward(fchg_.data(), fch_.data(), fch_.size());
    matmul_forward(tmp_.data(), fchg_.data(), p.fcprojw, static_cast<const float*>(nullptr), n, 4 * cl, c);
    sum_tp(tmp_.data(), nc);
    for (size_t i = 0; i < nc; ++i) x_[i] = x_[i] + (tmp_[i] + p.fcprojb[i % c]);
  }
  // Only the last position's logits are needed to pick the next token.
  layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), x_.data() + nc - c, m_.lnfw(), m_.lnfb(), 1, c);
  logits_.resize(cfg.vocab);
  matmul_forward(logits_.data(), ln_.data(), m_.wte(), static_cast<const float*>(nullptr), 1, c, cfg.vocab);
  pos_ += n;
  return logits_;
}

int pick_token(const std::vector<float>& logits, int top_k, float temperature, uint64_t seed, int index) {
  const int v = static_cast<int>(logits.size());
  if (top_k <= 1) return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int> idx(v);
  std::iota(idx.begin(), idx.end(), 0);
  const int k = std::min(top_k, v);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  std::vector<double> w(k);
  double sum = 0;
  for (int i = 0; i < k; ++i) {
    w[i] = std::exp((logits[idx[i]] - logits[idx[0]]) / std::max(temperature, 1e-6f));
    sum += w[i];
  }
  Pcg32 rng(mix_seed(seed, 0x70e0000ULL + static_cast<uint64_t>(index)));
  double u = rng.uniform() * sum;
  for (int i = 0; i < k; ++i) {
    if (u < w[i]) return idx[i];
    u -= w[i];
  }
  return idx[k - 1];
}

namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (unsigned char ch : s) {
    if (ch == '\n') {
      out += "\\n";
    } else if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch >= 32 && ch < 127) {
      out += static_cast<char>(ch);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", ch);
      out += buf;
    }
  }
  return out;
}

}  // namespace

void generate_and_report(Gpt<float>& model, Group& tp, CommStats& stats, const GenerateOptions& o) {
  const bool rank0 = tp.rank() == 0;
  Decoder dec(model);
  std::vector<int> prompt(o.prompt.begin(), o.prompt.end());
  for (int& t : prompt) t &= 0xff;
  stats.reset();
  const double t0 = now_s();
  const std::vector<float>* logits = &dec.step(prompt.data(), static_cast<int>(prompt.size()));
  const double prefill = now_s() - t0;
  std::string out;
  std::vector<double> lat;
  for (int i = 0; i < o.tokens; ++i) {
    const double ts = now_s();
    int tok = rank0 ? pick_token(*logits, o.top_k, o.temperature, o.seed, i) : 0;
    tp.broadcast(&tok, 1, 0);  // every shard continues with rank 0's choice
    out += static_cast<char>(tok);
    if (i + 1 < o.tokens) logits = &dec.step(&tok, 1);
    lat.push_back(now_s() - ts);
    if (o.on_token) o.on_token();
  }
  const double total = now_s() - t0, decode = total - prefill;
  if (rank0) {
    std::vector<double> sorted = lat;
    std::sort(sorted.begin(), sorted.end());
    const double mean = decode / static_cast<double>(lat.size());
    std::printf("prompt \"%s\"\n", escape(o.prompt).c_str());
    std::printf("text \"%s\"\n", escape(out).c_str());
    std::printf("prefill %zu tokens %.2f ms | decode %d tokens %.2f ms | %.1f tok/s | latency mean %.3f ms p50 %.3f ms "
                "p90 %.3f ms | collectives %.1f%% of time%s%s\n",
                prompt.size(), prefill * 1e3, o.tokens, decode * 1e3, o.tokens / decode, mean * 1e3,
                sorted[sorted.size() / 2] * 1e3, sorted[sorted.size() * 9 / 10] * 1e3,
                100.0 * stats.total_seconds() / total, stats.by_kind().empty() ? "" : ": ", stats.summary().c_str());
    std::fflush(stdout);
  }
}

int run_generate(const GenerateOptions& o) {
  CommStats stats;
  Result<Grid> grid = make_grid(o.tp, 1, 1, &stats, o.timeout_s);
  if (!grid.is_ok()) {
    std::fprintf(stderr, "loom-harness: cannot set up the process grid: %s\n", grid.status().to_string().c_str());
    return 1;
  }
  Grid& g = *grid;
  const bool rank0 = g.world_rank == 0;
  auto fail = [&](const std::string& m) {
    std::fprintf(stderr, "loom-harness: rank %d: %s\n", g.world_rank, m.c_str());
    return 2;
  };
  if (o.ckpt.empty()) return fail("generate needs --ckpt FILE");
  Result<Checkpoint> ck = load_checkpoint(o.ckpt);
  if (!ck.is_ok()) return fail(ck.status().to_string());
  const ModelConfig& cfg = ck->config;
  if (cfg.heads % o.tp != 0) return fail("the model's heads must be a multiple of --tp");
  if (o.prompt.empty()) return fail("--prompt must not be empty");
  if (o.tokens < 1) return fail("--tokens must be at least 1");
  if (static_cast<int>(o.prompt.size()) + o.tokens - 1 > cfg.ctx)
    return fail("prompt (" + std::to_string(o.prompt.size()) + " bytes) + --tokens " + std::to_string(o.tokens) +
                " exceed the model's context of " + std::to_string(cfg.ctx) + " positions");

  Shard shard;
  shard.tp_rank = g.tp_rank;
  shard.tp_size = g.tp;
  Gpt<float> model(cfg, shard);
  model.load_full(ck->params.data());
  Group* tp_group = g.tp_group.get();
  model.tp_allreduce = [tp_group](float* p, size_t n) { tp_group->allreduce_sum(p, n); };

  if (rank0)
    std::printf("# loom-harness generate: tp %d, checkpoint %s (step %d, %d layers, dim %d, heads %d), %s\n", g.tp,
                o.ckpt.c_str(), ck->step, cfg.layers, cfg.dim, cfg.heads,
                o.top_k > 1 ? ("top-k " + std::to_string(o.top_k)).c_str() : "greedy");
  generate_and_report(model, *g.tp_group, stats, o);
  if (g.world->comm()) {
    double done = 0;
    g.world->allreduce_sum(&done, 1);
  }
  return 0;
}

}  // namespace loom::harness
