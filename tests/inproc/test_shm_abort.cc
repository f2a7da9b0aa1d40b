// A failed op gives its buffers back to the user only once no peer copies
// out of or into them. The shared-memory transport's single-copy paths work
// in the peer's memory: the receiver reads the sender's buffer (4 MiB per
// read), and with a shared copy the sender writes half of the message into
// the receiver's buffer. Ranks here are threads, so a copy that outlives the
// op touches memory the test has unmapped: a crash, not a silent corruption.
//
// Regression: the op that failed (abort, deadline) returned at once while
// its peer went on copying chunk after chunk (it looks at the abort only
// when idle); the user freed the buffer, and the peer read or wrote it.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "core/config.h"
#include "transport/shm/shm_transport.h"

namespace loom {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kBytes = size_t{64} << 20;

struct Mapped {  // anonymous memory the test can unmap: a late copy then faults
  std::byte* p = nullptr;
  Mapped() {
    void* m = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) p = static_cast<std::byte*>(m);
  }
  void unmap() {
    if (p) munmap(p, kBytes);
    p = nullptr;
  }
  ~Mapped() { unmap(); }
};

// The hook holds one copying thread (the n-th entry of the chosen kind)
// until the test has failed the peer and unmapped its buffer.
std::atomic<bool> g_hook_writes{false};
std::atomic<int> g_hook_skip{0};
std::atomic<bool> g_held{false}, g_release{false};
void hold_one_copy(bool writes) {
  if (g_hook_writes.load() && !writes && !g_held.load()) {
    // Shared copy: the receiver's reads wait until the sender's write has
    // begun. Otherwise a sender kept off its core (ctest -j2 beside a busy
    // test) found the receiver done with every piece, never wrote, and the
    // test failed with "the copy to hold never started" (CI, once).
    const auto until = Clock::now() + std::chrono::seconds(20);
    while (!g_held.load() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return;
  }
  if (writes != g_hook_writes.load() || g_hook_skip.fetch_sub(1) != 0) return;
  g_held.store(true);
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (!g_release.load() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

bool wait_for(const std::atomic<bool>& flag) {
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (!flag.load() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return flag.load();
}

struct Pair {
  std::vector<std::unique_ptr<Comm>> comms;
  Pair(bool shared_copy) {
    setenv("LOOM_SHM_SHARED_COPY", shared_copy ? "1" : "0", 1);
    setenv("LOOM_SHM_SINGLE_COPY_PLAIN_BYTES", "64K", 1);
    Config cfg;
    cfg.timeout_s = 60;
    auto c = Comm::init_all(2, cfg);
    unsetenv("LOOM_SHM_SHARED_COPY");
    unsetenv("LOOM_SHM_SINGLE_COPY_PLAIN_BYTES");
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    if (c.is_ok()) comms = std::move(c).value();
  }
};

// `failing` (0: the sender, 1: the receiver) is aborted while the hook holds
// its peer just before the peer's copy of the given kind; the test unmaps
// the failing rank's buffer as soon as its op returned, then lets the peer go.
void fail_while_the_peer_copies(int failing, bool hook_writes, int skip) {
  if (hook_writes && params::host_cores() < 2)
    GTEST_SKIP() << "one CPU: 2 ranks share it, and senders never write into receivers then (shm_transport.cc)";
  Pair pair(/*shared_copy=*/hook_writes);
  ASSERT_EQ(pair.comms.size(), 2u);
  Mapped src, dst;
  ASSERT_TRUE(src.p && dst.p);
  std::memset(src.p, 0x5a, kBytes);
  std::memset(dst.p, 0, kBytes);
  g_hook_writes = hook_writes;
  g_hook_skip = skip;
  g_held = false;
  g_release = false;
  ShmTransport::set_peer_memory_hook_for_test(hold_one_copy);
  const uint64_t pushed_before = ShmTransport::shared_copy_bytes();
  auto w0 = pair.comms[0]->send(src.p, kBytes, DataType::kUint8, 1);
  auto w1 = pair.comms[1]->recv(dst.p, kBytes, DataType::kUint8, 0);
  ASSERT_TRUE(w0.is_ok() && w1.is_ok());
  ASSERT_TRUE(wait_for(g_held)) << "the copy to hold never started";
  pair.comms[failing]->abort("test: fails while its peer copies");
  Work& mine = failing == 0 ? *w0 : *w1;
  Work& peer = failing == 0 ? *w1 : *w0;
  EXPECT_FALSE(mine.wait().is_ok());
  (failing == 0 ? src : dst).unmap();  // the user frees the buffer of the failed op
  g_release = true;                    // the peer goes on: it must not touch that buffer
  const Status pst = peer.wait();
  EXPECT_FALSE(pst.is_ok()) << "the peer's op cannot complete without the failed rank";
  EXPECT_NE(pst.message().find("rank " + std::to_string(failing) + " failed"), std::string::npos) << pst.to_string();
  if (hook_writes) {
    EXPECT_EQ(ShmTransport::shared_copy_bytes(), pushed_before) << "the sender wrote the pushed half";
  }
  ShmTransport::set_peer_memory_hook_for_test(nullptr);
  for (auto& c : pair.comms) EXPECT_TRUE(c->destroy().is_ok());
}

// The receiver reads the sender's buffer in 4 MiB pieces; the sender fails
// after two of them. Old code: the receiver read the third from unmapped
// memory (SIGSEGV).
TEST(ShmAbort, AFailedSendersBufferIsNotReadAfterItsOpReturned) {
  fail_while_the_peer_copies(/*failing=*/0, /*hook_writes=*/false, /*skip=*/2);
}

// Shared copy: the receiver asks the sender to write the second half of the
// message into its buffer. The receiver fails before the sender starts.
// Old code: the sender wrote 32 MiB into unmapped memory (SIGSEGV).
TEST(ShmAbort, AFailedReceiversBufferIsNotWrittenAfterItsOpReturned) {
  fail_while_the_peer_copies(/*failing=*/1, /*hook_writes=*/true, /*skip=*/0);
}

// Without a hook: the sender fails at some moment while the receiver reads
// (most of the time inside a 4 MiB copy). Its op must return only after
// that copy: the buffer is unmapped at once, so a copy still running faults.
TEST(ShmAbort, AFailedSenderWaitsForTheReadInProgress) {
  for (int round = 0; round < 6; ++round) {
    Pair pair(/*shared_copy=*/false);
    ASSERT_EQ(pair.comms.size(), 2u);
    Mapped src;
    ASSERT_TRUE(src.p);
    std::memset(src.p, 0x33, kBytes);
    std::vector<std::byte> dst(kBytes);
    const uint64_t reads_before = ShmTransport::single_copy_messages();
    auto w0 = pair.comms[0]->send(src.p, kBytes, DataType::kUint8, 1);
    auto w1 = pair.comms[1]->recv(dst.data(), kBytes, DataType::kUint8, 0);
    ASSERT_TRUE(w0.is_ok() && w1.is_ok());
    // The receiver accepted the descriptor: it is reading now.
    const auto until = Clock::now() + std::chrono::seconds(20);
    while (ShmTransport::single_copy_messages() == reads_before && Clock::now() < until) std::this_thread::yield();
    ASSERT_GT(ShmTransport::single_copy_messages(), reads_before);
    std::this_thread::sleep_for(std::chrono::microseconds(200 * round));
    pair.comms[0]->abort("test: fails while its peer reads");
    (void)w0->wait();  // failed, or done if the receiver had read everything
    src.unmap();
    // The receiver either got every byte (it finished first) or failed
    // naming the sender; never a crash.
    const Status pst = w1->wait();
    if (pst.is_ok()) {
      EXPECT_EQ(dst[kBytes - 1], std::byte{0x33});
    } else {
      EXPECT_NE(pst.message().find("rank 0 failed"), std::string::npos) << pst.to_string();
    }
    for (auto& c : pair.comms) (void)c->destroy();
  }
}

}  // namespace
}  // namespace loom
