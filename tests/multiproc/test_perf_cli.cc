// Smoke test of the perf suite's command line: the *_perf binaries run under
// loomrun (and mpirun when the build has MPI), print nccl-tests' table and
// footer with #wrong 0, and their --json / --csv output parses.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string bin_dir() {
  const char* b = std::getenv("LOOM_BUILD_DIR");
  return std::string(b ? b : ".") + "/bin";
}

struct Outcome {
  int rc = -1;
  std::string out;  // stdout and stderr
};

Outcome run(const std::string& cmd) {
  Outcome r;
  FILE* p = popen(("timeout 60 " + cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  return r;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::vector<std::string> fields(const std::string& l, char sep = ' ') {
  std::vector<std::string> out;
  std::string cur;
  for (char c : l) {
    if (c == sep) {
      if (sep != ' ' || !cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (sep != ' ' || !cur.empty()) out.push_back(cur);
  return out;
}

// The data rows of an nccl-tests table (lines that do not start with '#').
std::vector<std::vector<std::string>> table_rows(const std::string& out) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& l : lines(out)) {
    auto f = fields(l);
    if (f.size() >= 13 && f[0][0] != '#' && isdigit(static_cast<unsigned char>(f[0][0]))) rows.push_back(f);
  }
  return rows;
}

bool have(const std::string& name) { return access((bin_dir() + "/" + name).c_str(), X_OK) == 0; }

class PerfCli : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* b : {"loomrun", "all_reduce_perf", "reduce_scatter_perf", "hypercube_perf"})
      ASSERT_TRUE(have(b)) << bin_dir() << "/" << b << " is missing: build the perf-tests targets";
  }
  std::string loomrun(int n) { return bin_dir() + "/loomrun -n " + std::to_string(n) + " --no-prefix " + bin_dir() + "/"; }
};

TEST_F(PerfCli, TableAndFooterUnderLoomrun) {
  Outcome r = run(loomrun(2) + "all_reduce_perf -b 8 -e 1K -f 4 -c 1 -n 2 -w 1");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("out-of-place"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("# Out of bounds values : 0 OK"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("# Avg bus bandwidth    : "), std::string::npos) << r.out;
  auto rows = table_rows(r.out);
  ASSERT_EQ(rows.size(), 4u) << r.out;  // 8, 32, 128, 512
  const char* sizes[] = {"8", "32", "128", "512"};
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i][0], sizes[i]);
    EXPECT_EQ(rows[i][2], "float");
    EXPECT_EQ(rows[i][3], "sum");
    EXPECT_EQ(rows[i][8], "0") << "out-of-place #wrong";
    EXPECT_EQ(rows[i][12], "0") << "in-place #wrong";
    EXPECT_GT(std::stod(rows[i][5]), 0.0) << "time";
  }
}

TEST_F(PerfCli, ReduceScatterAndHypercubeVerify) {
  for (const char* b : {"reduce_scatter_perf", "hypercube_perf"}) {
    Outcome r = run(loomrun(4) + b + " -b 64 -e 64K -f 32 -n 2 -w 1 -d int32");
    ASSERT_EQ(r.rc, 0) << b << "\n" << r.out;
    EXPECT_NE(r.out.find("# Out of bounds values : 0 OK"), std::string::npos) << r.out;
    EXPECT_EQ(table_rows(r.out).size(), 3u) << r.out;  // 64, 2K, 64K
  }
}

TEST_F(PerfCli, JsonAndCsvParse) {
  std::string csv = testing::TempDir() + "loom_perf_cli.csv";
  Outcome r = run(loomrun(2) + "all_reduce_perf -b 1K -e 4K -f 2 -n 2 -w 1 -m 2 -a 2 --json --csv=" + csv);
  ASSERT_EQ(r.rc, 0) << r.out;
  // --json replaced the table on stdout: the whole output is one document.
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["benchmark"], "all_reduce_perf");
  EXPECT_EQ(j["nranks"], 2);
  EXPECT_EQ(j["agg_iters"], 2);
  EXPECT_EQ(j["average"], 2);
  EXPECT_EQ(j["out_of_bounds"], 0.0);
  ASSERT_EQ(j["results"].size(), 3u);
  EXPECT_EQ(j["results"][2]["size"], 4096);
  EXPECT_GT(j["results"][2]["out_of_place"]["busbw_gbps"].get<double>(), 0.0);
  EXPECT_EQ(j["results"][2]["in_place"]["wrong"], 0.0);

  std::ifstream f(csv);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto ls = lines(text);
  ASSERT_EQ(ls.size(), 4u) << text;
  auto head = fields(ls[0], ',');
  ASSERT_EQ(head.size(), 19u);
  EXPECT_EQ(head[2], "size");
  EXPECT_EQ(head[9], "oop_busbw");
  for (size_t i = 1; i < ls.size(); ++i) {
    auto f2 = fields(ls[i], ',');
    ASSERT_EQ(f2.size(), 19u) << ls[i];
    EXPECT_EQ(f2[0], "allreduce");
    EXPECT_EQ(f2[10], "0");
  }
  std::remove(csv.c_str());
}

// sendrecv_perf --oneway: even ranks send to rank + 1, odd ranks receive and
// verify (an odd rank count leaves the last rank idle); the times are the
// slowest rank's. Other benchmarks refuse the flag.
TEST_F(PerfCli, OneWaySendRecv) {
  ASSERT_TRUE(have("sendrecv_perf"));
  for (int n : {2, 3}) {
    Outcome r = run(loomrun(n) + "sendrecv_perf --oneway -b 8 -e 1M -f 32 -n 2 -w 1 -d int32");
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("Pattern: one way"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("times: slowest rank"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("# Out of bounds values : 0 OK"), std::string::npos) << r.out;
    EXPECT_EQ(table_rows(r.out).size(), 4u) << r.out;  // 8, 256, 8K, 256K
  }
  EXPECT_EQ(run(bin_dir() + "/all_reduce_perf --oneway").rc, 2);
}

TEST_F(PerfCli, BadArgumentsAreRejected) {
  EXPECT_EQ(run(bin_dir() + "/all_reduce_perf -f 1").rc, 2);
  EXPECT_EQ(run(bin_dir() + "/all_reduce_perf -a 7").rc, 2);
  EXPECT_EQ(run(bin_dir() + "/all_reduce_perf -b 2M -e 1M").rc, 2);
  Outcome h = run(bin_dir() + "/all_reduce_perf --help");
  EXPECT_EQ(h.rc, 0);
  EXPECT_NE(h.out.find("--baseline mpi"), std::string::npos);
  // A forced algorithm that does not exist fails at communicator creation.
  Outcome a = run(loomrun(2) + "all_reduce_perf -b 8 -e 8 -A no_such_algo");
  EXPECT_NE(a.rc, 0);
  EXPECT_NE(a.out.find("no_such_algo"), std::string::npos) << a.out;
}

TEST_F(PerfCli, MpirunBootstrap) {
  if (system("command -v mpirun.openmpi > /dev/null 2>&1") != 0) GTEST_SKIP() << "no Open MPI mpirun";
  Outcome r = run("mpirun.openmpi --allow-run-as-root --oversubscribe -np 2 " + bin_dir() +
              "/all_reduce_perf -b 8 -e 64 -f 8 -n 2 -w 1");
  if (r.out.find("this build has no MPI") != std::string::npos) GTEST_SKIP() << "built without MPI";
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("bootstrap mpi"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("# Out of bounds values : 0 OK"), std::string::npos) << r.out;
  EXPECT_EQ(table_rows(r.out).size(), 2u) << r.out;
}

}  // namespace
