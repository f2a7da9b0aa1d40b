// loom-harness: Loom's reference consumer. `train` runs a GPT on a tp x pp x dp
// grid of ranks; `generate` serves it tensor-parallel with a KV cache.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "harness/generate.h"
#include "harness/train.h"

namespace {

using loom::harness::GenerateOptions;
using loom::harness::TrainOptions;

const char* kTrainHelp = R"(usage: loom-harness train [options]
Trains a byte-level GPT on a text file. Run with tp*pp*dp ranks under
loomrun / mpirun / torchrun (a 1x1x1 run needs no launcher). Rank 0 prints
one line per step: "step <n> loss <value> | ms | tok/s | GFLOP/s | MFU | comm".

parallelism
  --tp N              tensor-parallel ranks (heads and MLP split)         [1]
  --pp N              pipeline stages (layers split)                       [1]
  --dp N              data-parallel replicas (batch split)                 [1]
  --zero              ZeRO: reduce_scatter grads, shard AdamW, all_gather params
  --gpipe             GPipe schedule instead of 1F1B (pp > 1)
  --micro N           micro-batches per step per replica
                      [the largest divisor of batch/dp that is <= 2*pp; 1 without pp]
training
  --steps N           optimizer steps                                     [20]
  --seed S            initialisation and data seed                         [1]
  --batch N           global batch in sequences                            [8]
  --seq N             tokens per sequence                                 [64]
  --lr X              AdamW learning rate                               [1e-3]
  --weight-decay X    AdamW weight decay                                   [0]
  --data FILE         training text        [/usr/share/common-licenses/GPL-3]
  --ckpt FILE         save the trained weights to FILE
  --load FILE         continue from FILE's weights and step (the data goes on from
                      there; the optimizer's moments are not saved and start anew)
  --generate K        after training, generate K tokens (tp-parallel on the
                      first stage of replica 0) and report like `generate`
  --prompt TEXT       prompt for --generate                           ["The "]
  --top-k K           sampling for --generate (0 or 1: greedy)             [0]
model
  --layers N [2]  --dim N [64]  --heads N [4]  --ctx N (positions) [128]
diagnostics
  --inject-hang R:S   rank R sleeps forever before step S's first collective,
                      so you can see what Loom reports when a job hangs
  --timeout SEC       Loom's deadline for every wait (default: LOOM_TIMEOUT)
  --no-progress       no progress line on stderr
)";

const char* kGenerateHelp = R"(usage: loom-harness generate --ckpt FILE [options]
Loads a checkpoint and generates text, tensor-parallel over --tp ranks (run
under loomrun with that many ranks), with a KV cache. Rank 0 prints the
text, tokens/s, per-token latency and the share of time spent in collectives.

  --tp N              tensor-parallel ranks                                [1]
  --ckpt FILE         checkpoint written by `loom-harness train --ckpt`
  --prompt TEXT       prompt                                          ["The "]
  --tokens K          tokens to generate                                  [64]
  --top-k K           sample among the K most likely (0 or 1: greedy)      [0]
  --temperature X     sampling temperature                               [1.0]
  --seed S            sampling seed                                        [1]
  --timeout SEC       Loom's deadline for every wait
)";

const char* kMainHelp = R"(usage: loom-harness <command> [options]
Loom's reference consumer: a GPT trainer (tensor, pipeline and data
parallel, ZeRO) and a tensor-parallel inference server on loom::Comm.

commands
  train      train the model (loom-harness train --help)
  generate   generate text from a checkpoint (loom-harness generate --help)

example
  loomrun -n 4 loom-harness train --tp 2 --pp 2 --steps 50 --ckpt gpt.bin
  loomrun -n 2 loom-harness generate --tp 2 --ckpt gpt.bin --prompt "The "
)";

[[noreturn]] void usage_error(const std::string& msg, const char* help) {
  std::fprintf(stderr, "loom-harness: %s\n\n%s", msg.c_str(), help);
  std::exit(2);
}

// Parses argv[i+1] as the value of flag argv[i].
struct Args {
  int argc;
  char** argv;
  int i;
  const char* help;
  const char* value() {
    if (i + 1 >= argc) usage_error(std::string(argv[i]) + " needs a value", help);
    return argv[++i];
  }
  long integer() {
    const char* v = value();
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0') usage_error(std::string(argv[i - 1]) + ": not an integer: " + v, help);
    return x;
  }
  double real() {
    const char* v = value();
    char* end = nullptr;
    const double x = std::strtod(v, &end);
    if (*v == '\0' || *end != '\0') usage_error(std::string(argv[i - 1]) + ": not a number: " + v, help);
    return x;
  }
  int positive() {
    const long x = integer();
    if (x < 1 || x > 1 << 20) usage_error(std::string(argv[i - 1]) + " must be a positive integer", help);
    return static_cast<int>(x);
  }
};

int train_main(int argc, char** argv) {
  TrainOptions o;
  Args a{argc, argv, 0, kTrainHelp};
  for (a.i = 2; a.i < argc; ++a.i) {
    const std::string f = argv[a.i];
    if (f == "--help" || f == "-h") {
      std::fputs(kTrainHelp, stdout);
      return 0;
    } else if (f == "--tp") o.tp = a.positive();
    else if (f == "--pp") o.pp = a.positive();
    else if (f == "--dp") o.dp = a.positive();
    else if (f == "--zero") o.zero = true;
    else if (f == "--gpipe") o.gpipe = true;
    else if (f == "--micro") o.micro = a.positive();
    else if (f == "--steps") o.steps = a.positive();
    else if (f == "--seed") o.seed = static_cast<uint64_t>(a.integer());
    else if (f == "--batch") o.batch = a.positive();
    else if (f == "--seq") o.seq = a.positive();
    else if (f == "--lr") o.opt.lr = static_cast<float>(a.real());
    else if (f == "--weight-decay") o.opt.weight_decay = static_cast<float>(a.real());
    else if (f == "--data") o.data = a.value();
    else if (f == "--ckpt") o.ckpt = a.value();
    else if (f == "--load") o.load = a.value();
    else if (f == "--layers") o.model.layers = a.positive();
    else if (f == "--dim") o.model.dim = a.positive();
    else if (f == "--heads") o.model.heads = a.positive();
    else if (f == "--ctx") o.model.ctx = a.positive();
    else if (f == "--timeout") o.timeout_s = a.real();
    else if (f == "--no-progress") o.progress = false;
    else if (f == "--generate") o.generate = a.positive();
    else if (f == "--prompt") o.prompt = a.value();
    else if (f == "--top-k") o.top_k = static_cast<int>(a.integer());
    else if (f == "--inject-hang") {
      const std::string v = a.value();
      int used = 0;
      if (std::sscanf(v.c_str(), "%d:%d%n", &o.hang_rank, &o.hang_step, &used) != 2 ||
          used != static_cast<int>(v.size()) || o.hang_rank < 0 || o.hang_step < 1)
        usage_error("--inject-hang wants RANK:STEP (e.g. 1:3), got " + v, kTrainHelp);
    } else {
      usage_error("unknown option " + f, kTrainHelp);
    }
  }
  const loom::Status st = o.model.validate();
  if (!st.is_ok()) usage_error(st.to_string(), kTrainHelp);
  return loom::harness::run_train(o);
}

int generate_main(int argc, char** argv) {
  GenerateOptions o;
  Args a{argc, argv, 0, kGenerateHelp};
  for (a.i = 2; a.i < argc; ++a.i) {
    const std::string f = argv[a.i];
    if (f == "--help" || f == "-h") {
      std::fputs(kGenerateHelp, stdout);
      return 0;
    } else if (f == "--tp") o.tp = a.positive();
    else if (f == "--ckpt") o.ckpt = a.value();
    else if (f == "--prompt") o.prompt = a.value();
    else if (f == "--tokens") o.tokens = a.positive();
    else if (f == "--top-k") o.top_k = static_cast<int>(a.integer());
    else if (f == "--temperature") o.temperature = static_cast<float>(a.real());
    else if (f == "--seed") o.seed = static_cast<uint64_t>(a.integer());
    else if (f == "--timeout") o.timeout_s = a.real();
    else usage_error("unknown option " + f, kGenerateHelp);
  }
  if (o.ckpt.empty()) usage_error("generate needs --ckpt FILE", kGenerateHelp);
  return loom::harness::run_generate(o);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(kMainHelp, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "train")) return train_main(argc, argv);
  if (!std::strcmp(argv[1], "generate")) return generate_main(argc, argv);
  usage_error(std::string("unknown command ") + argv[1], kMainHelp);
}
