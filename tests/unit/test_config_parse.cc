// Byte sizes as flags and LOOM_* variables read them (parse_bytes): digits,
// a fraction only with a K/M/G suffix, an optional B. Regression: "-8" was
// read as 2^64 - 8 (strtoull), products overflowed silently, and "1.5K"
// (which nccl-tests accepts for -b/-e) was refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "core/config.h"
#include "core/log.h"
#include "common/test_util.h"

namespace loom {
namespace {

TEST(ParseBytes, SuffixesFractionsAndGarbage) {
  uint64_t v = 0;
  ASSERT_TRUE(parse_bytes("4096", &v));
  EXPECT_EQ(v, 4096u);
  ASSERT_TRUE(parse_bytes("64K", &v));
  EXPECT_EQ(v, 64u << 10);
  ASSERT_TRUE(parse_bytes("2MB", &v));
  EXPECT_EQ(v, 2u << 20);
  ASSERT_TRUE(parse_bytes("1.5K", &v));
  EXPECT_EQ(v, 1536u);
  ASSERT_TRUE(parse_bytes("0.25G", &v));
  EXPECT_EQ(v, 1u << 28);
  for (const char* bad : {"-8", "+8", " 8", "", "8X", "1.5", "K", "99999999999999999999", "17179869184G", "1e3"})
    EXPECT_FALSE(parse_bytes(bad, &v)) << "'" << bad << "' read as " << v;
}

// The LOOM_* readers: a malformed value is warned about (once, naming the
// variable) and reads as the default; a context-dependent default stays what
// the context gives. Regressions: 256KiB read as LOOM_SHM_FIFO_STEP_BYTES 0
// (no limit), LOOM_SHM_SLOTS=false was on, LOOM_MAX_QUEUED_OPS=3000000000
// wrapped negative, LOOM_CHUNK_BYTES=0 pipelined element by element.
TEST(EnvReaders, MalformedValuesReadAsTheDefaultAndBinarySuffixesParse) {
  uint64_t v = 0;
  ASSERT_TRUE(parse_bytes("256KiB", &v));
  EXPECT_EQ(v, 256u << 10);
  ASSERT_TRUE(parse_bytes("1MiB", &v));
  EXPECT_EQ(v, 1u << 20);
  EXPECT_FALSE(parse_bytes("1Mi", &v));

  setenv("LOOM_TEST_BYTES", "1e3", 1);
  EXPECT_EQ(env_bytes("LOOM_TEST_BYTES", 77), 77u);
  EXPECT_FALSE(env_bytes_if_set("LOOM_TEST_BYTES").has_value());
  setenv("LOOM_TEST_BYTES", "2MiB", 1);
  EXPECT_EQ(env_bytes_if_set("LOOM_TEST_BYTES").value_or(0), 2u << 20);
  unsetenv("LOOM_TEST_BYTES");

  setenv("LOOM_TEST_INT", "3000000000", 1);
  EXPECT_EQ(env_int("LOOM_TEST_INT", 5), 5);
  setenv("LOOM_TEST_INT", "1e3", 1);
  EXPECT_EQ(env_int("LOOM_TEST_INT", 5), 5);
  setenv("LOOM_TEST_INT", "-12", 1);
  EXPECT_EQ(env_int("LOOM_TEST_INT", 5), -12);
  unsetenv("LOOM_TEST_INT");
  setenv("LOOM_TEST_DOUBLE", "10s", 1);
  EXPECT_EQ(env_double("LOOM_TEST_DOUBLE", 300), 300);
  unsetenv("LOOM_TEST_DOUBLE");

  for (const char* f : {"false", "OFF", "no", "0"}) {
    setenv("LOOM_SHM_SLOTS", f, 1);
    EXPECT_EQ(params::shm_slots(), 0) << f;
  }
  for (const char* t : {"true", "On", "yes", "1", "2"}) {
    setenv("LOOM_SHM_SLOTS", t, 1);
    EXPECT_EQ(params::shm_slots(), 1) << t;
  }
  setenv("LOOM_SHM_MAP_SHARED", "0 ", 1);  // not a boolean: the default (on)
  EXPECT_EQ(params::shm_map_shared(), 1);
  unsetenv("LOOM_SHM_SLOTS");
  unsetenv("LOOM_SHM_MAP_SHARED");

  // Context-dependent defaults: a malformed value keeps the context's.
  const uint64_t step_default = params::shm_fifo_step_bytes(1);
  setenv("LOOM_SHM_FIFO_STEP_BYTES", "lots", 1);
  EXPECT_EQ(params::shm_fifo_step_bytes(1), step_default);
  setenv("LOOM_SHM_FIFO_STEP_BYTES", "1MiB", 1);
  EXPECT_EQ(params::shm_fifo_step_bytes(1), 1u << 20);
  unsetenv("LOOM_SHM_FIFO_STEP_BYTES");
  const uint64_t xproc_default = params::shm_single_copy_xproc_bytes(2);
  setenv("LOOM_SHM_SINGLE_COPY_BYTES", "256KiB?", 1);
  EXPECT_EQ(params::shm_single_copy_xproc_bytes(2), xproc_default);
  unsetenv("LOOM_SHM_SINGLE_COPY_BYTES");

  for (const char* tiny : {"0", "1", "4095"}) {
    setenv("LOOM_CHUNK_BYTES", tiny, 1);
    EXPECT_FALSE(params::chunk_bytes_if_set().has_value()) << tiny;
    EXPECT_EQ(params::chunk_bytes(), 512u << 10) << tiny;
  }
  setenv("LOOM_CHUNK_BYTES", "64K", 1);
  EXPECT_EQ(params::chunk_bytes_if_set().value_or(0), 64u << 10);
  unsetenv("LOOM_CHUNK_BYTES");
}

// LOOM_DEBUG_SUBSYS (and NCCL_DEBUG_SUBSYS through the shim): excluding
// names Loom does not have excludes nothing; names may have spaces around
// them. Regression: "^GRAPH" silenced every message, WARN included, and
// "COLL, INIT" dropped INIT.
TEST(EnvReaders, DebugSubsystemExclusionsOfUnknownNamesKeepEverything) {
  setenv("LOOM_DEBUG", "INFO", 1);
  setenv("LOOM_DEBUG_SUBSYS", "^GRAPH", 1);
  log_reinit();
  EXPECT_TRUE(log_enabled(LogLevel::kWarn, kLogInit));
  EXPECT_TRUE(log_enabled(LogLevel::kInfo, kLogColl));
  setenv("LOOM_DEBUG_SUBSYS", "^", 1);
  log_reinit();
  EXPECT_TRUE(log_enabled(LogLevel::kWarn, kLogNet));
  setenv("LOOM_DEBUG_SUBSYS", "^COLL", 1);
  log_reinit();
  EXPECT_FALSE(log_enabled(LogLevel::kInfo, kLogColl));
  EXPECT_TRUE(log_enabled(LogLevel::kInfo, kLogInit));
  setenv("LOOM_DEBUG_SUBSYS", "COLL, INIT", 1);
  log_reinit();
  EXPECT_TRUE(log_enabled(LogLevel::kInfo, kLogInit));
  EXPECT_TRUE(log_enabled(LogLevel::kInfo, kLogColl));
  EXPECT_FALSE(log_enabled(LogLevel::kInfo, kLogNet));
  // Warnings are never filtered by subsystem, as NCCL's WARN (logged with
  // NCCL_ALL). Regression: LOOM_DEBUG_SUBSYS=COLL hid a NET warning.
  EXPECT_TRUE(log_enabled(LogLevel::kWarn, kLogNet));
  setenv("LOOM_DEBUG_SUBSYS", "^NET", 1);
  log_reinit();
  EXPECT_TRUE(log_enabled(LogLevel::kWarn, kLogNet));
  EXPECT_FALSE(log_enabled(LogLevel::kInfo, kLogNet));
  unsetenv("LOOM_DEBUG");
  unsetenv("LOOM_DEBUG_SUBSYS");
  log_reinit();
}

// docs/env.md is loom-env --markdown's output (the registry is the one
// source). Regression: five rows had been edited in the file and not in the
// registry, so the tool's help and the docs disagreed.
TEST(EnvReaders, DocsAreTheRegistrysMarkdown) {
  const char* src = std::getenv("LOOM_SOURCE_DIR");
  if (!src) GTEST_SKIP() << "LOOM_SOURCE_DIR not set (run through ctest)";
  std::ifstream f(std::string(src) + "/docs/env.md");
  ASSERT_TRUE(f.good());
  const std::string doc((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(testing::run_command(testing::build_bin("loom-env") + " --markdown"), doc)
      << "regenerate: build/bin/loom-env --markdown > docs/env.md";
}

// config.h promises the variables a process runs with at INFO ENV.
// Regression: nothing logged under ENV at all.
TEST(EnvReaders, SetVariablesAreLoggedUnderEnv) {
  const std::string file = ::testing::TempDir() + "loom_env_log.txt";
  std::remove(file.c_str());
  setenv("LOOM_DEBUG", "INFO", 1);
  setenv("LOOM_DEBUG_SUBSYS", "ENV", 1);
  setenv("LOOM_DEBUG_FILE", file.c_str(), 1);
  setenv("LOOM_CHUNK_BYTES", "64K", 1);
  log_reinit();
  log_environment();
  unsetenv("LOOM_CHUNK_BYTES");
  unsetenv("LOOM_DEBUG_FILE");
  unsetenv("LOOM_DEBUG");
  unsetenv("LOOM_DEBUG_SUBSYS");
  log_reinit();  // closes the file
  std::ifstream f(file);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("ENV LOOM_CHUNK_BYTES=64K"), std::string::npos) << text;
  EXPECT_NE(text.find("at their defaults"), std::string::npos) << text;
  std::remove(file.c_str());
}

// loom-env marks a set value the library would reject. Regression: shown as
// "(set)" like a good one.
TEST(EnvReaders, LoomEnvMarksMalformedValues) {
  const std::string out = testing::run_command("LOOM_SHM_SLOTS=maybe LOOM_CHUNK_BYTES=64K LOOM_TIMEOUT=10s " +
                                               testing::build_bin("loom-env"));
  EXPECT_NE(out.find("LOOM_SHM_SLOTS         = maybe        (set, malformed: the default is used)"), std::string::npos)
      << out;
  EXPECT_NE(out.find("LOOM_TIMEOUT           = 10s          (set, malformed"), std::string::npos) << out;
  EXPECT_NE(out.find("LOOM_CHUNK_BYTES       = 64K          (set)\n"), std::string::npos) << out;
}

}  // namespace
}  // namespace loom
