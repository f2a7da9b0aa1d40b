// Which interface get_unique_id's root listens on when LOOM_SOCKET_IFNAME is
// unset (pick_default_interface): NCCL's documented default order. It was
// loopback, so an id made on one host was unusable from the others.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include "bootstrap/socket.h"

namespace loom {
namespace {

InterfaceAddr iface(const std::string& name, const std::string& ip, bool up = true) {
  InterfaceAddr a;
  a.name = name;
  a.up = up;
  a.loopback = name == "lo";
  auto parsed = parse_sockaddr(ip.find(':') != std::string::npos ? "[" + ip + "]:7" : ip + ":7");
  EXPECT_TRUE(parsed.is_ok()) << ip;
  if (parsed.is_ok()) a.addr = *parsed;
  return a;
}

std::string pick(const std::vector<InterfaceAddr>& ifs) {
  SockAddr out;
  std::string name;
  if (!pick_default_interface(ifs, &out, &name)) return "none";
  EXPECT_EQ(out.port(), 0) << "the root binds port 0";
  return name + " " + out.to_string();
}

TEST(DefaultInterface, SkipsLoopbackAndDockerForTheFirstRealInterface) {
  EXPECT_EQ(pick({iface("lo", "127.0.0.1"), iface("docker0", "172.17.0.1"), iface("eth0", "10.0.0.5"),
                  iface("eth1", "10.1.0.5")}),
            "eth0 10.0.0.5:0");
}

TEST(DefaultInterface, PrefersInfiniBandInterfaces) {
  EXPECT_EQ(pick({iface("eth0", "10.0.0.5"), iface("ib0", "192.168.1.5")}), "ib0 192.168.1.5:0");
}

TEST(DefaultInterface, PrefersIpv4WithinAClassAndSkipsLinkLocalIpv6) {
  EXPECT_EQ(pick({iface("eth0", "fe80::1"), iface("eth0", "fd00::2"), iface("eth0", "192.0.2.2")}),
            "eth0 192.0.2.2:0");
  EXPECT_EQ(pick({iface("lo", "127.0.0.1"), iface("eth0", "fe80::1"), iface("eth0", "fd00::2")}),
            "eth0 [fd00::2]:0");
}

TEST(DefaultInterface, FallsBackToDockerThenLoopback) {
  EXPECT_EQ(pick({iface("lo", "127.0.0.1"), iface("docker0", "172.17.0.1")}), "docker0 172.17.0.1:0");
  EXPECT_EQ(pick({iface("lo", "127.0.0.1"), iface("eth0", "10.0.0.5", /*up=*/false)}), "lo 127.0.0.1:0");
  EXPECT_EQ(pick({iface("eth0", "fe80::1")}), "none");
  EXPECT_EQ(pick({}), "none");
}

TEST(DefaultInterface, NamedInterfaceStillWins) {
  ::setenv("LOOM_SOCKET_IFNAME", "lo", 1);
  auto a = default_listen_addr();
  ::unsetenv("LOOM_SOCKET_IFNAME");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_TRUE(a->is_loopback()) << a->to_string();
}

// NCCL_SOCKET_IFNAME's grammar (copied to LOOM_SOCKET_IFNAME by the shim):
// a comma list of name prefixes, '=' for exact names, '^' to exclude the
// list; the prefixes apply to the whole list, so "=a,=b" names "a" and
// "=b" (NCCL's user guide, environment variables).
TEST(DefaultInterface, IfnameGrammarAsNccl) {
  auto with = [](const char* spec) {
    ::setenv("LOOM_SOCKET_IFNAME", spec, 1);
    auto a = default_listen_addr();
    ::unsetenv("LOOM_SOCKET_IFNAME");
    return a;
  };
  for (const char* spec : {"l", "=lo", "nosuch,lo", "=nosuch,lo"}) {
    auto a = with(spec);
    ASSERT_TRUE(a.is_ok()) << spec << ": " << a.status().to_string();
    EXPECT_TRUE(a->is_loopback()) << spec << ": " << a->to_string();
  }
  for (const char* spec : {"=l", "nosuch", "=lo0", "=nosuch,=lo"}) EXPECT_FALSE(with(spec).is_ok()) << spec;
  // Excluding loopback never picks it.
  auto a = with("^lo");
  if (a.is_ok()) {
    EXPECT_FALSE(a->is_loopback()) << a->to_string();
  }
  auto b = with("^=lo");
  if (b.is_ok()) {
    EXPECT_FALSE(b->is_loopback()) << b->to_string();
  }
}

}  // namespace
}  // namespace loom
