// Comm::shrink with ranks as threads: the survivors form a communicator in
// their old order while the excluded rank does not take part; bad exclude
// lists fail with precise errors and without a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

#include "common/test_util.h"

namespace loom {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::unique_ptr<Comm>> make_comms(int n, double timeout_s = 60) {
  Config cfg;
  cfg.timeout_s = timeout_s;
  auto c = Comm::init_all(n, cfg);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return c.is_ok() ? std::move(c).value() : std::vector<std::unique_ptr<Comm>>{};
}

// Runs fn(old_rank) on a thread for each rank in `ranks`; returns the results by old rank.
std::vector<Result<std::unique_ptr<Comm>>> shrink_on(const std::vector<int>& ranks, int n,
                                                    const std::function<Result<std::unique_ptr<Comm>>(int)>& fn) {
  std::vector<Result<std::unique_ptr<Comm>>> out;
  for (int i = 0; i < n; ++i) out.emplace_back(invalid_usage("did not call shrink"));
  std::vector<std::thread> threads;
  for (int r : ranks) threads.emplace_back([&, r] { out[r] = fn(r); });
  for (auto& t : threads) t.join();
  return out;
}

// Allreduce on the shrunk comms; element i of old rank r contributes (r+1)*1000+i.
void check_allreduce(std::vector<Result<std::unique_ptr<Comm>>>& shrunk, const std::vector<int>& survivors) {
  const size_t count = 1000;
  int64_t weight = 0;
  for (int r : survivors) weight += r + 1;
  std::vector<std::vector<int32_t>> bufs(shrunk.size());
  std::vector<std::thread> threads;
  std::vector<Status> st(shrunk.size());
  for (int r : survivors) {
    bufs[r].resize(count);
    for (size_t i = 0; i < count; ++i) bufs[r][i] = (r + 1) * 1000 + static_cast<int32_t>(i);
    threads.emplace_back([&, r] {
      auto w = (*shrunk[r])->allreduce(bufs[r].data(), bufs[r].data(), count, DataType::kInt32, RedOp::kSum);
      st[r] = w.is_ok() ? w->wait() : w.status();
    });
  }
  for (auto& t : threads) t.join();
  for (int r : survivors) {
    ASSERT_TRUE(st[r].is_ok()) << "old rank " << r << ": " << st[r].to_string();
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(bufs[r][i], weight * 1000 + static_cast<int64_t>(survivors.size()) * static_cast<int64_t>(i))
          << "old rank " << r << " element " << i;
  }
}

TEST(Shrink, SurvivorsKeepTheirOrder) {
  auto comms = make_comms(4);
  ASSERT_EQ(comms.size(), 4u);
  // Rank 2 leaves without calling shrink while the others shrink.
  std::thread leaver([&] { EXPECT_TRUE(comms[2]->destroy().is_ok()); });
  auto shrunk = shrink_on({0, 1, 3}, 4, [&](int r) { return comms[r]->shrink({2}); });
  leaver.join();
  const std::vector<int> survivors = {0, 1, 3};
  for (int i = 0; i < 3; ++i) {
    int r = survivors[i];
    ASSERT_TRUE(shrunk[r].is_ok()) << "old rank " << r << ": " << shrunk[r].status().to_string();
    EXPECT_EQ((*shrunk[r])->size(), 3);
    EXPECT_EQ((*shrunk[r])->rank(), i) << "old rank " << r;
  }
  check_allreduce(shrunk, survivors);
}

TEST(Shrink, AbortFirstAndShrinkAgain) {
  // A shrunk comm can shrink again; abort_first leaves the parent failed.
  auto comms = make_comms(4);
  ASSERT_EQ(comms.size(), 4u);
  auto once = shrink_on({1, 2, 3}, 4, [&](int r) { return comms[r]->shrink({0}, true); });
  for (int r = 1; r < 4; ++r) {
    ASSERT_TRUE(once[r].is_ok()) << once[r].status().to_string();
    EXPECT_FALSE(comms[r]->async_error().is_ok());
  }
  // New ranks 0,1,2 (old 1,2,3); drop new rank 1 (old 2).
  std::vector<Result<std::unique_ptr<Comm>>> twice;
  for (int i = 0; i < 4; ++i) twice.emplace_back(invalid_usage("unused"));
  std::vector<std::thread> threads;
  for (int r : {1, 3}) threads.emplace_back([&, r] { twice[r] = (*once[r])->shrink({1}); });
  for (auto& t : threads) t.join();
  ASSERT_TRUE(twice[1].is_ok()) << twice[1].status().to_string();
  ASSERT_TRUE(twice[3].is_ok()) << twice[3].status().to_string();
  EXPECT_EQ((*twice[1])->rank(), 0);
  EXPECT_EQ((*twice[3])->rank(), 1);
  EXPECT_EQ((*twice[3])->size(), 2);
  check_allreduce(twice, {1, 3});
}

TEST(Shrink, LeftOutRankJoinsTheNextShrink) {
  // Rank 2 is left out of the first shrink (and does not call it) but starts
  // the next shrink of the parent at once, one generation behind the others:
  // its hello must wait for that round, not spoil the first one.
  auto comms = make_comms(4);
  ASSERT_EQ(comms.size(), 4u);
  std::vector<Result<std::unique_ptr<Comm>>> first, second;
  for (int i = 0; i < 4; ++i) {
    first.emplace_back(invalid_usage("unused"));
    second.emplace_back(invalid_usage("unused"));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r)
    threads.emplace_back([&, r] {
      if (r != 2) first[r] = comms[r]->shrink({2});
      second[r] = comms[r]->shrink({});
    });
  for (auto& t : threads) t.join();
  for (int r : {0, 1, 3}) {
    ASSERT_TRUE(first[r].is_ok()) << "old rank " << r << ": " << first[r].status().to_string();
    EXPECT_EQ((*first[r])->size(), 3);
  }
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(second[r].is_ok()) << "old rank " << r << ": " << second[r].status().to_string();
    EXPECT_EQ((*second[r])->rank(), r);
  }
  check_allreduce(first, {0, 1, 3});
  check_allreduce(second, {0, 1, 2, 3});
}

TEST(Shrink, BadListsAreRejectedLocally) {
  auto comms = make_comms(4);
  ASSERT_EQ(comms.size(), 4u);
  auto self = comms[1]->shrink({1});
  ASSERT_FALSE(self.is_ok());
  EXPECT_EQ(self.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(self.status().message().find("excludes itself"), std::string::npos) << self.status().to_string();
  for (int bad : {4, -1}) {
    auto r = comms[0]->shrink({2, bad});
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("out of range"), std::string::npos) << r.status().to_string();
  }
  // None of these touched the parent or the rendezvous: a real shrink still works.
  EXPECT_TRUE(comms[0]->async_error().is_ok());
  auto ok = shrink_on({0, 1, 2, 3}, 4, [&](int r) { return comms[r]->shrink({}); });
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(ok[r].is_ok()) << ok[r].status().to_string();
  check_allreduce(ok, {0, 1, 2, 3});
}

TEST(Shrink, MismatchedListsFailEverywhereThenRetry) {
  auto comms = make_comms(4);
  ASSERT_EQ(comms.size(), 4u);
  const auto t0 = Clock::now();
  // Ranks 0 and 3 exclude {2}; rank 1 also excludes 3. Same coordinator (0).
  auto bad = shrink_on({0, 1, 3}, 4, [&](int r) {
    return comms[r]->shrink(r == 1 ? std::vector<int>{3, 2} : std::vector<int>{2});
  });
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int r : {0, 1, 3}) {
    ASSERT_FALSE(bad[r].is_ok()) << "old rank " << r;
    EXPECT_EQ(bad[r].status().code(), StatusCode::kInvalidUsage) << bad[r].status().to_string();
    EXPECT_NE(bad[r].status().message().find("exclude lists differ: rank 1 excludes [2,3], rank 0 excludes [2]"),
              std::string::npos)
        << "old rank " << r << ": " << bad[r].status().to_string();
  }
  EXPECT_LT(secs, 10.0) << "a mismatch must not wait for the deadline";
  // The failed round does not poison the next one (generation counter).
  auto good = shrink_on({0, 1, 3}, 4, [&](int r) { return comms[r]->shrink({2}); });
  for (int r : {0, 1, 3}) ASSERT_TRUE(good[r].is_ok()) << good[r].status().to_string();
  check_allreduce(good, {0, 1, 3});
}

TEST(Shrink, MissingSurvivorIsNamed) {
  // Rank 3 is alive but neither excluded nor calling: the others fail with
  // its name at their (short) deadline instead of hanging.
  auto comms = make_comms(4);
  ASSERT_EQ(comms.size(), 4u);
  Config cfg;
  cfg.timeout_s = 6;
  const auto t0 = Clock::now();
  auto res = shrink_on({0, 1}, 4, [&](int r) { return comms[r]->shrink({2}, false, cfg); });
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int r : {0, 1}) {
    ASSERT_FALSE(res[r].is_ok());
    EXPECT_NE(res[r].status().message().find("survivor rank(s) [3] did not call shrink"), std::string::npos)
        << "old rank " << r << ": " << res[r].status().to_string();
  }
  EXPECT_LT(secs, 9.0);
}

}  // namespace
}  // namespace loom
