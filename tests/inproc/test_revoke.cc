// Comm::revoke with ranks as threads: operations in flight end with "revoked
// by rank R" on the revoking rank and on peers blocked with it, new work is
// refused with kInvalidUsage, and split() / shrink() of the revoked
// communicator give working communicators.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>
#include <cstdint>
#include <thread>

#include "common/test_util.h"

namespace loom {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kN = 4;
constexpr size_t kBig = 1 << 22;  // floats

std::vector<std::unique_ptr<Comm>> make_comms() {
  Config cfg;
  cfg.timeout_s = 30;
  auto c = Comm::init_all(kN, cfg);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return c.is_ok() ? std::move(c).value() : std::vector<std::unique_ptr<Comm>>{};
}

bool wait_quiescent(Comm& c, std::chrono::milliseconds limit) {
  auto until = Clock::now() + limit;
  while (!c.quiescent() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return c.quiescent();
}

// Ranks 0..2 start a large allreduce that rank 3 never joins.
void start_without_rank3(std::vector<std::unique_ptr<Comm>>& comms, std::vector<std::vector<float>>& bufs,
                         std::vector<Work>& works) {
  for (int r = 0; r < 3; ++r) {
    bufs[r].assign(kBig, 1.0f);
    auto w = comms[r]->allreduce(bufs[r].data(), bufs[r].data(), kBig, DataType::kFloat32, RedOp::kSum);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    works[r] = *w;
  }
}

// Sum-allreduce on `comms` (one thread each): old rank r adds r+1 at every element.
void check_allreduce(std::vector<std::unique_ptr<Comm>>& comms, int64_t expect) {
  std::vector<std::vector<int64_t>> v(comms.size());
  std::vector<Status> st(comms.size());
  std::vector<std::thread> t;
  for (size_t r = 0; r < comms.size(); ++r) {
    if (!comms[r]) continue;
    v[r].assign(1000, static_cast<int64_t>(r) + 1);
    t.emplace_back([&, r] {
      auto w = comms[r]->allreduce(v[r].data(), v[r].data(), v[r].size(), DataType::kInt64, RedOp::kSum);
      st[r] = w.is_ok() ? w->wait() : w.status();
    });
  }
  for (auto& th : t) th.join();
  for (size_t r = 0; r < comms.size(); ++r) {
    if (!comms[r]) continue;
    ASSERT_TRUE(st[r].is_ok()) << st[r].to_string();
    for (int64_t x : v[r]) ASSERT_EQ(x, expect);
  }
}

TEST(Revoke, EndsWorkEverywhereRefusesNewWorkAndStillSplits) {
  auto comms = make_comms();
  ASSERT_EQ(comms.size(), static_cast<size_t>(kN));
  // Ranks 0..2 start a large allreduce that rank 3 never joins.
  std::vector<std::vector<float>> bufs(kN);
  std::vector<Work> works(kN);
  ASSERT_NO_FATAL_FAILURE(start_without_rank3(comms, bufs, works));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (int r = 0; r < 3; ++r) EXPECT_FALSE(works[r].test()) << "rank " << r << " finished without rank 3";
  EXPECT_FALSE(comms[0]->quiescent());

  // Only rank 0 revokes: ranks 1 and 2, blocked in the allreduce with it, end too.
  const auto t0 = Clock::now();
  comms[0]->revoke();
  EXPECT_TRUE(comms[0]->revoked());
  for (int r = 0; r < 3; ++r) {
    Status st = works[r].wait(std::chrono::seconds(5));
    EXPECT_FALSE(st.is_ok()) << "rank " << r;
    EXPECT_NE(st.code(), StatusCode::kTimeout) << "rank " << r << ": " << st.to_string();
    EXPECT_NE(st.message().find("communicator revoked by rank 0"), std::string::npos)
        << "rank " << r << ": " << st.to_string();
  }
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));
  EXPECT_TRUE(wait_quiescent(*comms[0], std::chrono::seconds(3)));

  // New work on the revoked communicator is refused.
  float x = 1;
  auto refused = comms[0]->allreduce(&x, &x, 1, DataType::kFloat32, RedOp::kSum);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidUsage) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("revoked"), std::string::npos);
  auto refused_p2p = comms[0]->send(&x, 1, DataType::kFloat32, 1);
  ASSERT_FALSE(refused_p2p.is_ok());
  EXPECT_EQ(refused_p2p.status().code(), StatusCode::kInvalidUsage);

  // Everyone else revokes too, then all split (rank 0 takes no part in the new comm).
  for (int r = 1; r < kN; ++r) comms[r]->revoke();
  std::vector<std::unique_ptr<Comm>> sub(kN);
  std::vector<Status> st(kN);
  std::vector<std::thread> t;
  for (int r = 0; r < kN; ++r)
    t.emplace_back([&, r] {
      auto s = comms[r]->split(r == 0 ? -1 : 1, kN - r);
      if (s.is_ok()) sub[r] = std::move(s).value();
      else st[r] = s.status();
    });
  for (auto& th : t) th.join();
  for (int r = 0; r < kN; ++r) ASSERT_TRUE(st[r].is_ok()) << "rank " << r << ": " << st[r].to_string();
  EXPECT_EQ(sub[0], nullptr);
  for (int r = 1; r < kN; ++r) {
    ASSERT_NE(sub[r], nullptr);
    EXPECT_EQ(sub[r]->size(), 3);
    EXPECT_EQ(sub[r]->rank(), kN - 1 - r);  // key reverses the order
  }
  check_allreduce(sub, 2 + 3 + 4);
  for (auto& c : comms) EXPECT_TRUE(c->destroy().is_ok());
}

TEST(Revoke, ShrinkAfterRevokeExcludingAnIdleRank) {
  auto comms = make_comms();
  ASSERT_EQ(comms.size(), static_cast<size_t>(kN));
  std::vector<std::vector<float>> bufs(kN);
  std::vector<Work> works(kN);
  ASSERT_NO_FATAL_FAILURE(start_without_rank3(comms, bufs, works));
  for (int r = 0; r < 3; ++r) comms[r]->revoke();
  std::vector<std::unique_ptr<Comm>> sub(kN);
  std::vector<Status> st(kN);
  std::vector<std::thread> t;
  for (int r = 0; r < 3; ++r)
    t.emplace_back([&, r] {
      auto s = comms[r]->shrink({3});
      if (s.is_ok()) sub[r] = std::move(s).value();
      else st[r] = s.status();
    });
  for (auto& th : t) th.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(works[r].status().is_ok());  // shrink waited until the revoked work ended
    ASSERT_TRUE(st[r].is_ok()) << "rank " << r << ": " << st[r].to_string();
    EXPECT_EQ(sub[r]->size(), 3);
    EXPECT_EQ(sub[r]->rank(), r);
  }
  check_allreduce(sub, 1 + 2 + 3);
}

// abort() may come from any thread at any time, also while destroy() waits
// for a hung op (the way to end it). destroy() must not free the transport
// while the abort is still inside (writing its dump, telling the peers).
// Regression: destroy went on as soon as the op ended, and the abort then
// woke the transport destroy had freed (TSan: a race on transport_; a
// use-after-free in a normal build).
TEST(Revoke, AbortWhileDestroyWaitsForAHungOp) {
  const std::string dir = "/tmp/loom-test-abort-destroy-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  setenv("LOOM_DUMP_DIR", dir.c_str(), 1);  // abort writes a dump: a slow fail()
  for (int round = 0; round < 5; ++round) {
    Config cfg;
    cfg.timeout_s = 30;
    auto comms = Comm::init_all(2, cfg);
    ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
    std::vector<float> buf(1 << 16, 1.0f);
    auto w = (*comms)[0]->allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, RedOp::kSum);
    ASSERT_TRUE(w.is_ok());
    const auto t0 = std::chrono::steady_clock::now();
    Status destroyed;
    std::thread destroyer([&] { destroyed = (*comms)[0]->destroy(); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (*comms)[0]->abort("watchdog");
    destroyer.join();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
    EXPECT_TRUE(destroyed.is_ok()) << destroyed.to_string();
    EXPECT_FALSE(w->wait().is_ok());
    (*comms)[1]->abort("test over");
  }
  unsetenv("LOOM_DUMP_DIR");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace loom
