// Diagnostic dumps written at the same time by several threads of one process
// (a rank's own failure and a peer's coordinated "dump" request arrive
// together) must each leave a whole JSON file. Regression: they shared one
// temporary file name, so two writers interleaved in it and the file renamed
// into place ended with the tail of the longer dump after the shorter one
// ("corrupt ... parse error"; seen in netns/test_netns_doctor under CI).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "core/comm_impl.h"
#include "diag/hub.h"

namespace loom {
namespace {

// `n` allreduces of 64 floats: each issued on every rank (threads of this
// process), then waited for.
void allreduce_n(std::vector<std::unique_ptr<Comm>>& comms, int n) {
  std::vector<std::vector<float>> bufs(comms.size(), std::vector<float>(64, 1.0f));
  for (int i = 0; i < n; ++i) {
    std::vector<Work> works;
    for (size_t r = 0; r < comms.size(); ++r) {
      auto w = comms[r]->allreduce(bufs[r].data(), bufs[r].data(), 64, DataType::kFloat32, RedOp::kSum);
      ASSERT_TRUE(w.is_ok()) << w.status().to_string();
      works.push_back(*w);
    }
    for (auto& w : works) ASSERT_TRUE(w.wait().is_ok());
  }
}

TEST(DiagDump, ConcurrentDumpsLeaveWholeFiles) {
  const std::string dir = "/tmp/loom-test-diag-dump-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  setenv("LOOM_DUMP_DIR", dir.c_str(), 1);
  auto comms = Comm::init_all(1);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  std::atomic<bool> writing{true};
  std::atomic<int> corrupt_reads{0}, reads{0};
  std::string first_corrupt;
  // A reader sees every version renamed into place: each must be one whole
  // JSON document (a dump is only ever replaced, never seen half-written).
  std::thread reader([&] {
    while (writing.load()) {
      for (const auto& e : std::filesystem::directory_iterator(dir)) {
        const std::string path = e.path().string();
        if (path.find(".tmp") != std::string::npos) continue;
        std::ifstream f(path);
        std::stringstream ss;
        ss << f.rdbuf();
        if (ss.str().empty()) continue;
        ++reads;
        if (nlohmann::json::parse(ss.str(), nullptr, false).is_discarded() && corrupt_reads++ == 0)
          first_corrupt = ss.str().substr(ss.str().size() > 80 ? ss.str().size() - 80 : 0);
      }
    }
  });
  std::vector<std::thread> ts;
  for (int t = 0; t < 6; ++t)
    ts.emplace_back([t] {
      // Reasons of different lengths: interleaved writers leave a tail behind.
      for (int i = 0; i < 200; ++i) diag::Hub::get().dump(std::string(static_cast<size_t>(1 + t * 400), 'x'), false);
    });
  for (auto& t : ts) t.join();
  writing = false;
  reader.join();
  EXPECT_EQ(corrupt_reads.load(), 0) << "of " << reads.load() << " reads; one ended: " << first_corrupt;
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string path = e.path().string();
    EXPECT_EQ(path.find(".tmp"), std::string::npos) << "temporary file left behind: " << path;
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    auto j = nlohmann::json::parse(ss.str(), nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << path << " is not one whole JSON document";
    ++files;
  }
  EXPECT_GE(files, 1);
  for (auto& c : *comms) EXPECT_TRUE(c->destroy().is_ok());
  unsetenv("LOOM_DUMP_DIR");
  std::filesystem::remove_all(dir);
}

// A hang with non-blocking calls queued behind it: rank 0 issues 8
// allreduces that rank 1 never joins, with a ring of 4 entries. The failure's
// dump must name the hung op (#0) as current and failed, keep the queued
// ones behind it, and count the ops it had no slot for. Regression: op #4
// took op #0's slot at issue, so the dump had no entry for the hung op and
// showed #4, never started, as the failed one.
// A request to the diag server whose text is not UTF-8 (here "dump" with
// a reason of raw bytes) is answered and dumped with the bytes replaced.
// Regression: nlohmann's dump threw type_error.316 on the handler thread:
// std::terminate, the rank died (found by a helper's review).
TEST(DiagDump, ARequestThatIsNotUtf8DoesNotKillTheRank) {
  const std::string dir = "/tmp/loom-test-diag-utf8-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  setenv("LOOM_DUMP_DIR", dir.c_str(), 1);
  auto comms = Comm::init_all(1);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  const std::string addr = diag::Hub::get().address();
  ASSERT_FALSE(addr.empty()) << "no diag server";
  auto answer = diag::query(addr, "dump \xff\xfe oops", 5.0);
  ASSERT_TRUE(answer.is_ok()) << answer.status().to_string();
  EXPECT_EQ(*answer, "ok\n");
  auto json = diag::query(addr, "json", 5.0);  // the server (and the process) still answer
  ASSERT_TRUE(json.is_ok()) << json.status().to_string();
  int dumps = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".json") continue;
    std::ifstream f(e.path());
    std::stringstream ss;
    ss << f.rdbuf();
    auto j = nlohmann::json::parse(ss.str(), nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << e.path();
    EXPECT_NE(j.value("reason", "").find("oops"), std::string::npos) << j.value("reason", "");
    ++dumps;
  }
  EXPECT_EQ(dumps, 1);
  unsetenv("LOOM_DUMP_DIR");
  std::filesystem::remove_all(dir);
}

TEST(DiagDump, AHungOpKeepsItsEntryWithMoreOpsQueuedThanTheRingHolds) {
  const std::string dir = "/tmp/loom-test-diag-hung-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  setenv("LOOM_DUMP_DIR", dir.c_str(), 1);
  setenv("LOOM_TRACE_BUFFER_SIZE", "4", 1);
  Config cfg;
  cfg.timeout_s = 1;
  auto comms = Comm::init_all(2, cfg);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  std::vector<std::vector<float>> bufs(8, std::vector<float>(256, 1.0f));
  std::vector<Work> works;
  for (auto& b : bufs) {
    auto w = (*comms)[0]->allreduce(b.data(), b.data(), b.size(), DataType::kFloat32, RedOp::kSum);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    works.push_back(*w);
  }
  Status first = works[0].wait();
  EXPECT_EQ(first.code(), StatusCode::kTimeout) << first.to_string();
  for (size_t i = 1; i < works.size(); ++i) EXPECT_FALSE(works[i].wait().is_ok());
  nlohmann::json mine;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream f(e.path());
    auto j = nlohmann::json::parse(f, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << e.path();
    for (const auto& c : j["comms"])
      if (c.value("rank", -1) == 0 && c.value("nranks", 0) == 2) mine = c;  // not an earlier test's comm
  }
  ASSERT_FALSE(mine.is_null()) << "no dump of rank 0 in " << dir;
  ASSERT_TRUE(mine.contains("current")) << mine.dump();
  EXPECT_EQ(mine["current"]["seq"], 0);
  ASSERT_TRUE(mine["current"].contains("op")) << "the hung op has no entry: " << mine.dump();
  EXPECT_EQ(mine["current"]["op"]["coll"], "allreduce");
  const auto& ops = mine["ops"];
  ASSERT_EQ(ops.size(), 4u) << ops.dump();
  EXPECT_EQ(ops[0]["seq"], 0);
  EXPECT_EQ(ops[0]["state"], "failed");
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_EQ(ops[i]["seq"], i);
    EXPECT_EQ(ops[i]["state"], "enqueued") << "queued behind the hung op, never run";
  }
  EXPECT_EQ(mine.value("ops_not_recorded", 0), 4) << "ops #4-#7 found their slots held";
  for (auto& c : *comms) c->abort("test over");
  unsetenv("LOOM_TRACE_BUFFER_SIZE");
  unsetenv("LOOM_DUMP_DIR");
  std::filesystem::remove_all(dir);
}

// finished_seq counts the ops the engine finished even when none is
// recorded (LOOM_TRACE_BUFFER_SIZE=0): what `loom-doctor status` reads
// progress from there.
TEST(DiagDump, FinishedSeqCountsOpsWithoutATraceBuffer) {
  setenv("LOOM_TRACE_BUFFER_SIZE", "0", 1);
  auto comms = Comm::init_all(2);
  unsetenv("LOOM_TRACE_BUFFER_SIZE");
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  allreduce_n(*comms, 5);
  ASSERT_FALSE(HasFatalFailure());
  for (auto& c : *comms) {
    const nlohmann::json st = c->impl()->diag_state();
    EXPECT_TRUE(st["ops"].empty()) << st.dump();
    EXPECT_EQ(st.value("finished_seq", 0), 5) << st.dump();
  }
}

// A destroyed communicator stays in the process's state: a healthy one with
// its newest 16 ops (only those rendered: the whole 1024-entry ring cost ~400
// page faults per destroy), a failed one with every op its ring holds.
TEST(DiagDump, ADestroyedCommKeepsItsNewestOpsOrAllWhenItFailed) {
  auto comms = Comm::init_all(2);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  constexpr int kOps = 40;
  allreduce_n(*comms, kOps);
  ASSERT_FALSE(HasFatalFailure());
  const std::string id = (*comms)[0]->impl()->diag_state()["id"];
  (*comms)[1]->impl()->abort("test: rank 1 fails");
  for (auto& c : *comms) (void)c->destroy();
  const nlohmann::json st = diag::Hub::get().state("test");
  int seen = 0;
  for (const auto& c : st["comms"]) {
    if (c.value("id", "") != id) continue;
    ++seen;
    EXPECT_TRUE(c.value("destroyed", false));
    const auto& ops = c["ops"];
    ASSERT_FALSE(ops.empty());
    EXPECT_EQ(ops.back().value("seq", 0), kOps - 1) << "the newest op is kept";
    if (c.value("rank", -1) == 1) {
      EXPECT_EQ(c.value("status", ""), "failed");
      EXPECT_EQ(ops.size(), static_cast<size_t>(kOps)) << "a failed comm keeps every op";
    } else {
      EXPECT_EQ(c.value("status", ""), "ok");
      ASSERT_EQ(ops.size(), 16u);
      EXPECT_EQ(ops.front().value("seq", 0), kOps - 16);
    }
  }
  EXPECT_EQ(seen, 2) << st.dump();
}

}  // namespace
}  // namespace loom
