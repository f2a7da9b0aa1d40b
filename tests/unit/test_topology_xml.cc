// XML reader/writer and the NCCL-format importer: good files, round trips,
// and hostile input (errors name the line; warnings skip nodes; no crash).
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "core/log.h"
#include "test_topology_util.h"
#include "topology/discover.h"
#include "topology/paths.h"
#include "topology/topo_xml.h"
#include "topology/xml.h"

namespace loom::topo {
namespace {

using testing::QuietTopo;
using testing::shared_topology;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(TopologyXml, ParsesElementsAttributesAndLines) {
  auto r = parse_xml("<?xml version=\"1.0\"?>\n<!-- c -->\n<a x=\"1\" y='&lt;&amp;&#65;'>\n  <b/>\n  text\n  <c z=\"2\"></c>\n</a>\n");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const XmlElement& a = r.value();
  EXPECT_EQ(a.name, "a");
  EXPECT_EQ(a.line, 3);
  EXPECT_EQ(*a.attr("y"), "<&A");
  ASSERT_EQ(a.children.size(), 2u);
  EXPECT_EQ(a.children[0].line, 4);
  EXPECT_EQ(a.children[1].line, 6);
  EXPECT_EQ(*a.children[1].attr("z"), "2");
}

TEST(TopologyXml, WriterEscapesAndReparses) {
  XmlElement e;
  e.name = "system";
  e.set_attr("v", "a\"b<c>&d");
  XmlElement c;
  c.name = "cpu";
  e.children.push_back(c);
  auto r = parse_xml(write_xml(e));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(*r.value().attr("v"), "a\"b<c>&d");
  EXPECT_EQ(r.value().children.size(), 1u);
}

struct BadCase {
  const char* name;
  std::string text;
  const char* expect;  // substring of the error
};

TEST(TopologyXml, SyntaxErrorsNameTheLine) {
  std::string deep = "<system>\n";
  for (int i = 0; i < 100; ++i) deep += "<pci>";
  std::vector<BadCase> cases = {
      {"empty", "", "no root element"},
      {"mismatch", "<system>\n<cpu numaid=\"0\">\n</system>", "line 3: end tag </system> does not match <cpu> opened on line 2"},
      {"unterminated attr", "<system>\n<cpu numaid=\"0/>\n</system>", "line 3: '<' inside an attribute value"},
      {"unquoted", "<system a=1/>", "line 1: attribute value must be quoted"},
      {"duplicate attr", "<system a=\"1\" a=\"2\"/>", "duplicate attribute 'a'"},
      {"doctype", "<!DOCTYPE x [<!ENTITY a \"aaaa\">]>\n<system/>", "line 1: DOCTYPE"},
      {"unknown entity", "<system a=\"&lol;\"/>", "unknown entity"},
      {"non-ascii charref", "<system a=\"&#x10FFFF;\"/>", "only ASCII"},
      {"huge charref", "<system a=\"&#99999999999;\"/>", "line 1"},
      {"missing close", "<system>\n<cpu numaid=\"0\"/>\n", "missing </system>"},
      {"two roots", "<system/><system/>", "content after the root element"},
      {"deep", deep, "nested deeper than 32"},
      {"garbage", std::string("\x01\x02\xff<<>>", 7), "line 1"},
      {"comment", "<system>\n<!-- never closed", "line 2: unterminated comment"},
  };
  for (const BadCase& c : cases) {
    auto r = parse_xml(c.text);
    ASSERT_FALSE(r.is_ok()) << c.name;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << c.name << ": " << r.status().message();
  }
}

TEST(TopologyXml, LimitsAreEnforced) {
  XmlLimits lim;
  lim.max_elements = 10;
  std::string many = "<system>";
  for (int i = 0; i < 20; ++i) many += "<cpu/>";
  many += "</system>";
  auto r = parse_xml(many, lim);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("more than 10 elements"), std::string::npos);
  lim = XmlLimits{};
  lim.max_bytes = 16;
  EXPECT_FALSE(parse_xml("<system>                 </system>", lim).is_ok());
}

TEST(TopologyXml, TruncatedSharedFileIsAnError) {
  std::string text = read_file(shared_topology("azure-ndv4.xml"));
  ASSERT_GT(text.size(), 100u);
  for (size_t cut : {text.size() / 3, text.size() / 2, text.size() - 3}) {
    auto r = graph_from_xml_text(text.substr(0, cut), "truncated");
    ASSERT_FALSE(r.is_ok()) << cut;
    EXPECT_NE(r.status().message().find("line "), std::string::npos) << r.status().message();
  }
}

TEST(TopologyImport, WrongRootIsAnError) {
  auto r = graph_from_xml_text("<topology/>", "t");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("line 1: root element is <topology>, expected <system>"), std::string::npos);
}

TEST(TopologyImport, SemanticProblemsWarnAndSkip) {
  QuietTopo quiet;
  const std::string text =
      "<system version=\"1\">\n"                                                            // 1
      "  <gadget/>\n"                                                                        // 2 unknown
      "  <cpu numaid=\"0\" vendor=\"GenuineIntel\" familyid=\"6\" modelid=\"banana\">\n"   // 3 bad modelid
      "    <pci class=\"0x030200\"/>\n"                                                     // 4 no busid
      "    <pci busid=\"zz:00.0\" class=\"0x030200\"/>\n"                                  // 5 bad busid
      "    <pci busid=\"0000:01:00.0\" class=\"0x030200\" link_width=\"99999999999999999999\" link_speed=\"16 GT/s\"/>\n"  // 6
      "    <pci busid=\"0000:01:00.0\" class=\"0x030200\"/>\n"                             // 7 duplicate
      "    <pci busid=\"0000:02:00.0\" class=\"0x030200\"><gpu sm=\"80\"><nvlink target=\"0000:01:00.0\" count=\"1000000000\"/></gpu></pci>\n"  // 8
      "    <pci busid=\"0000:03:00.0\" class=\"0x020700\"><nic><net name=\"mlx5_0\" speed=\"1e300\" latency=\"-4\"/></nic></pci>\n"  // 9
      "  </cpu>\n"
      "  <cpu numaid=\"-5\"/>\n"   // 11
      "  <cpu numaid=\"0\"/>\n"    // 12 duplicate
      "  <cpu/>\n"                 // 13
      "</system>\n";
  auto r = graph_from_xml_text(text, "hostile.xml");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const auto& w = r.value().warnings;
  auto has = [&](const std::string& s) {
    for (const auto& x : w) {
      if (x.find(s) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(has("hostile.xml: line 2: unknown element <gadget>"));
  EXPECT_TRUE(has("line 3: <cpu> modelid 'banana' invalid"));
  EXPECT_TRUE(has("line 4: <pci> without busid skipped"));
  EXPECT_TRUE(has("line 5: <pci> busid 'zz:00.0' malformed"));
  EXPECT_TRUE(has("line 6: <pci> link_width"));
  EXPECT_TRUE(has("line 7: duplicate <pci busid=\"0000:01:00.0\">"));
  EXPECT_TRUE(has("<nvlink> count missing or outside"));
  EXPECT_TRUE(has("line 9: <net> speed '1e300'"));
  EXPECT_TRUE(has("line 9: <net> latency '-4'"));
  EXPECT_TRUE(has("line 11: <cpu> numaid '-5' invalid"));
  EXPECT_TRUE(has("line 12: duplicate <cpu numaid=\"0\">"));
  EXPECT_TRUE(has("line 13: <cpu> without numaid"));
  const TopoGraph& g = r.value().graph;
  EXPECT_EQ(g.count(NodeType::kCpu), 1);
  EXPECT_EQ(g.count(NodeType::kGpu), 2);  // lines 6 and 8
  EXPECT_EQ(g.count(NodeType::kNic), 1);
  for (const TopoLink& l : g.links) EXPECT_NE(l.type, LinkType::kNvLink);
  // The bad width fell back to the documented default, not to garbage.
  for (const TopoLink& l : g.links) EXPECT_TRUE(l.bw > 0 && l.bw < 1000) << l.bw;
}

TEST(TopologyImport, TooManyCpusAreCapped) {
  QuietTopo quiet;
  std::string text = "<system version=\"1\">\n";
  for (int i = 0; i < 300; ++i) text += "  <cpu numaid=\"" + std::to_string(i) + "\"/>\n";
  text += "</system>\n";
  auto r = graph_from_xml_text(text, "many.xml");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value().graph.count(NodeType::kCpu), 256);
  ASSERT_EQ(r.value().warnings.size(), 1u);
  EXPECT_NE(r.value().warnings[0].find("more than 256 <cpu> elements"), std::string::npos) << r.value().warnings[0];
}

TEST(TopologyImport, NoUsableCpuStillGivesOneNode) {
  QuietTopo quiet;
  auto r = graph_from_xml_text("<system><cpu/><bogus/></system>", "t");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r.value().graph.nodes.size(), 1u);
  EXPECT_EQ(r.value().graph.nodes[0].type, NodeType::kCpu);
}

// The graph's NVLinks (each once).
std::vector<TopoLink> nvlinks(const TopoGraph& g) {
  std::vector<TopoLink> out;
  for (const TopoLink& l : g.links)
    if (l.type == LinkType::kNvLink) out.push_back(l);
  return out;
}

void expect_round_trip(const TopoGraph& g) {
  std::string xml = write_xml(graph_to_xml(g));
  auto again = graph_from_xml_text(xml, g.source);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_TRUE(again.value().warnings.empty());
  EXPECT_EQ(again.value().graph.describe(), g.describe()) << xml;
  // And a second export is byte-identical to the first.
  EXPECT_EQ(write_xml(graph_to_xml(again.value().graph)), xml);
}

TEST(TopologyImport, SharedFilesRoundTrip) {
  for (const char* f : {"azure-ndv2.xml", "azure-ndv4.xml"}) {
    auto r = load_topology_file(shared_topology(f));
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_TRUE(r.value().warnings.empty()) << f;
    expect_round_trip(r.value().graph);
  }
}

// A DGX-like file with everything the format has: NVSwitch NVLinks, direct
// NVLinks, a multi-port NIC and a NIC without PCI information.
const char* kRichXml = R"(<system version="1">
  <cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
    <pci busid="0000:10:00.0" class="0x060400" link_speed="32 GT/s" link_width="16">
      <pci busid="0000:11:00.0" class="0x030200" link_speed="32 GT/s" link_width="16">
        <gpu dev="1" sm="90" rank="1" gdr="1">
          <nvlink target="0000:a0:00.0" count="18" tclass="0x068000"/>
        </gpu>
      </pci>
      <pci busid="0000:12:00.0" class="0x020000" link_speed="32 GT/s" link_width="16">
        <nic>
          <net name="eth4" dev="0" speed="400000" port="1" latency="1.5"/>
          <net name="eth5" dev="1" speed="100000" port="2"/>
        </nic>
      </pci>
    </pci>
    <pci busid="0000:21:00.0" class="0x030200" link_speed="32 GT/s" link_width="16">
      <gpu dev="0" sm="90" rank="0" gdr="1">
        <nvlink target="0000:a1:00.0" count="18" tclass="0x068000"/>
        <nvlink target="0000:11:00.0" count="2" tclass="0x030200"/>
      </gpu>
    </pci>
    <nic>
      <net name="lo9" dev="2" speed="10000"/>
    </nic>
  </cpu>
</system>
)";

// NCCL writes numaid="-1" where sysfs knows no NUMA node (VMs, e.g. an H200
// VM's dump in nccl-tests issue 256). Regression: such a <cpu> was skipped
// with every GPU and NIC under it (0 GPUs). All of them are one CPU node.
TEST(TopologyImport, UnknownNumaCpuKeepsItsDevices) {
  const std::string text =
      "<system version=\"1\">\n"
      "  <cpu numaid=\"-1\" arch=\"x86_64\">\n"
      "    <pci busid=\"0000:01:00.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\"><gpu dev=\"0\" sm=\"90\" rank=\"0\" gdr=\"1\"/></pci>\n"
      "  </cpu>\n"
      "  <cpu numaid=\"-1\" arch=\"x86_64\">\n"
      "    <pci busid=\"0000:02:00.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\"><gpu dev=\"1\" sm=\"90\" rank=\"1\" gdr=\"1\"/></pci>\n"
      "  </cpu>\n"
      "</system>\n";
  auto r = graph_from_xml_text(text, "vm.xml");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(r.value().warnings.empty()) << r.value().warnings.front();
  const TopoGraph& g = r.value().graph;
  EXPECT_EQ(g.count(NodeType::kCpu), 1);
  EXPECT_EQ(g.count(NodeType::kGpu), 2);
  expect_round_trip(g);
}

TEST(TopologyImport, NvLinksNvSwitchAndNicsAreModelled) {
  auto r = graph_from_xml_text(kRichXml, "rich");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(r.value().warnings.empty());
  const TopoGraph& g = r.value().graph;
  EXPECT_EQ(g.count(NodeType::kGpu), 2);
  EXPECT_EQ(g.count(NodeType::kNvSwitch), 1);
  EXPECT_EQ(g.count(NodeType::kNic), 3);
  // dev attributes order the GPUs: GPU0 is 0000:21:00.0.
  EXPECT_EQ(g.nodes[static_cast<size_t>(g.nodes_of(NodeType::kGpu)[0])].busid, "0000:21:00.0");
  const std::vector<TopoLink> nvl = nvlinks(g);
  for (const TopoLink& l : nvl) {
    double lanes = l.count;
    EXPECT_DOUBLE_EQ(l.bw, lanes * 25.0);
  }
  EXPECT_EQ(nvl.size(), 3u);  // two GPU-NVS links and one direct GPU-GPU link
  std::vector<int> nics = g.nodes_of(NodeType::kNic);
  EXPECT_EQ(g.nodes[static_cast<size_t>(nics[0])].name, "eth4");
  EXPECT_DOUBLE_EQ(g.nodes[static_cast<size_t>(nics[0])].net_bw, 50.0);
  EXPECT_DOUBLE_EQ(g.nodes[static_cast<size_t>(nics[0])].net_latency_us, 1.5);
  EXPECT_TRUE(g.nodes[static_cast<size_t>(nics[2])].busid.empty());
  expect_round_trip(g);
}

// NCCL's own dumps list one <nvlink> per physical NVSwitch. Loom folds the
// switches into one node, so those lanes must add up on the one link; the
// same switch listed twice is a mistake (warned, ignored). Regression: every
// switch after the first was dropped, losing two thirds of an H100's NVLink
// bandwidth on import.
TEST(TopologyImport, LinksToSeveralNvSwitchesAddUp) {
  const char* xml = R"(<system version="1">
  <cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
    <pci busid="0000:21:00.0" class="0x030200" link_speed="32 GT/s" link_width="16">
      <gpu dev="0" sm="90" rank="0" gdr="1">
        <nvlink target="0000:a0:00.0" count="6" tclass="0x068000"/>
        <nvlink target="0000:a1:00.0" count="6" tclass="0x068000"/>
        <nvlink target="0000:a2:00.0" count="6" tclass="0x068000"/>
        <nvlink target="0000:a2:00.0" count="6" tclass="0x068000"/>
      </gpu>
    </pci>
  </cpu>
</system>
)";
  auto r = graph_from_xml_text(xml, "switches");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r.value().warnings.size(), 1u);
  EXPECT_NE(r.value().warnings[0].find("0000:a2:00.0"), std::string::npos) << r.value().warnings[0];
  const TopoGraph& g = r.value().graph;
  EXPECT_EQ(g.count(NodeType::kNvSwitch), 1);
  const std::vector<TopoLink> nvl = nvlinks(g);
  for (const TopoLink& l : nvl) {
    EXPECT_EQ(l.count, 18);
    EXPECT_DOUBLE_EQ(l.bw, 18 * 25.0);
  }
  EXPECT_EQ(nvl.size(), 1u);
  expect_round_trip(g);
}

// Inside a VM NVML does not see the far end of an NVLink; NCCL's dump then
// names the sentinel "fffffff:ffff:ff" with tclass 0x068000 (NVSwitch
// assumed). Regression: such links were dropped as malformed, so an H100 VM
// had no NVLink at all.
TEST(TopologyImport, VmNvLinkSentinelIsAnNvSwitch) {
  const char* xml = R"(<system version="1">
  <cpu numaid="0" affinity="ffffffff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
    <pci busid="0000:18:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16">
      <gpu dev="0" sm="90" rank="0" gdr="1">
        <nvlink target="fffffff:ffff:ff" count="18" tclass="0x068000"/>
      </gpu>
    </pci>
    <pci busid="0000:2a:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16">
      <gpu dev="1" sm="90" rank="1" gdr="1">
        <nvlink target="fffffff:ffff:ff" count="18" tclass="0x068000"/>
      </gpu>
    </pci>
  </cpu>
</system>
)";
  auto r = graph_from_xml_text(xml, "vm-nvswitch");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(r.value().warnings.empty()) << r.value().warnings.front();
  const TopoGraph& g = r.value().graph;
  EXPECT_EQ(g.count(NodeType::kNvSwitch), 1);
  const std::vector<TopoLink> nvl = nvlinks(g);
  for (const TopoLink& l : nvl) {
    EXPECT_EQ(l.count, 18);
    EXPECT_EQ(g.nodes[static_cast<size_t>(l.b)].type, NodeType::kNvSwitch);
  }
  EXPECT_EQ(nvl.size(), 2u);
  std::vector<int> gpus = g.nodes_of(NodeType::kGpu);
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(find_path(g, gpus[0], gpus[1]).type, PathType::kNvLink);
  expect_round_trip(g);
  // A garbage target is still refused.
  QuietTopo quiet;
  std::string bad = xml;
  bad.replace(bad.find("fffffff:ffff:ff"), 15, "not-a-bus-id!!!");
  auto b = graph_from_xml_text(bad, "bad-target");
  ASSERT_TRUE(b.is_ok());
  ASSERT_EQ(b.value().warnings.size(), 1u);
  EXPECT_NE(b.value().warnings[0].find("target 'not-a-bus-id!!!' is not a PCI bus id"), std::string::npos)
      << b.value().warnings[0];
}

// NVML gives bus ids with 8-digit domains, sysfs with 4; NCCL compares them
// by value. Regression: an <nvlink target="00000000:2a:00.0"> did not find
// the GPU at 0000:2a:00.0 and the NVLink was dropped.
TEST(TopologyImport, BusIdsCompareByValue) {
  std::string b;
  ASSERT_TRUE(normalize_busid("00000000:2A:00.0", b));
  EXPECT_EQ(b, "0000:2a:00.0");
  ASSERT_TRUE(normalize_busid("0001a:00:01.0", b));
  EXPECT_EQ(b, "001a:00:01.0");
  ASSERT_TRUE(normalize_busid("0:00:01.0", b));
  EXPECT_EQ(b, "0000:00:01.0");
  ASSERT_TRUE(normalize_busid("00010000:00:01.0", b));
  EXPECT_EQ(b, "10000:00:01.0");
  const char* xml = R"(<system version="1">
  <cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
    <pci busid="0000:18:00.0" class="0x030200" link_speed="8.0 GT/s PCIe" link_width="16">
      <gpu dev="0" sm="70"><nvlink target="00000000:2a:00.0" count="2" tclass="0x030200"/></gpu>
    </pci>
    <pci busid="00000000:2a:00.0" class="0x030200" link_speed="8.0 GT/s PCIe" link_width="16">
      <gpu dev="1" sm="70"><nvlink target="0000:18:00.0" count="2" tclass="0x030200"/></gpu>
    </pci>
  </cpu>
</system>
)";
  auto r = graph_from_xml_text(xml, "nvml-busids");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(r.value().warnings.empty()) << r.value().warnings.front();
  const TopoGraph& g = r.value().graph;
  const std::vector<TopoLink> nvl = nvlinks(g);
  for (const TopoLink& l : nvl) {
    EXPECT_EQ(l.count, 2);
    EXPECT_DOUBLE_EQ(l.bw, 2 * 25.0);
  }
  EXPECT_EQ(nvl.size(), 1u);
  EXPECT_GE(g.find_busid("0000:2a:00.0", NodeType::kGpu), 0);
  expect_round_trip(g);
}

// Two GPUs whose NVLinks go to 0000:c3:00.0 with the given tclass.
std::string nvlink_tclass_xml(const std::string& tclass) {
  std::string gpu0 = "<pci busid=\"0000:18:00.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">"
                     "<gpu dev=\"0\" sm=\"80\"><nvlink target=\"0000:c3:00.0\" count=\"6\" tclass=\"" + tclass +
                     "\"/></gpu></pci>\n";
  std::string gpu1 = gpu0;
  gpu1.replace(gpu1.find("18:00.0"), 7, "2a:00.0");
  gpu1.replace(gpu1.find("dev=\"0\""), 7, "dev=\"1\"");
  return "<system version=\"1\">\n<cpu numaid=\"0\" arch=\"x86_64\" vendor=\"GenuineIntel\" familyid=\"6\" modelid=\"143\">\n" +
         gpu0 + gpu1 + "</cpu>\n</system>\n";
}

// The far end of an NVLink by its tclass, as NCCL decides it: 0x068001 is a
// POWER9 CPU's NVLink port (the GPU gets an NVLink to its own CPU), any
// 0x03xxxx a GPU, anything else an NVSwitch. Regression: 0x068001 was cut to
// 0x0680 and became an invented NVSwitch (NVL between GPUs that have none);
// 0x060400 was taken for a CPU and dropped ("to a CPU is not modelled").
TEST(TopologyImport, NvLinkTargetClassesAsNccl) {
  {
    auto r = graph_from_xml_text(nvlink_tclass_xml("0x068001"), "p9");
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_TRUE(r.value().warnings.empty()) << r.value().warnings.front();
    const TopoGraph& g = r.value().graph;
    EXPECT_EQ(g.count(NodeType::kNvSwitch), 0);
    int cpu = g.nodes_of(NodeType::kCpu)[0];
    const std::vector<TopoLink> nvl = nvlinks(g);
    for (const TopoLink& l : nvl) {
      EXPECT_TRUE(l.a == cpu || l.b == cpu);
      EXPECT_EQ(l.count, 6);
      EXPECT_DOUBLE_EQ(l.bw, 6 * 25.0);
    }
    EXPECT_EQ(nvl.size(), 2u);
    std::vector<int> gpus = g.nodes_of(NodeType::kGpu);
    EXPECT_EQ(find_path(g, gpus[0], cpu).type, PathType::kNvLink);
    expect_round_trip(g);
    EXPECT_NE(write_xml(graph_to_xml(g)).find("target=\"0000:c3:00.0\" count=\"6\" tclass=\"0x068001\""),
              std::string::npos);
  }
  for (const char* nvs_class : {"0x068000", "0x060400", "0x0680"}) {
    auto r = graph_from_xml_text(nvlink_tclass_xml(nvs_class), nvs_class);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_TRUE(r.value().warnings.empty()) << nvs_class << ": " << r.value().warnings.front();
    const TopoGraph& g = r.value().graph;
    EXPECT_EQ(g.count(NodeType::kNvSwitch), 1) << nvs_class;
    int nvl = 0;
    for (const TopoLink& l : g.links) nvl += l.type == LinkType::kNvLink;
    EXPECT_EQ(nvl, 2) << nvs_class;
  }
  {
    // A 0x03 class other than 0x0302 is a GPU too: 0000:c3:00.0 is not one
    // of this file's GPUs, so the link is skipped with that reason.
    QuietTopo quiet;
    auto r = graph_from_xml_text(nvlink_tclass_xml("0x038000"), "gpu-class");
    ASSERT_TRUE(r.is_ok());
    ASSERT_EQ(r.value().warnings.size(), 2u);
    EXPECT_NE(r.value().warnings[0].find("target 0000:c3:00.0 is not another GPU"), std::string::npos)
        << r.value().warnings[0];
    EXPECT_EQ(r.value().graph.count(NodeType::kNvSwitch), 0);
  }
  {
    QuietTopo quiet;
    auto r = graph_from_xml_text(nvlink_tclass_xml("0x0x0302"), "bad-class");
    ASSERT_TRUE(r.is_ok());
    ASSERT_EQ(r.value().warnings.size(), 2u);
    EXPECT_NE(r.value().warnings[0].find("tclass '0x0x0302' malformed"), std::string::npos) << r.value().warnings[0];
  }
}

// NCCL makes a GPU of any display class (0x03xxxx) with a <gpu> child.
// Regression: class 0x038000 ("other display controller", which some GPUs
// report) was dropped silently with its <gpu>; and a malformed class was
// half-parsed by strtol ("0x0x0302" read as class 0x0003) and dropped without
// a word.
TEST(TopologyImport, AnyDisplayClassWithAGpuIsAGpu) {
  const char* xml = R"(<system version="1"><cpu numaid="0">
  <pci busid="0000:01:00.0" class="0x038000" link_speed="16.0 GT/s PCIe" link_width="16"><gpu dev="0" sm="90"/></pci>
  <pci busid="0000:02:00.0" class="0x030000" link_speed="16.0 GT/s PCIe" link_width="16"><gpu dev="1" sm="90"/></pci>
  <pci busid="0000:03:00.0" class="0x030000"/>
</cpu></system>
)";
  auto r = graph_from_xml_text(xml, "c380");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(r.value().warnings.empty()) << r.value().warnings.front();
  const TopoGraph& g = r.value().graph;
  EXPECT_EQ(g.count(NodeType::kGpu), 2);  // a VGA device without <gpu> (a BMC) is not one
  EXPECT_GE(g.find_busid("0000:01:00.0", NodeType::kGpu), 0);
  expect_round_trip(g);

  QuietTopo quiet;
  for (const char* bad : {"0x0x0302", "0x3", "0x03020", "0x+30200", "0x 0302", "0302"}) {
    std::string text = std::string("<system><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\" class=\"") + bad +
                       "\"/></cpu></system>";
    auto b = graph_from_xml_text(text, "bad-class");
    ASSERT_TRUE(b.is_ok()) << bad;
    ASSERT_EQ(b.value().warnings.size(), 1u) << bad;
    EXPECT_NE(b.value().warnings[0].find(std::string("<pci> class '") + bad + "' malformed"), std::string::npos)
        << b.value().warnings[0];
    EXPECT_EQ(b.value().graph.count(NodeType::kGpu), 0) << bad;
  }
}

// The bandwidth of a GPU's PCI link as imported from these attributes.
double gpu_pci_bw(const std::string& link_attrs) {
  std::string text = "<system><cpu numaid=\"0\"><pci busid=\"0000:00:04.0\" class=\"0x030200\" " + link_attrs +
                     "><gpu dev=\"0\" sm=\"90\"/></pci></cpu></system>";
  auto r = graph_from_xml_text(text, "link");
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  if (!r.is_ok()) return -1;
  EXPECT_TRUE(r.value().warnings.empty()) << link_attrs << ": " << r.value().warnings.front();
  for (const TopoLink& l : r.value().graph.links)
    if (l.type == LinkType::kPci) return l.bw;
  return -1;
}

// NCCL writes link_width="0" where the upstream port has no max_link_width
// (a device on a root port) and its importer reads that as x16 at the given
// speed. Regression: Loom warned and fell back to gen3 x16, so a gen5 GPU
// had a quarter of its PCIe bandwidth. "Unknown speed" (older kernels) is
// "Unknown": the documented default, without a warning.
TEST(TopologyImport, LinkWidthZeroIsX16AtTheGivenSpeed) {
  EXPECT_NEAR(gpu_pci_bw("link_speed=\"32.0 GT/s PCIe\" link_width=\"0\""), pcie_bw("32.0 GT/s", 16), 1e-9);
  EXPECT_NEAR(gpu_pci_bw("link_speed=\"32.0 GT/s PCIe\" link_width=\"16\""), 63.02, 0.01);
  EXPECT_NEAR(gpu_pci_bw("link_speed=\"16.0 GT/s PCIe\" link_width=\"8\""), 15.75, 0.01);
  EXPECT_NEAR(gpu_pci_bw("link_speed=\"Unknown\" link_width=\"16\""), 15.75, 0.01);
  EXPECT_NEAR(gpu_pci_bw("link_speed=\"Unknown speed\" link_width=\"0\""), 15.75, 0.01);
}

// A link_speed NCCL does not know (sysfs "Unknown", none, or a text it has
// no entry for) is gen3's rate per lane at the link_width given: NCCL
// multiplies its default per-lane speed by the width. Regression: Loom took
// gen3 x16 whatever the width, so an x8 link of unknown speed had twice
// its bandwidth and an x1 sixteen times.
TEST(TopologyImport, UnknownLinkSpeedIsGen3AtTheGivenWidth) {
  const double gen3_lane = 15.75 / 16;
  EXPECT_NEAR(gpu_pci_bw("link_speed=\"Unknown\" link_width=\"8\""), 8 * gen3_lane, 1e-9);
  EXPECT_NEAR(gpu_pci_bw("link_speed=\"Unknown speed\" link_width=\"4\""), 4 * gen3_lane, 1e-9);
  EXPECT_NEAR(gpu_pci_bw("link_speed=\"\" link_width=\"1\""), gen3_lane, 1e-9);
  EXPECT_NEAR(gpu_pci_bw("link_width=\"2\""), 2 * gen3_lane, 1e-9);
  // Width 0 is still x16, and no link attributes at all still gen3 x16.
  EXPECT_NEAR(gpu_pci_bw("link_speed=\"Unknown\" link_width=\"0\""), 16 * gen3_lane, 1e-9);
  EXPECT_NEAR(gpu_pci_bw(""), 16 * gen3_lane, 1e-9);

  // A speed that is not one: warned about, and gen3 at the given width too.
  QuietTopo quiet;
  auto r = graph_from_xml_text(
      "<system><cpu numaid=\"0\"><pci busid=\"0000:00:04.0\" class=\"0x030200\" link_speed=\"fast\" "
      "link_width=\"8\"><gpu dev=\"0\" sm=\"90\"/></pci></cpu></system>",
      "bad-speed");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r.value().warnings.size(), 1u);
  EXPECT_NE(r.value().warnings[0].find("link_speed 'fast' not understood; assuming PCIe gen3 x8"), std::string::npos)
      << r.value().warnings[0];
  double bw = -1;
  for (const TopoLink& l : r.value().graph.links)
    if (l.type == LinkType::kPci) bw = l.bw;
  EXPECT_NEAR(bw, 8 * gen3_lane, 1e-9);
}

// NCCL takes a <net> whose speed is not given (or is -1 or 0, as sysfs and
// some NICs say "unknown", or is not a number) as 10 Gb/s. Regression: Loom
// bounded such a port only by its PCI link, so a NIC of a dump without
// speeds was priced at its gen4 x16 link, 31.5 GB/s, 25 times NCCL's model.
// A NIC <pci> or <nic> with no <net> at all (Loom's shorthand, of which NCCL
// makes no network device) is still bounded by its PCI link.
TEST(TopologyImport, NetWithoutSpeedIs10G) {
  const std::string text =
      "<system version=\"1\">\n"                                                                           // 1
      "  <cpu numaid=\"0\">\n"                                                                             // 2
      "    <pci busid=\"0000:03:00.0\" class=\"0x020700\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">\n"  // 3
      "      <nic>\n"                                                                                      // 4
      "        <net name=\"mlx5_0\" dev=\"0\"/>\n"                                                        // 5
      "        <net name=\"mlx5_1\" dev=\"1\" speed=\"-1\"/>\n"                                          // 6
      "        <net name=\"mlx5_2\" dev=\"2\" speed=\"0\"/>\n"                                           // 7
      "        <net name=\"mlx5_3\" dev=\"3\" speed=\"200000\"/>\n"                                      // 8
      "      </nic>\n"
      "    </pci>\n"
      "    <pci busid=\"0000:04:00.0\" class=\"0x020000\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\"/>\n"  // 11
      "    <nic><net name=\"eth0\" dev=\"4\"/></nic>\n"                                                  // 12
      "    <nic><net/></nic>\n"                                                                            // 13
      "  </cpu>\n"
      "</system>\n";
  auto r = graph_from_xml_text(text, "nets.xml");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(r.value().warnings.empty()) << r.value().warnings.front();
  const TopoGraph& g = r.value().graph;
  const double ten_g = 10000.0 / 8000.0, gen4_x16 = pcie_bw("16.0 GT/s", 16);
  std::map<std::string, double> bw;
  for (int n : g.nodes_of(NodeType::kNic)) {
    const TopoNode& nic = g.nodes[static_cast<size_t>(n)];
    bw[nic.name] = nic.net_bw;
    EXPECT_EQ(nic.speed_known, nic.name == "mlx5_3") << nic.name;
    // The PCI link of the NIC is its own, whatever the port's speed.
    if (nic.busid.empty()) continue;
    for (const TopoLink& l : g.links) {
      if (l.a != n && l.b != n) continue;
      EXPECT_NEAR(l.bw, gen4_x16, 1e-9) << nic.name;
    }
  }
  EXPECT_EQ(bw, (std::map<std::string, double>{{"mlx5_0", ten_g},
                                                {"mlx5_1", ten_g},
                                                {"mlx5_2", ten_g},
                                                {"mlx5_3", 25.0},
                                                {"0000:04:00.0", gen4_x16},
                                                {"eth0", ten_g},
                                                {"nic", ten_g}}));
  // Each default is a note (logged at INFO TOPO when the file is loaded).
  const auto& notes = r.value().notes;
  ASSERT_EQ(notes.size(), 5u);
  EXPECT_EQ(notes[0], "nets.xml: line 5: NIC mlx5_0: <net> without a usable speed; assuming 10 Gb/s as NCCL does");
  EXPECT_NE(notes[3].find("line 12: NIC eth0:"), std::string::npos) << notes[3];
  // A <net> without attributes stays one through export, and so stays 10 Gb/s.
  expect_round_trip(g);

  // A speed that is no number is warned about, and is 10 Gb/s too.
  QuietTopo quiet;
  auto bad = graph_from_xml_text("<system><cpu numaid=\"0\"><nic><net name=\"eth1\" speed=\"fast\"/></nic></cpu></system>",
                                 "bad.xml");
  ASSERT_TRUE(bad.is_ok());
  ASSERT_EQ(bad.value().warnings.size(), 1u);
  EXPECT_NE(bad.value().warnings[0].find("<net> speed 'fast' outside 1..1e7 Mb/s; assuming 10 Gb/s"), std::string::npos)
      << bad.value().warnings[0];
  ASSERT_EQ(bad.value().graph.count(NodeType::kNic), 1);
  EXPECT_DOUBLE_EQ(bad.value().graph.nodes[static_cast<size_t>(bad.value().graph.nodes_of(NodeType::kNic)[0])].net_bw,
                   ten_g);

  // Loaded through LOOM_TOPO_FILE, the notes are INFO TOPO lines.
  const std::string file = ::testing::TempDir() + "/loom_nets.xml";
  const std::string log = ::testing::TempDir() + "/loom_nets_log.txt";
  std::ofstream(file) << text;
  std::remove(log.c_str());
  setenv("LOOM_TOPO_FILE", file.c_str(), 1);
  setenv("LOOM_DEBUG", "INFO", 1);
  setenv("LOOM_DEBUG_SUBSYS", "TOPO", 1);
  setenv("LOOM_DEBUG_FILE", log.c_str(), 1);
  log_reinit();
  auto loaded = load_system_topology();
  unsetenv("LOOM_TOPO_FILE");
  unsetenv("LOOM_DEBUG_FILE");
  unsetenv("LOOM_DEBUG");
  unsetenv("LOOM_DEBUG_SUBSYS");
  log_reinit();  // closes the file
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  const std::string logged = read_file(log);
  EXPECT_NE(logged.find("loom INFO TOPO " + file + ": line 5: NIC mlx5_0: <net> without a usable speed; assuming 10 Gb/s"),
            std::string::npos)
      << logged;
  std::remove(file.c_str());
  std::remove(log.c_str());
}

TEST(TopologyImport, DumpFileAndEnvironment) {
  std::string dump = ::testing::TempDir() + "/loom_topo_dump.xml";
  setenv("LOOM_TOPO_FILE", shared_topology("azure-ndv2.xml").c_str(), 1);
  setenv("NCCL_TOPO_FILE", "/nonexistent/should/not/be/read.xml", 1);
  setenv("NCCL_TOPO_DUMP_FILE", dump.c_str(), 1);
  std::remove(dump.c_str());
  auto r = load_system_topology();
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value().graph.count(NodeType::kGpu), 8);
  // One rank writes the dump, as NCCL: rank 0 unless NCCL_TOPO_DUMP_FILE_RANK
  // (or LOOM_TOPO_DUMP_FILE_RANK) says otherwise; a tool (rank -1) always.
  auto exists = [&] { return std::ifstream(dump).good(); };
  dump_system_topology(r.value().graph, 1);
  EXPECT_FALSE(exists());
  setenv("NCCL_TOPO_DUMP_FILE_RANK", "1", 1);
  dump_system_topology(r.value().graph, 0);
  EXPECT_FALSE(exists());
  dump_system_topology(r.value().graph, 1);
  EXPECT_TRUE(exists());
  std::remove(dump.c_str());
  setenv("LOOM_TOPO_DUMP_FILE_RANK", "2", 1);  // LOOM_ wins
  dump_system_topology(r.value().graph, 1);
  EXPECT_FALSE(exists());
  dump_system_topology(r.value().graph, 2);
  EXPECT_TRUE(exists());
  std::remove(dump.c_str());
  unsetenv("LOOM_TOPO_DUMP_FILE_RANK");
  unsetenv("NCCL_TOPO_DUMP_FILE_RANK");
  dump_system_topology(r.value().graph, -1);
  auto back = load_topology_file(dump);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back.value().graph.describe(), r.value().graph.describe());
  // With LOOM_TOPO_FILE unset, NCCL_TOPO_FILE is used; a missing file is an error.
  unsetenv("LOOM_TOPO_FILE");
  auto bad = load_system_topology();
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("/nonexistent/should/not/be/read.xml"), std::string::npos);
  unsetenv("NCCL_TOPO_FILE");
  unsetenv("NCCL_TOPO_DUMP_FILE");
}

TEST(TopologyDiscover, ThisMachineYieldsAUsableGraph) {
  auto r = discover_topology();
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const TopoGraph& g = r.value().graph;
  EXPECT_GE(g.count(NodeType::kCpu), 1);
  expect_round_trip(g);
  DiscoverOptions no_hwloc;
  no_hwloc.use_hwloc = false;
  auto s = discover_topology(no_hwloc);
  ASSERT_TRUE(s.is_ok());
  EXPECT_GE(s.value().graph.count(NodeType::kCpu), 1);
}

TEST(TopologyDiscover, EmptySysfsStillGivesOneCpu) {
  DiscoverOptions o;
  o.use_hwloc = false;
  o.sysfs_root = ::testing::TempDir() + "/loom_empty_sysfs_does_not_exist";
  auto r = discover_topology(o);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r.value().graph.nodes.size(), 1u);
}

TEST(TopologyDiscover, SysfsNetworkSpeeds) {
  std::string root = ::testing::TempDir() + "/loom_fake_sysfs";
  auto put = [&](const std::string& rel, const std::string& content) {
    std::string path = root + "/" + rel;
    std::string dir = path.substr(0, path.rfind('/'));
    ASSERT_EQ(std::system(("mkdir -p '" + dir + "'").c_str()), 0);
    std::ofstream(path) << content << "\n";
  };
  put("class/net/lo/operstate", "unknown");
  put("class/net/eth7/operstate", "up");
  put("class/net/eth7/speed", "25000");
  put("class/net/eth8/operstate", "down");
  put("class/net/veth1/operstate", "up");
  put("class/net/veth1/speed", "-1");
  put("class/infiniband/mlx5_3/ports/1/rate", "200 Gb/sec (4X HDR)");
  auto nets = list_net_interfaces(root);
  ASSERT_EQ(nets.size(), 2u);
  EXPECT_EQ(nets[0].name, "eth7");
  EXPECT_EQ(nets[0].speed_mbps, 25000);
  EXPECT_EQ(nets[1].name, "veth1");
  EXPECT_EQ(nets[1].speed_mbps, 0);
  EXPECT_EQ(ib_port_rate_mbps(root, "mlx5_3", 1), 200000);
  EXPECT_EQ(ib_port_rate_mbps(root, "mlx5_3", 2), 0);
  // Without hwloc these become NICs under the first CPU, with their speed.
  DiscoverOptions o;
  o.use_hwloc = false;
  o.sysfs_root = root;
  auto r = discover_topology(o);
  ASSERT_TRUE(r.is_ok());
  const TopoGraph& g = r.value().graph;
  ASSERT_EQ(g.count(NodeType::kNic), 2);
  EXPECT_DOUBLE_EQ(g.nodes[static_cast<size_t>(g.nodes_of(NodeType::kNic)[0])].net_bw, 25000.0 / 8000.0);
}

// A fake sysfs tree under the test's temp dir, removed first.
struct FakeSysfs {
  std::string root;
  explicit FakeSysfs(const std::string& name) : root(::testing::TempDir() + "/" + name) {
    EXPECT_EQ(std::system(("rm -rf '" + root + "' && mkdir -p '" + root + "'").c_str()), 0);
  }
  void put(const std::string& rel, const std::string& content) const {
    std::string path = root + "/" + rel;
    std::string dir = path.substr(0, path.rfind('/'));
    ASSERT_EQ(std::system(("mkdir -p '" + dir + "'").c_str()), 0);
    std::ofstream(path) << content << "\n";
  }
  // bus/pci/devices/<busid> -> the device's directory under devices/, as the kernel links it.
  void pci_device(const std::string& busid, const std::string& devices_path) const {
    ASSERT_EQ(std::system(("mkdir -p '" + root + "/devices/" + devices_path + "' '" + root + "/bus/pci/devices' && ln -s '" +
                           root + "/devices/" + devices_path + "' '" + root + "/bus/pci/devices/" + busid + "'")
                              .c_str()),
              0);
  }
  std::string attr(const std::string& busid, const std::string& name) const {
    AttrList a;
    pci_link_attrs(root, busid, a);
    XmlElement el;
    el.attrs = a;
    const std::string* v = el.attr(name);
    return v == nullptr ? "(none)" : *v;
  }
};

// NCCL reads max_link_speed/max_link_width of the device and of its upstream
// port and keeps the smaller. Regression: Loom read current_link_*, and a GPU
// idles at 2.5 GT/s, so the model (and the algorithms chosen) depended on the
// power state at init; it also cut the " PCIe" suffix NCCL keeps.
TEST(TopologyDiscover, PciLinkIsMaxOfDeviceCappedByItsPort) {
  FakeSysfs fs("loom_fake_sysfs_link");
  const std::string port = "pci0000:00/0000:00:01.0";
  fs.pci_device("0000:00:01.0", port);
  fs.pci_device("0000:01:00.0", port + "/0000:01:00.0");
  fs.pci_device("0000:02:00.0", port + "/0000:02:00.0");
  fs.pci_device("0000:00:05.0", "pci0000:00/0000:00:05.0");  // on the root complex
  fs.pci_device("0000:00:06.0", "pci0000:00/0000:00:06.0");
  fs.pci_device("0000:00:07.0", "pci0000:00/0000:00:07.0");
  auto link = [&](const std::string& dir, const std::string& max_speed, const std::string& max_width,
                  const std::string& cur_speed, const std::string& cur_width) {
    if (!max_speed.empty()) fs.put("devices/" + dir + "/max_link_speed", max_speed);
    if (!max_width.empty()) fs.put("devices/" + dir + "/max_link_width", max_width);
    if (!cur_speed.empty()) fs.put("devices/" + dir + "/current_link_speed", cur_speed);
    if (!cur_width.empty()) fs.put("devices/" + dir + "/current_link_width", cur_width);
  };
  link(port, "32.0 GT/s PCIe", "16", "32.0 GT/s PCIe", "16");
  // An idle gen5 GPU: its capability, not its 2.5 GT/s idle state.
  link(port + "/0000:01:00.0", "32.0 GT/s PCIe", "16", "2.5 GT/s PCIe", "16");
  EXPECT_EQ(fs.attr("0000:01:00.0", "link_speed"), "32.0 GT/s PCIe");
  EXPECT_EQ(fs.attr("0000:01:00.0", "link_width"), "16");
  // A gen5 x16 device behind a slower port: the port bounds it.
  link(port + "/0000:02:00.0", "64.0 GT/s PCIe", "32", "64.0 GT/s PCIe", "32");
  EXPECT_EQ(fs.attr("0000:02:00.0", "link_speed"), "32.0 GT/s PCIe");
  EXPECT_EQ(fs.attr("0000:02:00.0", "link_width"), "16");
  // On the root complex (no upstream port files): the device's own.
  link("pci0000:00/0000:00:05.0", "16.0 GT/s PCIe", "8", "2.5 GT/s PCIe", "8");
  EXPECT_EQ(fs.attr("0000:00:05.0", "link_speed"), "16.0 GT/s PCIe");
  EXPECT_EQ(fs.attr("0000:00:05.0", "link_width"), "8");
  // No max_* files: current_* is all there is.
  link("pci0000:00/0000:00:06.0", "", "", "8.0 GT/s PCIe", "4");
  EXPECT_EQ(fs.attr("0000:00:06.0", "link_speed"), "8.0 GT/s PCIe");
  EXPECT_EQ(fs.attr("0000:00:06.0", "link_width"), "4");
  // Unknown speed, in either kernel's words: no link attributes (the default).
  link("pci0000:00/0000:00:07.0", "Unknown speed", "16", "Unknown speed", "16");
  EXPECT_EQ(fs.attr("0000:00:07.0", "link_speed"), "(none)");
  EXPECT_EQ(fs.attr("0000:00:07.0", "link_width"), "(none)");
  EXPECT_EQ(fs.attr("0000:09:00.0", "link_speed"), "(none)");  // no such device
}

// NCCL writes and reads <cpu affinity> in the kernel's cpumap form
// ("ffffffff,0000ffff"). Regression: hwloc discovery wrote hwloc's form
// ("0x00000003"), which NCCL does not read. The importer rewrites that form
// from older dumps and refuses what is neither.
TEST(TopologyImport, CpuAffinityIsCpumapForm) {
  std::vector<uint32_t> w;
  ASSERT_TRUE(parse_cpu_affinity("ffffffff,0000ffff", w));
  EXPECT_EQ(w, (std::vector<uint32_t>{0x0000ffff, 0xffffffff}));
  ASSERT_TRUE(parse_cpu_affinity("0xffffffff,0x0000ffff", w));
  EXPECT_EQ(w, (std::vector<uint32_t>{0x0000ffff, 0xffffffff}));
  ASSERT_TRUE(parse_cpu_affinity("0x00000003", w));
  EXPECT_EQ(cpumap_string(w), "3");
  EXPECT_EQ(cpumap_string({0, 0xffff}), "ffff,00000000");
  EXPECT_EQ(cpumap_string({}), "0");
  for (const char* bad : {"", "zz", "0x", "1,,2", "123456789", "3,"}) EXPECT_FALSE(parse_cpu_affinity(bad, w)) << bad;

  QuietTopo quiet;
  auto affinity_after_import = [](const std::string& value, size_t* nwarnings) {
    auto r = graph_from_xml_text("<system><cpu numaid=\"0\" affinity=\"" + value + "\"/></system>", "aff");
    EXPECT_TRUE(r.is_ok());
    *nwarnings = r.value().warnings.size();
    XmlElement el = graph_to_xml(r.value().graph).children.at(0);
    const std::string* v = el.attr("affinity");
    return v == nullptr ? std::string("(none)") : *v;
  };
  size_t nw = 0;
  EXPECT_EQ(affinity_after_import("0x00000003", &nw), "3");
  EXPECT_EQ(nw, 0u);
  EXPECT_EQ(affinity_after_import("0xffffffff,0x0000ffff", &nw), "ffffffff,0000ffff");
  EXPECT_EQ(affinity_after_import("00000000,ffffffff", &nw), "00000000,ffffffff");  // as written
  EXPECT_EQ(nw, 0u);
  EXPECT_EQ(affinity_after_import("0-3", &nw), "(none)");
  EXPECT_EQ(nw, 1u);
}

TEST(TopologyDiscover, CpuAffinityIsWrittenInCpumapForm) {
  // With the real sysfs and with none (hwloc's cpuset, converted), with and
  // without hwloc: never hwloc's 0x form, always a mask that parses.
  for (bool hwloc : {true, false}) {
    for (const std::string& root : {std::string("/sys"), ::testing::TempDir() + "/loom_no_sysfs_here"}) {
      DiscoverOptions o;
      o.use_hwloc = hwloc;
      o.sysfs_root = root;
      XmlElement x = discover_host_xml(o);
      for (const XmlElement& cpu : x.children) {
        const std::string* a = cpu.attr("affinity");
        if (a == nullptr) continue;
        std::vector<uint32_t> w;
        EXPECT_TRUE(parse_cpu_affinity(*a, w)) << *a;
        EXPECT_EQ(a->find('x'), std::string::npos) << "hwloc=" << hwloc << " root=" << root << ": " << *a;
      }
    }
  }
}

// Network interfaces as discovery writes them. Regressions (hwloc path):
// interfaces that were down became NICs; an Ethernet port of unknown speed
// (sysfs -1: virtio, veth) was bounded only by its PCI link, 126 Gb/s for
// virtio, where NCCL's socket transport assumes 10 Gb/s; IB ports that were
// not ACTIVE were used.
TEST(TopologyDiscover, NetInterfacesUpAndUnknownSpeedIs10G) {
  FakeSysfs fs("loom_fake_sysfs_nets");
  fs.put("class/net/eth0/operstate", "up");
  fs.put("class/net/eth0/speed", "-1");
  fs.put("class/net/eth1/operstate", "down");
  fs.put("class/net/eth1/speed", "100000");
  fs.put("class/net/eth2/operstate", "up");
  fs.put("class/net/eth2/speed", "25000");
  fs.put("class/net/eth3/speed", "25000");  // no operstate
  auto speed = [&](const std::string& name) {
    std::optional<XmlElement> net = ethernet_net_element(fs.root, name, 7);
    if (!net) return std::string("(left out)");
    EXPECT_EQ(*net->attr("dev"), "7");
    const std::string* v = net->attr("speed");
    return v == nullptr ? std::string("(none)") : *v;
  };
  EXPECT_EQ(speed("eth0"), "10000");
  EXPECT_EQ(speed("eth1"), "(left out)");
  EXPECT_EQ(speed("eth2"), "25000");
  EXPECT_EQ(speed("eth3"), "(left out)");

  fs.put("class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE");
  fs.put("class/infiniband/mlx5_0/ports/2/state", "1: DOWN");
  EXPECT_TRUE(ib_port_active(fs.root, "mlx5_0", 1));
  EXPECT_FALSE(ib_port_active(fs.root, "mlx5_0", 2));
  EXPECT_TRUE(ib_port_active(fs.root, "mlx5_0", 3));  // state unreadable: not known to be down

  // Without hwloc the interface of unknown speed is a 10 Gb/s NIC too.
  DiscoverOptions o;
  o.use_hwloc = false;
  o.sysfs_root = fs.root;
  auto r = discover_topology(o);
  ASSERT_TRUE(r.is_ok());
  const TopoGraph& g = r.value().graph;
  ASSERT_EQ(g.count(NodeType::kNic), 2);  // eth0 and eth2
  for (int n : g.nodes_of(NodeType::kNic)) {
    const TopoNode& nic = g.nodes[static_cast<size_t>(n)];
    EXPECT_DOUBLE_EQ(nic.net_bw, nic.name == "eth0" ? 10000.0 / 8000.0 : 25000.0 / 8000.0) << nic.name;
    EXPECT_TRUE(nic.speed_known) << nic.name;
  }
}

// Threads (or processes) dumping to one path at once: each dump replaces
// the file whole. Regression: fopen("w") + fwrite from every rank could
// leave one rank's bytes inside another's file.
TEST(TopologyImport, ConcurrentDumpsNeverMix) {
  auto a = load_topology_file(shared_topology("azure-ndv2.xml"));
  auto b = load_topology_file(shared_topology("azure-ndv4.xml"));
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  const std::string dir = ::testing::TempDir() + "/loom_concurrent_dumps";
  ASSERT_EQ(std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()), 0);
  const std::string path = dir + "/topo.xml";
  std::vector<std::thread> ts;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        if (!dump_topology_file((t % 2 ? a : b).value().graph, path).is_ok()) ++failures;
      }
    });
  }
  // Meanwhile every read sees one whole file.
  int reads = 0;
  for (int i = 0; i < 200; ++i) {
    if (!std::ifstream(path).good()) continue;
    auto back = load_topology_file(path);
    EXPECT_TRUE(back.is_ok()) << back.status().to_string();
    if (!back.is_ok()) break;  // (the writers are joined below)
    std::string d = back.value().graph.describe();
    EXPECT_TRUE(d == a.value().graph.describe() || d == b.value().graph.describe());
    ++reads;
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto last = load_topology_file(path);
  ASSERT_TRUE(last.is_ok()) << last.status().to_string();
  // No temporary file is left behind.
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"topo.xml"});
  (void)reads;
}

}  // namespace
}  // namespace loom::topo
