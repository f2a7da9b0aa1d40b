#include "harness/train.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

#include "harness/checkpoint.h"
#include "harness/data.h"
#include "harness/dist.h"
#include "harness/generate.h"
#include "harness/ops.h"

namespace loom::harness {

double train_flops_per_step(const ModelConfig& cfg, int seq, double tokens) {
  const double c = cfg.dim, l = cfg.layers;
  // Per token, forward: 2 FLOPs per weight of every matmul (qkv 3c^2, proj c^2,
  // fc 4c^2, fcproj 4c^2, LM head c*V) plus causal attention (QK^T and AV over
  // on average (seq+1)/2 positions).
  const double matmul = 2.0 * (l * 12.0 * c * c + c * cfg.vocab);
  const double attention = l * 2.0 * 2.0 * c * (seq + 1) / 2.0;
  return 3.0 * (matmul + attention) * tokens;
}

double measure_matmul_peak() {
  const int n = 256, ic = 256, oc = 256;
  std::vector<float> a(static_cast<size_t>(n) * ic, 0.5f), w(static_cast<size_t>(oc) * ic, 0.25f),
      out(static_cast<size_t>(n) * oc);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now_s();
    matmul_forward(out.data(), a.data(), w.data(), static_cast<const float*>(nullptr), n, ic, oc);
    best = std::min(best, now_s() - t0);
  }
  return 2.0 * n * ic * oc / best;
}

namespace {

struct Trainer {
  const TrainOptions& o;
  Grid& g;
  Gpt<float>& model;
  int micro, mb_size;  // micro-batches per step and sequences per micro-batch
  std::vector<float> act_in, grad_in;
  std::vector<std::pair<Work, size_t>> pending;  // data-parallel bucket allreduces in flight

  bool first() const { return g.pp_rank == 0; }
  bool last() const { return g.pp_rank == g.pp - 1; }
  size_t act_count() const { return static_cast<size_t>(mb_size) * o.seq * o.model.dim; }

  // Pipeline point-to-point, named as in Megatron's schedules.
  void p2p(bool send_fwd, bool recv_bwd, bool send_bwd, bool recv_fwd, int fwd_mb) {
    std::vector<Group::P2p> ops;
    if (send_fwd && !last()) ops.push_back({const_cast<float*>(model.output(fwd_mb)), act_count(), g.pp_rank + 1, true});
    if (recv_bwd && !last()) ops.push_back({grad_in.data(), act_count(), g.pp_rank + 1, false});
    if (send_bwd && !first()) ops.push_back({const_cast<float*>(model.input_grad()), act_count(), g.pp_rank - 1, true});
    if (recv_fwd && !first()) ops.push_back({act_in.data(), act_count(), g.pp_rank - 1, false});
    g.pp_group->exchange(ops);
  }

  void forward(int i, const std::vector<Batch>& mbs) {
    model.forward(i, mbs[i].b, mbs[i].t, mbs[i].inputs.data(), act_in.data(), mbs[i].targets.data());
  }

  void backward(int i, bool final_mb) {
    const float scale = 1.0f / (static_cast<float>(o.batch) * o.seq);
    const bool overlap = final_mb && g.dp > 1 && !o.zero;
    model.backward(i, grad_in.data(), scale, [&](int bucket) {
      if (!overlap) return;
      // This bucket's gradients are final: start summing them across the
      // data-parallel replicas while backward continues with earlier layers.
      const auto& r = model.grad_buckets()[bucket];
      pending.emplace_back(g.dp_group->allreduce_sum_async(model.grads().data() + r.offset, r.count), r.count);
    });
  }

  // Megatron's non-interleaved 1F1B: warm-up forwards, steady one-forward-
  // one-backward, cool-down backwards. Where a stage both sends and receives
  // in one step the pair runs inside one group_start/group_end.
  void one_f_one_b(const std::vector<Batch>& mbs) {
    const int warmup = std::min(g.pp - g.pp_rank - 1, micro), remaining = micro - warmup;
    int f = 0, b = 0;
    for (int k = 0; k < warmup; ++k, ++f) {
      p2p(false, false, false, true, f);
      forward(f, mbs);
      p2p(true, false, false, false, f);
    }
    if (remaining > 0) p2p(false, false, false, true, f);
    for (int k = 0; k < remaining; ++k, ++f, ++b) {
      forward(f, mbs);
      p2p(true, true, false, false, f);
      backward(b, b == micro - 1);
      p2p(false, false, true, k + 1 < remaining, f);
    }
    for (int k = 0; k < warmup; ++k, ++b) {
      p2p(false, true, false, false, 0);
      backward(b, b == micro - 1);
      p2p(false, false, true, false, 0);
    }
  }

  // GPipe: all forwards, then all backwards.
  void gpipe(const std::vector<Batch>& mbs) {
    for (int i = 0; i < micro; ++i) {
      p2p(false, false, false, true, i);
      forward(i, mbs);
      p2p(true, false, false, false, i);
    }
    for (int i = 0; i < micro; ++i) {
      p2p(false, true, false, false, 0);
      backward(i, i == micro - 1);
      p2p(false, false, true, false, 0);
    }
  }

  // The tied embedding: first and last stage each hold a copy; both add the
  // other's gradient (a + b == b + a, so the copies stay bit-identical).
  void tie_embeddings() {
    if (g.pp == 1) return;
    if (!first() && !last()) return;
    const auto r = model.wte_range();
    std::vector<float> other(r.count);
    const int peer = first() ? g.pp - 1 : 0;
    g.pp_group->exchange({{model.grads().data() + r.offset, r.count, peer, true}, {other.data(), r.count, peer, false}});
    float* gw = model.grads().data() + r.offset;
    for (size_t i = 0; i < r.count; ++i) gw[i] += other[i];
  }
};

[[noreturn]] void hang_forever(int rank, int step) {
  std::fprintf(stderr, "loom-harness: rank %d: --inject-hang: sleeping forever before step %d's first collective\n",
               rank, step);
  std::fflush(stderr);
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

}  // namespace

int run_train(const TrainOptions& o) {
  CommStats stats;
  Result<Grid> grid = make_grid(o.tp, o.pp, o.dp, &stats, o.timeout_s);
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
  if (o.batch % o.dp != 0) return fail("--batch must be a multiple of --dp");
  const int local_batch = o.batch / o.dp;
  // Default: the largest divisor of the local batch up to 2*pp. Regression:
  // min(2*pp, local batch) failed the check below for ordinary settings
  // (--pp 3 with the default batch 8) with an error about --micro.
  int micro = o.micro;
  if (micro <= 0) {
    micro = 1;
    if (o.pp > 1)
      for (int m = std::min(2 * o.pp, local_batch); m >= 1; --m)
        if (local_batch % m == 0) {
          micro = m;
          break;
        }
  }
  if (local_batch % micro != 0)
    return fail("--batch / --dp (" + std::to_string(local_batch) + ") must be a multiple of --micro (" +
                std::to_string(micro) + ")");
  // A hang injected where no peer waits would hang for good, one on a rank
  // that does not exist would do nothing. Regression: both were accepted.
  if (o.hang_step > 0 && g.world_size == 1)
    return fail("--inject-hang needs more than one rank (alone, no peer's deadline can fire)");
  if (o.hang_step > 0 && o.hang_rank >= g.world_size)
    return fail("--inject-hang: rank " + std::to_string(o.hang_rank) + " does not exist (world size " +
                std::to_string(g.world_size) + ")");
  if (o.model.heads % o.tp != 0) return fail("--heads must be a multiple of --tp");
  if (o.pp > o.model.layers) return fail("--pp must not exceed --layers");
  if (o.seq > o.model.ctx) return fail("--seq must not exceed --ctx");
  if (o.generate > 0 && (o.prompt.empty() || static_cast<int>(o.prompt.size()) + o.generate - 1 > o.model.ctx))
    return fail("--prompt must be non-empty and prompt + --generate must fit in --ctx positions");

  Result<std::vector<uint8_t>> text = load_text(o.data.empty() ? kDefaultText : o.data);
  if (!text.is_ok()) return fail(text.status().to_string());

  Shard shard;
  shard.tp_rank = g.tp_rank;
  shard.tp_size = g.tp;
  stage_layers(o.model.layers, g.pp, g.pp_rank, &shard.layer_begin, &shard.layer_end);
  Gpt<float> model(o.model, shard, o.zero ? static_cast<size_t>(g.dp) : 1);
  // Every rank builds the full model from the seed (or the checkpoint) and
  // keeps its slice: shards equal the single-rank weights exactly.
  // --load continues the run: its steps (and so the data) go on from the
  // checkpoint's. Regression: they restarted at 1 (the first batches again)
  // and the new checkpoint was labelled with this run's steps only.
  int loaded_step = 0;
  if (!o.load.empty()) {
    Result<Checkpoint> ck = load_checkpoint(o.load);
    if (!ck.is_ok()) return fail(ck.status().to_string());
    if (!(ck->config == o.model)) return fail("--load: the checkpoint's model shape differs from the flags");
    model.load_full(ck->params.data());
    loaded_step = std::max(0, ck->step);
  } else {
    const std::vector<float> full = init_full_params(o.model, o.seed);
    model.load_full(full.data());
  }
  Group* tp_group = g.tp_group.get();
  model.tp_allreduce = [tp_group](float* p, size_t n) { tp_group->allreduce_sum(p, n); };

  const size_t shard_len = model.params().size() / (o.zero ? g.dp : 1);
  AdamW opt(shard_len, o.opt);
  std::vector<float> grad_shard(o.zero ? shard_len : 0);

  Trainer tr{o, g, model, micro, local_batch / micro, {}, {}, {}};
  tr.act_in.resize(tr.act_count());
  tr.grad_in.resize(tr.act_count());

  // The peak is measured on rank 0 alone while the others wait in the
  // allreduce below, so ranks sharing cores do not skew it.
  double peak = 0;
  if (rank0) peak = measure_matmul_peak();
  double sync = 0;
  g.world->allreduce_sum(&sync, 1);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const double peak_total = peak * std::min<unsigned>(cores, static_cast<unsigned>(g.world_size));
  const double flops = train_flops_per_step(o.model, o.seq, static_cast<double>(o.batch) * o.seq);
  if (rank0)
    std::printf("# loom-harness train: tp %d pp %d dp %d (%d ranks)%s%s, %d layers, dim %d, heads %d, seq %d, "
                "batch %d (%d micro-batches of %d), %zu parameters, matmul peak %.2f GFLOP/s/core\n",
                g.tp, g.pp, g.dp, g.world_size, o.zero ? " zero" : "", g.pp > 1 ? (o.gpipe ? " gpipe" : " 1f1b") : "",
                o.model.layers, o.model.dim, o.model.heads, o.seq, o.batch, micro, tr.mb_size,
                full_param_count(o.model), peak / 1e9);
  const bool show_progress = rank0 && o.progress && isatty(STDERR_FILENO);
  const double t_start = now_s();

  for (int run_step = 1; run_step <= o.steps; ++run_step) {
    const int step = loaded_step + run_step;  // numbers the data and the output
    if (run_step == o.hang_step && g.world_rank == o.hang_rank) hang_forever(g.world_rank, step);
    stats.reset();
    const double t0 = now_s();
    const Batch batch = global_batch(*text, o.seed, step, o.batch, o.seq);
    std::vector<Batch> mbs;
    for (int i = 0; i < micro; ++i) mbs.push_back(slice_batch(batch, g.dp_rank * local_batch + i * tr.mb_size, tr.mb_size));

    model.zero_grads();
    if (g.pp > 1 && !o.gpipe)
      tr.one_f_one_b(mbs);
    else
      tr.gpipe(mbs);  // with one stage this is simply forward/backward per micro-batch
    for (const auto& [w, n] : tr.pending) g.dp_group->wait(w, "allreduce", n * sizeof(float));
    tr.pending.clear();
    tr.tie_embeddings();

    float* p = model.params().data();
    if (o.zero && g.dp > 1) {
      g.dp_group->reduce_scatter_sum(model.grads().data(), grad_shard.data(), shard_len);
      float* mine = p + static_cast<size_t>(g.dp_rank) * shard_len;
      opt.update(mine, grad_shard.data(), run_step);  // the moments start with this run
      g.dp_group->all_gather_inplace(p, shard_len);
    } else {
      opt.update(p, model.grads().data(), run_step);
    }

    // Loss of the global batch: the last stage's tp rank 0 of every replica contributes.
    double loss = 0;
    if (tr.last() && g.tp_rank == 0)
      for (int i = 0; i < micro; ++i) loss += model.loss_sum(i);
    g.world->allreduce_sum(&loss, 1);
    loss /= static_cast<double>(o.batch) * o.seq;

    const double dt = now_s() - t0;
    if (rank0) {
      if (show_progress) {
        std::fprintf(stderr, "\r\033[K");  // clear the progress line when both go to one terminal
        std::fflush(stderr);
      }
      const double achieved = flops / dt;
      std::printf("step %d loss %.6f | %.1f ms | %.0f tok/s | %.3f GFLOP/s | MFU %.1f%% | comm %.1f ms%s%s\n", step, loss,
                  dt * 1e3, o.batch * o.seq / dt, achieved / 1e9, peak_total > 0 ? 100.0 * achieved / peak_total : 0.0,
                  stats.total_seconds() * 1e3, stats.by_kind().empty() ? "" : ": ", stats.summary().c_str());
      std::fflush(stdout);
    }
    if (show_progress) {
      const double el = now_s() - t_start;
      const int width = 30, done = width * run_step / o.steps;
      std::fprintf(stderr, "\r[%.*s%*s] step %d/%d loss %.4f eta %.1fs ", done, "==============================",
                   width - done, "", step, loaded_step + o.steps, loss, el / run_step * (o.steps - run_step));
      if (run_step == o.steps) std::fprintf(stderr, "\n");
      std::fflush(stderr);
    }
  }

  if (!o.ckpt.empty() || o.generate > 0) {
    // Each element of the full model is written by exactly one rank (zeros
    // elsewhere), so a sum rebuilds it bit-exactly: to rank 0 for the
    // checkpoint, to every rank when the job generates afterwards.
    Checkpoint ck;
    ck.config = o.model;
    ck.step = loaded_step + o.steps;
    std::vector<float> mine(full_param_count(o.model), 0.0f);
    if (g.dp_rank == 0) model.store_full(mine.data(), /*owned_only=*/true);
    if (o.generate > 0) {
      g.world->allreduce_sum(mine.data(), mine.size());
      ck.params = mine;
    } else {
      ck.params.assign(mine.size(), 0.0f);
      g.world->reduce_sum_to_root(mine.data(), ck.params.data(), mine.size());
    }
    if (rank0 && !o.ckpt.empty()) {
      const Status st = save_checkpoint(o.ckpt, ck);
      if (!st.is_ok()) return fail(st.to_string());
      std::printf("# saved %s (%zu parameters, step %d)\n", o.ckpt.c_str(), ck.params.size(), ck.step);
    }
    // Ranks that do not generate wait for the ones that do token by token:
    // one small allreduce per token over the world keeps every wait under
    // the deadline however long the text. Regression: they waited in one
    // allreduce for the whole generation and timed out (LOOM_TIMEOUT or
    // --timeout), and the text was lost.
    const bool generates = g.pp_rank == 0 && g.dp_rank == 0;
    auto heartbeat = [&g] {
      double beat = 0;
      g.world->allreduce_sum(&beat, 1);
    };
    if (o.generate > 0 && !generates)
      for (int i = 0; i < o.generate; ++i) heartbeat();
    if (o.generate > 0 && generates) {
      // The first replica's first-stage ranks form a tp group: they serve the
      // whole model, tensor-parallel, as `loom-harness generate --tp` would.
      Shard whole;
      whole.tp_rank = g.tp_rank;
      whole.tp_size = g.tp;
      Gpt<float> server(o.model, whole);
      server.load_full(ck.params.data());
      server.tp_allreduce = [tp_group](float* p, size_t n) { tp_group->allreduce_sum(p, n); };
      GenerateOptions go;
      go.prompt = o.prompt;
      go.tokens = o.generate;
      go.top_k = o.top_k;
      go.seed = o.seed;
      go.on_token = heartbeat;
      if (rank0) std::printf("# generating %d tokens on the tp group of rank 0 (tp %d)\n", o.generate, g.tp);
      std::fflush(stdout);
      generate_and_report(server, *g.tp_group, stats, go);
    }
  }
  if (g.world->comm()) {
    double done = 0;
    g.world->allreduce_sum(&done, 1);  // nobody tears down while a peer still reads
  }
  return 0;
}

}  // namespace loom::harness
