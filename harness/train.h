// Training: the GPT on a tp x pp x dp grid of ranks.
//
// What makes a parallel run reproduce the single-rank run: every rank
// initialises the full model from the seed and keeps its slice; every rank
// derives the same global batch for a step and takes its data-parallel part;
// the loss is scaled by 1 / (tokens of the global batch) before any sum, so
// summing gradients over micro-batches and dp ranks gives the global mean.
#pragma once

#include <cstdint>
#include <string>

#include "harness/adamw.h"
#include "harness/model.h"

namespace loom::harness {

struct TrainOptions {
  ModelConfig model;
  int tp = 1, pp = 1, dp = 1;
  int steps = 20;
  int batch = 8;         // global batch, sequences
  int seq = 64;          // tokens per sequence
  int micro = 0;         // micro-batches per step per dp rank; 0 = largest divisor of batch/dp <= 2*pp (1 without pp)
  uint64_t seed = 1;
  bool zero = false;     // ZeRO: reduce_scatter grads, sharded AdamW, all_gather params
  bool gpipe = false;    // GPipe schedule instead of 1F1B
  std::string data = "";         // training text; empty = kDefaultText
  std::string ckpt;              // save the trained weights here
  std::string load;              // start from these weights instead of the seed
  AdamWConfig opt;
  int hang_rank = -1, hang_step = -1;  // --inject-hang RANK:STEP
  double timeout_s = 0;                // Loom deadline; <= 0 keeps Loom's default
  bool progress = true;                // progress line on stderr (when it is a terminal)
  int generate = 0;                    // after training, generate this many tokens (tp-parallel)
  std::string prompt = "The ";
  int top_k = 0;
};

// Runs the job on this rank; returns the process exit status.
int run_train(const TrainOptions& opts);

// Model FLOPs of one training step (forward + backward = 3x forward) for
// `tokens` tokens of sequences of length `seq` (Megatron / llm.c counting).
double train_flops_per_step(const ModelConfig& cfg, int seq, double tokens);

// Single-core float32 matmul throughput of this machine, FLOP/s, measured
// with the harness's own kernel (the "peak" in the MFU figure).
double measure_matmul_peak();

}  // namespace loom::harness
