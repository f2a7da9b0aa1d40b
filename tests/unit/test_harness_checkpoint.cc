// Checkpoints of the harness: a round trip preserves every weight and the
// model's output; any tp/pp sharding saves and loads the same canonical file;
// damaged files are refused with a precise error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "harness/checkpoint.h"
#include "harness/data.h"
#include "harness/model.h"

namespace loom::harness {
namespace {

namespace fs = std::filesystem;

class HarnessCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("loom_harness_ckpt_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    cfg_.ctx = 16;
    cfg_.layers = 4;
    cfg_.dim = 16;
    cfg_.heads = 4;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const char* name) const { return (dir_ / name).string(); }
  fs::path dir_;
  ModelConfig cfg_;
};

TEST_F(HarnessCheckpoint, RoundTripKeepsWeightsAndOutputs) {
  Checkpoint ck;
  ck.config = cfg_;
  ck.step = 17;
  ck.params = init_full_params(cfg_, 21);
  ASSERT_TRUE(save_checkpoint(path("a.bin"), ck).is_ok());
  Result<Checkpoint> back = load_checkpoint(path("a.bin"));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->config, cfg_);
  EXPECT_EQ(back->step, 17);
  EXPECT_EQ(back->params, ck.params);

  std::vector<uint8_t> text(200);
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<uint8_t>('a' + (i * 7) % 26);
  const Batch batch = global_batch(text, 1, 1, 2, 8);
  Gpt<float> m1(cfg_, Shard{}), m2(cfg_, Shard{});
  m1.load_full(ck.params.data());
  m2.load_full(back->params.data());
  m1.forward(0, 2, 8, batch.inputs.data(), nullptr, batch.targets.data());
  m2.forward(0, 2, 8, batch.inputs.data(), nullptr, batch.targets.data());
  EXPECT_EQ(m1.loss_sum(0), m2.loss_sum(0));
}

TEST_F(HarnessCheckpoint, ShardsRebuildTheFullModel) {
  const std::vector<float> full = init_full_params(cfg_, 5);
  for (int tp : {1, 2, 4})
    for (int pp : {1, 2, 3}) {
      // Sum of every rank's owned slices (zeros elsewhere), as the trainer's
      // reduce to rank 0 computes it.
      std::vector<float> rebuilt(full.size(), 0.0f);
      for (int s = 0; s < pp; ++s)
        for (int r = 0; r < tp; ++r) {
          Shard sh;
          sh.tp_rank = r;
          sh.tp_size = tp;
          stage_layers(cfg_.layers, pp, s, &sh.layer_begin, &sh.layer_end);
          Gpt<float> m(cfg_, sh);
          m.load_full(full.data());
          std::vector<float> mine(full.size(), 0.0f);
          m.store_full(mine.data(), /*owned_only=*/true);
          for (size_t i = 0; i < full.size(); ++i) rebuilt[i] += mine[i];
        }
      EXPECT_EQ(rebuilt, full) << "tp " << tp << " pp " << pp;
    }
}

TEST_F(HarnessCheckpoint, DamagedFilesAreRefused) {
  Checkpoint ck;
  ck.config = cfg_;
  ck.params = init_full_params(cfg_, 1);
  ASSERT_TRUE(save_checkpoint(path("good.bin"), ck).is_ok());
  const auto size = fs::file_size(path("good.bin"));

  fs::copy_file(path("good.bin"), path("short.bin"));
  fs::resize_file(path("short.bin"), size - 4);
  Result<Checkpoint> r = load_checkpoint(path("short.bin"));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().to_string();

  {
    std::ofstream f(path("junk.bin"), std::ios::binary);
    f << "this is not a checkpoint at all";
  }
  r = load_checkpoint(path("junk.bin"));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("not a Loom harness checkpoint"), std::string::npos);

  r = load_checkpoint(path("missing.bin"));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kSystemError);

  ck.params.pop_back();
  EXPECT_FALSE(save_checkpoint(path("bad.bin"), ck).is_ok());
}

// A header that promises more than the file holds is refused before
// anything is allocated; sizes far out of range are refused outright.
// Regression: ctx = 2^30 ended in std::bad_alloc (std::terminate).
TEST_F(HarnessCheckpoint, AHeaderPromisingMoreThanTheFileHoldsIsRefused) {
  auto write_header = [&](const char* name, const int32_t (&hdr)[6], int64_t count) {
    std::ofstream f(path(name), std::ios::binary);
    f.write("LOOMGPT1", 8);
    f.write(reinterpret_cast<const char*>(hdr), sizeof hdr);
    f.write(reinterpret_cast<const char*>(&count), sizeof count);
    const float some[4] = {1, 2, 3, 4};
    f.write(reinterpret_cast<const char*>(some), sizeof some);
  };
  ModelConfig huge = cfg_;
  huge.ctx = 1 << 30;
  const int32_t big[6] = {huge.vocab, huge.ctx, huge.layers, huge.dim, huge.heads, 5};
  write_header("huge.bin", big, 0);
  Result<Checkpoint> r = load_checkpoint(path("huge.bin"));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("out of range"), std::string::npos) << r.status().to_string();

  const int32_t fits[6] = {cfg_.vocab, cfg_.ctx, cfg_.layers, cfg_.dim, cfg_.heads, 5};
  write_header("short.bin", fits, static_cast<int64_t>(full_param_count(cfg_)));
  r = load_checkpoint(path("short.bin"));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("the header promises"), std::string::npos) << r.status().to_string();
}

// A save that fails leaves no temporary file. Regression: path.tmp stayed.
TEST_F(HarnessCheckpoint, AFailedSaveLeavesNoTemporaryFile) {
  Checkpoint ck;
  ck.config = cfg_;
  ck.params = init_full_params(cfg_, 1);
  fs::create_directories(dir_ / "taken");  // rename onto a directory fails
  EXPECT_FALSE(save_checkpoint(path("taken"), ck).is_ok());
  EXPECT_FALSE(fs::exists(path("taken.tmp")));
}

}  // namespace
}  // namespace loom::harness
