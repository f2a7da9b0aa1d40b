// Golden equivalence of the harness: with the same seed and global batch,
// tensor-, pipeline- and data-parallel runs (2, 4 and 8 processes under
// loomrun) follow the single-rank run's loss curve within 1e-4 per step for
// 20 steps, and their checkpoints generate the same 64 greedy tokens, also
// when served tensor-parallel. Also: --inject-hang ends in Loom's timeout
// error instead of a silent hang.
//
// Binaries come from $LOOM_BUILD_DIR/bin (set by CTest).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 20;
constexpr double kLossTolerance = 1e-4;
constexpr int kGenTokens = 64;

std::string build_dir() {
  const char* d = std::getenv("LOOM_BUILD_DIR");
  return d ? d : "build";
}
std::string harness() { return build_dir() + "/bin/loom-harness"; }
std::string loomrun() { return build_dir() + "/bin/loomrun"; }

struct Proc {
  int status = -1;
  std::string out;  // stdout and stderr
};

Proc run_cmd(const std::string& cmd) {
  Proc r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

// "step <n> loss <value>" lines, in order.
std::vector<double> losses(const std::string& out) {
  std::vector<double> l;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    int step = 0;
    double loss = 0;
    if (std::sscanf(line.c_str(), "step %d loss %lf", &step, &loss) == 2) {
      EXPECT_EQ(step, static_cast<int>(l.size()) + 1) << line;
      l.push_back(loss);
    }
  }
  return l;
}

// The `text "..."` line of generate's output.
std::string generated(const std::string& out) {
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("text \"", 0) == 0) return line;
  return "";
}

class HarnessGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("loom_harness_golden_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
    if (!fs::exists(harness())) return;
    const Proc r = run_cmd(harness() + " train --no-progress --steps " + std::to_string(kSteps) + " --ckpt " +
                      (*dir_ / "single.bin").string());
    ref_out_ = new std::string(r.out);
    ref_loss_ = new std::vector<double>(losses(r.out));
    const Proc g = run_cmd(generate_cmd(1, *dir_ / "single.bin"));
    ref_text_ = new std::string(generated(g.out));
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
  }
  void SetUp() override {
    // A missing binary is a failure, not a skip: CTest builds both first.
    ASSERT_TRUE(fs::exists(harness())) << harness() << " not built (set LOOM_BUILD_DIR)";
    ASSERT_TRUE(fs::exists(loomrun())) << loomrun() << " not built (set LOOM_BUILD_DIR)";
    ASSERT_EQ(ref_loss_->size(), static_cast<size_t>(kSteps)) << *ref_out_;
    ASSERT_FALSE(ref_text_->empty());
  }

  static std::string generate_cmd(int tp, const fs::path& ckpt) {
    const std::string gen = harness() + " generate --tp " + std::to_string(tp) + " --ckpt " + ckpt.string() +
                            " --tokens " + std::to_string(kGenTokens) + " --prompt 'The '";
    return tp == 1 ? gen : loomrun() + " --no-prefix -n " + std::to_string(tp) + " -- " + gen;
  }

  // Trains with `flags` on `ranks` processes and compares with the reference.
  void check(int ranks, const std::string& flags, const std::string& name) {
    const fs::path ckpt = *dir_ / (name + ".bin");
    const Proc r = run_cmd(loomrun() + " --no-prefix -n " + std::to_string(ranks) + " -- " + harness() +
                      " train --no-progress --steps " + std::to_string(kSteps) + " " + flags + " --ckpt " +
                      ckpt.string());
    ASSERT_EQ(r.status, 0) << r.out;
    const std::vector<double> l = losses(r.out);
    ASSERT_EQ(l.size(), ref_loss_->size()) << r.out;
    double worst = 0;
    for (size_t i = 0; i < l.size(); ++i) {
      EXPECT_NEAR(l[i], (*ref_loss_)[i], kLossTolerance) << "step " << i + 1;
      worst = std::max(worst, std::abs(l[i] - (*ref_loss_)[i]));
    }
    // The curve must actually descend, or matching it would prove little.
    EXPECT_LT(l.back(), l.front() - 0.3);
    std::printf("%s: %d ranks, max |loss diff| over %d steps %.2e\n", name.c_str(), ranks, kSteps, worst);
    const Proc g = run_cmd(generate_cmd(1, ckpt));
    ASSERT_EQ(g.status, 0) << g.out;
    EXPECT_EQ(generated(g.out), *ref_text_) << "greedy generation from the " << name << " checkpoint";
  }

  static fs::path* dir_;
  static std::string* ref_out_;
  static std::vector<double>* ref_loss_;
  static std::string* ref_text_;
};

fs::path* HarnessGolden::dir_ = nullptr;
std::string* HarnessGolden::ref_out_ = nullptr;
std::vector<double>* HarnessGolden::ref_loss_ = nullptr;
std::string* HarnessGolden::ref_text_ = nullptr;

TEST_F(HarnessGolden, TensorParallel2) { check(2, "--tp 2", "tp2"); }
TEST_F(HarnessGolden, PipelineParallel2OneFOneB) { check(2, "--pp 2", "pp2"); }
TEST_F(HarnessGolden, PipelineParallel2GPipe) { check(2, "--pp 2 --gpipe", "pp2_gpipe"); }
TEST_F(HarnessGolden, DataParallel2) { check(2, "--dp 2", "dp2"); }
TEST_F(HarnessGolden, DataParallel2Zero) { check(2, "--dp 2 --zero", "dp2_zero"); }
TEST_F(HarnessGolden, Tp2Pp2) { check(4, "--tp 2 --pp 2", "tp2pp2"); }
TEST_F(HarnessGolden, Tp2Pp2Dp2) { check(8, "--tp 2 --pp 2 --dp 2", "tp2pp2dp2"); }
TEST_F(HarnessGolden, Tp2Pp2Dp2Zero) { check(8, "--tp 2 --pp 2 --dp 2 --zero", "tp2pp2dp2_zero"); }

TEST_F(HarnessGolden, TensorParallelInferenceMatchesSingleRank) {
  for (int tp : {2, 4}) {
    const Proc g = run_cmd(generate_cmd(tp, *dir_ / "single.bin"));
    ASSERT_EQ(g.status, 0) << g.out;
    EXPECT_EQ(generated(g.out), *ref_text_) << "tp " << tp;
    EXPECT_NE(g.out.find("collectives"), std::string::npos) << g.out;
  }
}

TEST_F(HarnessGolden, InjectedHangEndsInLoomTimeout) {
  const Proc r = run_cmd("timeout 120 " + loomrun() + " --no-prefix -n 2 -- " + harness() +
                    " train --no-progress --dp 2 --steps 5 --timeout 2 --inject-hang 1:3");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.status, 124) << "the job hung instead of failing:\n" << r.out;
  EXPECT_EQ(losses(r.out).size(), 2u) << r.out;  // steps before the hang completed
  EXPECT_NE(r.out.find("--inject-hang: sleeping forever before step 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Timeout"), std::string::npos) << r.out;
}

// Generation after training that outlasts the deadline: the ranks that do
// not generate keep pace token by token. Regression: they waited in one
// allreduce for the whole text, timed out, and the text was lost.
TEST_F(HarnessGolden, GenerationLongerThanTheDeadlineCompletes) {
  const Proc r = run_cmd("timeout 120 " + loomrun() + " --no-prefix -n 2 -- " + harness() +
                         " train --no-progress --pp 2 --steps 1 --batch 2 --seq 8 --dim 256 --heads 4 --layers 4 "
                         "--ctx 256 --generate 200 --timeout 1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(generated(r.out).empty()) << r.out;
  // The run must really outlast the deadline for this to test anything.
  double decode_ms = 0;
  const size_t at = r.out.find("decode 200 tokens ");
  ASSERT_NE(at, std::string::npos) << r.out;
  std::sscanf(r.out.c_str() + at, "decode 200 tokens %lf ms", &decode_ms);
  EXPECT_GT(decode_ms, 1000) << "generation was faster than the deadline; make the model bigger\n" << r.out;
}

// --load continues: steps (and data) go on from the checkpoint's, and the
// new checkpoint carries the total. Regression: steps restarted at 1.
TEST_F(HarnessGolden, LoadContinuesTheStepCount) {
  const fs::path a = *dir_ / "first.bin", b = *dir_ / "second.bin";
  const Proc r1 = run_cmd(harness() + " train --no-progress --steps 2 --ckpt " + a.string());
  ASSERT_EQ(r1.status, 0) << r1.out;
  const Proc r2 = run_cmd(harness() + " train --no-progress --steps 2 --load " + a.string() + " --ckpt " + b.string());
  ASSERT_EQ(r2.status, 0) << r2.out;
  EXPECT_NE(r2.out.find("step 3 loss"), std::string::npos) << r2.out;
  EXPECT_NE(r2.out.find("step 4 loss"), std::string::npos) << r2.out;
  EXPECT_EQ(r2.out.find("step 1 loss"), std::string::npos) << r2.out;
  EXPECT_NE(r2.out.find("step 4)"), std::string::npos) << "saved with the total step count\n" << r2.out;
}

// The default micro-batch count divides the local batch. Regression: with
// --pp 2 --batch 6 it was 4 and the run refused to start.
TEST_F(HarnessGolden, DefaultMicroBatchesDivideTheBatch) {
  const Proc r = run_cmd(loomrun() + " --no-prefix -n 2 -- " + harness() +
                         " train --no-progress --pp 2 --batch 6 --layers 3 --steps 1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("(3 micro-batches of 2)"), std::string::npos) << r.out;
}

// --inject-hang that could only hang for good or do nothing is refused.
TEST_F(HarnessGolden, InjectHangThatCannotWorkIsRefused) {
  const Proc alone = run_cmd("timeout 60 " + harness() + " train --no-progress --steps 2 --inject-hang 0:1 --timeout 1");
  EXPECT_NE(alone.status, 0) << alone.out;
  EXPECT_NE(alone.status, 124) << "a lone rank hung for good:\n" << alone.out;
  EXPECT_NE(alone.out.find("needs more than one rank"), std::string::npos) << alone.out;
  const Proc nobody = run_cmd("timeout 60 " + loomrun() + " --no-prefix -n 2 -- " + harness() +
                              " train --no-progress --dp 2 --steps 1 --inject-hang 5:1");
  EXPECT_NE(nobody.status, 0) << nobody.out;
  EXPECT_NE(nobody.out.find("rank 5 does not exist"), std::string::npos) << nobody.out;
  const Proc junk = run_cmd(harness() + " train --no-progress --steps 1 --inject-hang 1:3x");
  EXPECT_NE(junk.status, 0) << junk.out;
  EXPECT_NE(junk.out.find("--inject-hang wants RANK:STEP"), std::string::npos) << junk.out;
}

}  // namespace
