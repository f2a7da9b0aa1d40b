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
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "diag/hub.h"

namespace loom {
namespace {

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

}  // namespace
}  // namespace loom
