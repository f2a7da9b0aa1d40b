// Loads plugins/tuner/example (built as lib/libloom-tuner-example.so).
#include "test_topology_util.h"
#include "topology/algo_override.h"
#include "topology/topo_xml.h"
#include "topology/tuner.h"
#include "topology/tuner_plugin.h"

namespace loom::topo {
namespace {

std::string example_plugin() {
  const char* b = std::getenv("LOOM_BUILD_DIR");
  return std::string(b != nullptr ? b : ".") + "/lib/libloom-tuner-example.so";
}

TopoGraph flat_host() {
  auto r = graph_from_xml_text("<system><cpu numaid=\"0\"/></system>", "flat");
  EXPECT_TRUE(r.is_ok());
  return r.value().graph;
}

TEST(TunerPlugin, ExamplePluginSteersSelection) {
  Tuner t(flat_host());
  const std::vector<std::string> avail = {"ring", "hypercube", "tree"};
  auto model = t.select(Collective::kAllReduce, 1024, 8, avail);
  ASSERT_TRUE(model.is_ok());
  ASSERT_NE(model->algorithm, "tree");  // otherwise the test would prove nothing
  ASSERT_TRUE(t.load_plugin(example_plugin(), 8, 1).is_ok()) << example_plugin();
  ASSERT_NE(t.plugin(), nullptr);
  EXPECT_EQ(t.plugin()->name(), "example");
  auto s = t.select(Collective::kAllReduce, 1024, 8, avail);
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(s->algorithm, "tree");
  EXPECT_EQ(s->source, "plugin example");
  EXPECT_EQ(s->channels, 2);
  EXPECT_GT(s->predicted_us, 0);
  // Large allreduce: the plugin has no opinion on the algorithm, only channels.
  auto big = t.select(Collective::kAllReduce, 64u << 20, 8, avail);
  EXPECT_EQ(big->algorithm, "ring");
  EXPECT_EQ(big->channels, 2);
  // LOOM_ALGO outranks the plugin.
  t.set_override(parse_algo_override("allreduce:hypercube").value());
  auto forced = t.select(Collective::kAllReduce, 1024, 8, avail);
  EXPECT_EQ(forced->algorithm, "hypercube");
  EXPECT_EQ(forced->source, "LOOM_ALGO");
}

TEST(TunerPlugin, LoadErrorsAreReported) {
  auto missing = TunerPlugin::load("/nonexistent/libnope.so", 2, 1);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("dlopen failed"), std::string::npos);
  // A shared library without the symbol (libloom itself).
  const char* b = std::getenv("LOOM_BUILD_DIR");
  auto nosym = TunerPlugin::load(std::string(b != nullptr ? b : ".") + "/lib/libloom.so", 2, 1);
  ASSERT_FALSE(nosym.is_ok());
  EXPECT_NE(nosym.status().message().find("does not export loom_tuner_plugin_v1"), std::string::npos);
  setenv("LOOM_TUNER_PLUGIN", "/nonexistent/libnope.so", 1);
  auto t = Tuner::from_env(flat_host(), 2);
  EXPECT_FALSE(t.is_ok());
  setenv("LOOM_TUNER_PLUGIN", example_plugin().c_str(), 1);
  auto ok = Tuner::from_env(flat_host(), 2);
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_NE(ok.value()->plugin(), nullptr);
  unsetenv("LOOM_TUNER_PLUGIN");
}

}  // namespace
}  // namespace loom::topo
