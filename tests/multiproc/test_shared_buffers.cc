// loom::mem_alloc buffers (include/loom/memory.h): the registry, and ranks as
// processes reading each other's buffers through mappings instead of
// process_vm_readv, with the same results, also when a buffer is freed and
// its address handed out again.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "common/test_util.h"
#include "core/config.h"
#include "core/shared_buffers.h"
#include "loom/memory.h"
#include "transport/shm/shm_transport.h"

namespace loom {
namespace {

TEST(SharedBuffers, RegistryFindsWhatLiesInsideABuffer) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  Result<void*> a = mem_alloc(3 * page + 1);
  Result<void*> b = mem_alloc(10);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  auto* pa = static_cast<std::byte*>(*a);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pa) % page, 0u);
  for (size_t i = 0; i < 3 * page + 1; ++i) ASSERT_EQ(pa[i], std::byte{0}) << i;  // zero-filled

  auto whole = shared_buffers::find(pa, 3 * page + 1);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->offset, 0u);
  EXPECT_EQ(whole->file_bytes, 4 * page);  // rounded up to pages
  EXPECT_GE(whole->fd, 0);
  auto inner = shared_buffers::find(pa + 100, 50);
  ASSERT_TRUE(inner.has_value());
  EXPECT_EQ(inner->offset, 100u);
  EXPECT_EQ(inner->id, whole->id);
  auto other = shared_buffers::find(*b, 10);
  ASSERT_TRUE(other.has_value());
  EXPECT_NE(other->id, whole->id);
  // A range that runs past the buffer's end, or memory that is not ours.
  EXPECT_FALSE(shared_buffers::find(pa + 4 * page - 8, 16).has_value());
  int local = 0;
  EXPECT_FALSE(shared_buffers::find(&local, sizeof local).has_value());

  const uint64_t releases = shared_buffers::releases();
  EXPECT_TRUE(mem_free(pa).is_ok());
  EXPECT_EQ(shared_buffers::releases(), releases + 1);
  EXPECT_FALSE(shared_buffers::find(pa + 100, 50).has_value());
  EXPECT_EQ(mem_free(pa).code(), StatusCode::kInvalidArgument);  // twice
  void* heap = std::malloc(64);
  EXPECT_EQ(mem_free(heap).code(), StatusCode::kInvalidArgument);
  std::free(heap);
  EXPECT_TRUE(mem_free(nullptr).is_ok());
  EXPECT_EQ(mem_alloc(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(mem_free(*b).is_ok());
}

// MemAllocator: containers of at least kMemAllocMinBytes live in mem_alloc
// memory, smaller ones on the heap; growing one moves it to a new buffer and
// frees the old one.
TEST(SharedBuffers, MemAllocatorPutsLargeContainersInSharedMemory) {
  using Vec = std::vector<float, MemAllocator<float>>;
  const size_t big_count = kMemAllocMinBytes / sizeof(float);
  Vec big(big_count, 1.0f), small(big_count - 1, 2.0f);
  EXPECT_TRUE(shared_buffers::find(big.data(), big.size() * sizeof(float)).has_value());
  EXPECT_FALSE(shared_buffers::find(small.data(), sizeof(float)).has_value());
  const size_t live = shared_buffers::live();
  const uint64_t releases = shared_buffers::releases();
  big.resize(2 * big_count, 3.0f);
  EXPECT_TRUE(shared_buffers::find(big.data(), big.size() * sizeof(float)).has_value());
  EXPECT_EQ(shared_buffers::live(), live);  // one buffer for another
  EXPECT_EQ(shared_buffers::releases(), releases + 1);
  EXPECT_EQ(big[0], 1.0f);
  EXPECT_EQ(big[2 * big_count - 1], 3.0f);
  big.clear();
  big.shrink_to_fit();
  EXPECT_EQ(shared_buffers::live(), live - 1);
}

// Runs body(rank, comm, err) on n ranks as processes; body returns false
// after writing what went wrong to err.
// `single_copy`: LOOM_SHM_SINGLE_COPY_BYTES (and, when "0", the plain
// threshold too: single copy then only by mapping, Segment::map_min_bytes);
// nullptr: both unset, the defaults.
void run_ranks(int n, const std::function<bool(int, Comm&, std::string*)>& body, const char* map_shared = "1",
               const char* single_copy = "64K", const char* plain = nullptr) {
  auto id = testing::unique_id();
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  auto results = testing::run_processes(n, [&](int r, int fd) {
    // Every message from 64 KiB single copy, reduced ones too (3 ranks on 2
    // cores would otherwise not read reduced messages single copy).
    unsetenv("LOOM_SHM_SINGLE_COPY_PLAIN_BYTES");
    if (single_copy == nullptr) unsetenv("LOOM_SHM_SINGLE_COPY_BYTES");
    else setenv("LOOM_SHM_SINGLE_COPY_BYTES", single_copy, 1);
    if (single_copy && std::strcmp(single_copy, "0") == 0) setenv("LOOM_SHM_SINGLE_COPY_PLAIN_BYTES", "0", 1);
    if (plain) setenv("LOOM_SHM_SINGLE_COPY_PLAIN_BYTES", plain, 1);
    // "a,b,...": rank r's own value, the r-th (a launcher's per-rank environment).
    std::string map = map_shared;
    for (int k = 0; k < r && map.find(',') != std::string::npos; ++k) map.erase(0, map.find(',') + 1);
    setenv("LOOM_SHM_MAP_SHARED", map.substr(0, map.find(',')).c_str(), 1);
    auto comm = Comm::init_rank(*id, n, r);
    std::string err;
    if (!comm.is_ok()) err = comm.status().to_string();
    else if (!body(r, **comm, &err)) (*comm)->abort("test failure");
    else if (Status st = (*comm)->destroy(); !st.is_ok()) err = st.to_string();
    if (!err.empty()) (void)!write(fd, err.data(), err.size());
    return err.empty() ? 0 : 1;
  });
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(WIFEXITED(results[r].status) && WEXITSTATUS(results[r].status) == 0)
        << "rank " << r << ": " << results[r].output;
  EXPECT_TRUE(testing::loom_shm_segments().empty());
}

// (ranks, thresholds): "64K" = process_vm_readv single copy from 64 KiB as
// well; "0" = no process_vm_readv single copy: messages from 256 KiB carry a
// header and go mapped when their buffer is mem_alloc memory (the case of
// reduced messages between oversubscribed ranks), else through the FIFO
// (algorithm scratch); both kinds occur in one run.
class SharedMatrix : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

// Every collective, in and out of place, single-copy sizes and not, with
// both buffers from mem_alloc: the results are checked in closed form, and
// every rank read messages through mappings.
TEST_P(SharedMatrix, EveryCollectiveReadsPeersThroughMappings) {
  const int n = std::get<0>(GetParam());
  run_ranks(n, [n](int r, Comm& comm, std::string* err) {
    const uint64_t mapped0 = ShmTransport::mapped_messages();
    for (const testing::Case& cs :
         testing::mixed_cases(n, {3, 70001, size_t{1} << 18, (size_t{1} << 18) + 5},
                              {Collective::kAllReduce, Collective::kAllGather, Collective::kBroadcast, Collective::kReduce,
                               Collective::kReduceScatter, Collective::kAllToAll, Collective::kSendRecv},
                              true)) {
      if (Status st = testing::run_case(comm, cs); !st.is_ok()) {
        *err = st.to_string();
        return false;
      }
    }
    if (ShmTransport::mapped_messages() == mapped0) {
      *err = "rank " + std::to_string(r) + " read no message through a mapping";
      return false;
    }
    return true;
  }, "1", std::get<1>(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Ranks, SharedMatrix,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values("64K", "0")),
                         [](const auto& info) {
                           return "n" + std::to_string(std::get<0>(info.param)) +
                                  (std::strcmp(std::get<1>(info.param), "0") == 0 ? "_mapped_only" : "_readv_too");
                         });

// A reduced message that the thresholds leave to the FIFO (here: reduced
// single copy off, as between oversubscribed ranks) goes mapped when it lies
// in mem_alloc memory: rank 1 reduces straight from rank 0's buffer. From a
// heap buffer the same message comes through the FIFO behind its header.
void reduced_message(bool shared) {
  run_ranks(2, [shared](int r, Comm& comm, std::string* err) {
    testing::Case cs;
    cs.coll = Collective::kReduce;  // rank 1 sends its whole buffer to rank 0, which reduces it
    cs.count = (size_t{1} << 18) + 7;
    cs.root = 0;
    cs.shared_buffers = shared;
    const uint64_t single0 = ShmTransport::single_copy_messages(), mapped0 = ShmTransport::mapped_messages();
    if (Status st = testing::run_case(comm, cs); !st.is_ok()) return *err = st.to_string(), false;
    if (r != 0) return true;
    const uint64_t single = ShmTransport::single_copy_messages() - single0;
    const uint64_t mapped = ShmTransport::mapped_messages() - mapped0;
    if (shared ? (mapped == 0 || mapped != single) : (single != 0))
      return *err = "single-copy messages " + std::to_string(single) + ", mapped " + std::to_string(mapped), false;
    return true;
  }, "1", "0");
}

TEST(SharedBuffers, AReducedMessageLeftToTheFifoGoesMappedFromAMemAllocBuffer) { reduced_message(true); }

// Loom's own scratch (the ring's partial sums) is mem_alloc memory once it is
// large enough to be sent single copy: with ordinary user buffers a 3-rank
// ring reduce_scatter still sends its partial sums mapped.
TEST(SharedBuffers, ScratchPartialSumsAreSentMapped) {
  setenv("LOOM_ALGO", "reduce_scatter:ring", 1);
  run_ranks(3, [](int r, Comm& comm, std::string* err) {
    testing::Case cs;
    cs.coll = Collective::kReduceScatter;
    cs.count = size_t{1} << 17;  // 512 KiB of floats per block
    const uint64_t mapped0 = ShmTransport::mapped_messages();
    if (Status st = testing::run_case(comm, cs); !st.is_ok()) return *err = st.to_string(), false;
    if (ShmTransport::mapped_messages() == mapped0)
      return *err = "rank " + std::to_string(r) + " read no partial sum through a mapping", false;
    return true;
  }, "1", "0");
  unsetenv("LOOM_ALGO");
}
TEST(SharedBuffers, FromTheHeapItComesThroughTheFifoBehindItsHeader) { reduced_message(false); }

// With more ranks than cores the binomial reduce sends its partial sums
// through the FIFO (Step::unmapped): a mapped send would end only once its
// parent had read it (4 ranks on 2 cores, 256 KiB: 64.5 us mapped, 27.7
// through the FIFO). With a core per rank they still go mapped. 4 ranks,
// far-first: 2 -> 0, 3 -> 1, then 1 -> 0 with 1's partial sum from scratch,
// whole (LOOM_CHUNK_BYTES) and past the mapping threshold.
TEST(SharedBuffers, OversubscribedBinomialReduceKeepsPartialSumsInTheFifo) {
  setenv("LOOM_ALGO", "reduce:binomial", 1);
  setenv("LOOM_CHUNK_BYTES", "4M", 1);
  const int n = 4;
  const bool over = params::oversubscribed(n);
  run_ranks(n, [over](int r, Comm& comm, std::string* err) {
    testing::Case cs;
    cs.coll = Collective::kReduce;
    cs.count = size_t{1} << 17;  // 512 KiB of floats
    cs.root = 0;
    const uint64_t mapped0 = ShmTransport::mapped_messages();
    if (Status st = testing::run_case(comm, cs); !st.is_ok()) return *err = st.to_string(), false;
    if (r != 0) return true;
    const uint64_t mapped = ShmTransport::mapped_messages() - mapped0;
    if (over ? mapped != 0 : mapped == 0)
      return *err = std::string(over ? "oversubscribed" : "a core per rank") + ": rank 0 read " +
                    std::to_string(mapped) + " messages mapped",
             false;
    return true;
  }, "1", "0");
  unsetenv("LOOM_CHUNK_BYTES");
  unsetenv("LOOM_ALGO");
}

// Rank 0 sends `count` floats from src to rank 1's dst, as one message.
Status one_send(Comm& comm, int r, const float* src, float* dst, size_t count) {
  comm.group_start();
  if (r == 0) (void)comm.send(src, count, DataType::kFloat32, 1);
  else (void)comm.recv(dst, count, DataType::kFloat32, 0);
  Result<Work> w = comm.group_end();
  return w.is_ok() ? w->wait() : w.status();
}

// On the receiver: element i of got is i % mod, and since the counters read
// single0 / mapped0 one single-copy message arrived, `mapped` of them mapped.
bool check_one(const std::vector<float>& got, size_t mod, uint64_t single0, uint64_t mapped0, uint64_t mapped,
               std::string* err) {
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != static_cast<float>(i % mod))
      return *err = "element " + std::to_string(i) + " = " + std::to_string(got[i]), false;
  const uint64_t single = ShmTransport::single_copy_messages() - single0;
  const uint64_t m = ShmTransport::mapped_messages() - mapped0;
  if (single != 1 || m != mapped)
    return *err = "single-copy messages " + std::to_string(single) + ", mapped " + std::to_string(m), false;
  return true;
}

// One 1 MiB message from a mem_alloc buffer into a heap buffer: read through
// a mapping, as one single-copy message; with LOOM_SHM_MAP_SHARED=0 by
// process_vm_readv, and the same bytes arrive.
void one_message(const char* map_shared, bool expect_mapped) {
  run_ranks(2, [expect_mapped](int r, Comm& comm, std::string* err) {
    constexpr size_t kCount = 1 << 18;  // floats
    std::vector<float> heap(kCount, 0.0f);
    float* src = nullptr;
    if (r == 0) {
      Result<void*> p = mem_alloc(kCount * sizeof(float));
      if (!p.is_ok()) return *err = p.status().to_string(), false;
      src = static_cast<float*>(*p);
      for (size_t i = 0; i < kCount; ++i) src[i] = static_cast<float>(i % 1000);
    }
    const uint64_t single0 = ShmTransport::single_copy_messages(), mapped0 = ShmTransport::mapped_messages();
    Status st = one_send(comm, r, src, heap.data(), kCount);
    if (r == 0) (void)mem_free(src);
    if (!st.is_ok()) return *err = st.to_string(), false;
    return r == 0 || check_one(heap, 1000, single0, mapped0, expect_mapped ? 1 : 0, err);
  }, map_shared);
}

TEST(SharedBuffers, AMessageFromAMemAllocBufferIsReadThroughAMapping) { one_message("1", true); }

// The descriptor names the buffer's file by its number in the sender. If
// that number no longer refers to the buffer's file (here: another buffer's
// file of the same size, put in its place with dup2), the receiver must
// notice (inode check) and read the message by process_vm_readv, getting the
// right bytes and not the other buffer's.
TEST(SharedBuffers, AFileNumberThatNoLongerNamesTheBufferIsNotMapped) {
  run_ranks(2, [](int r, Comm& comm, std::string* err) {
    constexpr size_t kCount = 1 << 18;  // floats
    std::vector<float> heap(kCount, 0.0f);
    float* src = nullptr;
    float* decoy = nullptr;
    if (r == 0) {
      Result<void*> p = mem_alloc(kCount * sizeof(float));
      Result<void*> q = mem_alloc(kCount * sizeof(float));
      if (!p.is_ok() || !q.is_ok()) return *err = "mem_alloc failed", false;
      src = static_cast<float*>(*p);
      decoy = static_cast<float*>(*q);
      for (size_t i = 0; i < kCount; ++i) src[i] = static_cast<float>(i % 777);
      for (size_t i = 0; i < kCount; ++i) decoy[i] = -1.0f;
      auto ref = shared_buffers::find(src, kCount * sizeof(float));
      auto other = shared_buffers::find(decoy, kCount * sizeof(float));
      if (!ref || !other || dup2(other->fd, ref->fd) < 0) return *err = "could not replace the buffer's file", false;
    }
    const uint64_t single0 = ShmTransport::single_copy_messages(), mapped0 = ShmTransport::mapped_messages();
    Status st = one_send(comm, r, src, heap.data(), kCount);
    if (r == 0) {
      (void)mem_free(src);  // closes the decoy's second descriptor; src's mapping did not need its own
      (void)mem_free(decoy);
    }
    if (!st.is_ok()) return *err = st.to_string(), false;
    return r == 0 || check_one(heap, 777, single0, mapped0, 0, err);
  });
}
TEST(SharedBuffers, MappingOffReadsItByReadv) { one_message("0", false); }

// The sender frees its buffer after each message and allocates a new one,
// which mmap tends to place at the same address, with new contents: the
// receiver must read the new buffer, not its mapping of the old one. A
// second buffer stays alive throughout and is sent from in between.
TEST(SharedBuffers, AFreedBufferIsNeverReadThroughAStaleMapping) {
  run_ranks(2, [](int r, Comm& comm, std::string* err) {
    constexpr size_t kCount = 1 << 17;  // 512 KiB of floats
    const size_t bytes = kCount * sizeof(float);
    Result<void*> keep = mem_alloc(bytes);
    Result<void*> dst = mem_alloc(bytes);
    if (!keep.is_ok() || !dst.is_ok()) return *err = "mem_alloc failed", false;
    auto* kept = static_cast<float*>(*keep);
    auto* out = static_cast<float*>(*dst);
    std::vector<void*> addrs;
    bool ok = true;
    for (int round = 0; round < 6 && ok; ++round) {
      const bool from_kept = round % 3 == 2;
      float* src = kept;
      if (r == 0 && !from_kept) {
        Result<void*> p = mem_alloc(bytes);
        if (!p.is_ok()) return *err = p.status().to_string(), false;
        src = static_cast<float*>(*p);
        addrs.push_back(src);
      }
      if (r == 0)
        for (size_t i = 0; i < kCount; ++i) src[i] = static_cast<float>(round * 10000 + static_cast<int>(i % 5000));
      Status st = one_send(comm, r, src, out, kCount);
      if (r == 0 && !from_kept) (void)mem_free(src);
      if (!st.is_ok()) return *err = st.to_string(), false;
      if (r == 1)
        for (size_t i = 0; i < kCount && ok; ++i)
          if (out[i] != static_cast<float>(round * 10000 + static_cast<int>(i % 5000))) {
            *err = "round " + std::to_string(round) + ": element " + std::to_string(i) + " = " + std::to_string(out[i]);
            ok = false;
          }
    }
    (void)mem_free(kept);
    (void)mem_free(out);
    if (ok && r == 0) {
      // The point of the test is an address handed out again; say so if the
      // kernel never did (the results were still checked).
      bool reused = false;
      for (size_t i = 1; i < addrs.size(); ++i) reused = reused || addrs[i] == addrs[i - 1];
      if (!reused) fprintf(stderr, "note: mmap never reused a freed buffer's address in this run\n");
    }
    return ok;
  });
}

// A receiver keeps its mappings of a sender's buffers across communicators,
// keyed by the sender's pid and buffer id. Buffer ids start at a random
// value per process, but processes forked from one that had used mem_alloc
// inherit its next id; if one of them then gets a dead one's pid (pids
// wrap, at 32768 by default), its first buffer has the dead one's (pid, id).
// The receiver must read the new sender's buffer, not its mapping of the
// dead one's. Regression: the cache matched (pid, id) only and handed back
// the old mapping; the receiver got the dead sender's bytes, silently
// ("sender 2: element 777 = 777"). The second sender gets the first one's
// pid through ns_last_pid (root).
TEST(SharedBuffers, ASenderWithAReusedPidIsNotReadThroughTheDeadOnesMapping) {
  if (access("/proc/sys/kernel/ns_last_pid", W_OK) != 0) GTEST_SKIP() << "cannot choose the next pid (needs root)";
  constexpr size_t kCount = 1 << 18;  // 1 MiB of floats: read through a mapping
  {  // the senders fork from a process that has used mem_alloc: they share its next buffer id
    Result<void*> p = mem_alloc(16);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    ASSERT_TRUE(mem_free(*p).is_ok());
  }
  setenv("LOOM_TIMEOUT", "30", 1);
  auto id1 = testing::unique_id();
  ASSERT_TRUE(id1.is_ok()) << id1.status().to_string();
  int to_r[2], from_r[2];
  ASSERT_EQ(pipe(to_r), 0);
  ASSERT_EQ(pipe(from_r), 0);
  // Rank 0 of a 2-rank communicator: one message of i % mod from a new
  // mem_alloc buffer (the process's next buffer id).
  auto sender = [&](const UniqueId& id, size_t mod) {
    auto comm = Comm::init_rank(id, 2, 0);
    if (!comm.is_ok()) _exit(2);
    Result<void*> p = mem_alloc(kCount * sizeof(float));
    if (!p.is_ok()) _exit(3);
    auto* src = static_cast<float*>(*p);
    for (size_t i = 0; i < kCount; ++i) src[i] = static_cast<float>(i % mod);
    const bool ok = one_send(**comm, 0, src, nullptr, kCount).is_ok() && (*comm)->destroy().is_ok();
    _exit(ok ? 0 : 4);
  };
  // The receiver, rank 1 of both communicators, one process throughout.
  const pid_t r = fork();
  ASSERT_GE(r, 0);
  if (r == 0) {
    close(to_r[1]);
    close(from_r[0]);
    auto fail = [&](const std::string& m) {
      (void)!write(from_r[1], m.data(), m.size());
      _exit(1);
    };
    for (int round = 0; round < 2; ++round) {
      UniqueId id = *id1;
      if (round == 1 && read(to_r[0], id.bytes, sizeof(id.bytes)) != static_cast<ssize_t>(sizeof(id.bytes)))
        fail("no second unique id");
      auto comm = Comm::init_rank(id, 2, 1);
      if (!comm.is_ok()) fail(comm.status().to_string());
      std::vector<float> heap(kCount, 0.0f);
      const uint64_t single0 = ShmTransport::single_copy_messages(), mapped0 = ShmTransport::mapped_messages();
      if (Status st = one_send(**comm, 1, nullptr, heap.data(), kCount); !st.is_ok()) fail(st.to_string());
      std::string err;
      if (!check_one(heap, round == 0 ? 1000 : 777, single0, mapped0, 1, &err))
        fail("sender " + std::to_string(round + 1) + ": " + err);
      if (Status st = (*comm)->destroy(); !st.is_ok()) fail(st.to_string());
    }
    _exit(0);
  }
  close(to_r[0]);
  close(from_r[1]);
  struct Reap {  // the receiver, on every way out
    pid_t pid;
    ~Reap() {
      if (pid > 0 && waitpid(pid, nullptr, WNOHANG) == 0) kill(pid, SIGKILL), waitpid(pid, nullptr, 0);
    }
  } reap{r};
  const pid_t b = fork();
  ASSERT_GE(b, 0);
  if (b == 0) sender(*id1, 1000);
  int status = 0;
  ASSERT_EQ(waitpid(b, &status, 0), b);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "first sender: status " << status;
  auto id2 = testing::unique_id();  // after the first communicator's rendezvous (it ends the first's root)
  ASSERT_TRUE(id2.is_ok()) << id2.status().to_string();
  ASSERT_EQ(write(to_r[1], id2->bytes, sizeof(id2->bytes)), static_cast<ssize_t>(sizeof(id2->bytes)));
  if (FILE* f = std::fopen("/proc/sys/kernel/ns_last_pid", "w")) {  // the next fork gets b's pid
    std::fprintf(f, "%d", b - 1);
    std::fclose(f);
  }
  const pid_t c = fork();
  ASSERT_GE(c, 0);
  if (c == 0) sender(*id2, 777);
  ASSERT_EQ(waitpid(c, &status, 0), c);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "second sender: status " << status;
  ASSERT_EQ(waitpid(r, &status, 0), r);
  reap.pid = 0;
  std::string out(4096, '\0');
  const ssize_t n = read(from_r[0], out.data(), out.size());
  out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  close(to_r[1]);
  close(from_r[0]);
  unsetenv("LOOM_TIMEOUT");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "receiver: " << out;
  EXPECT_TRUE(testing::loom_shm_segments().empty());
  if (c != b) GTEST_SKIP() << "the second sender got pid " << c << ", not " << b << " (another fork came between)";
}

// The message class of a reducing collective is the op's: with
// LOOM_SHM_SINGLE_COPY_PLAIN_BYTES=256K (stored messages between processes
// single copy from 256K, reduced ones never) a 2-rank ring allreduce of
// 4 MiB reads nothing single copy, its all-gather half (2 MiB stored
// messages) included, while an all_gather of the same size does. Regression:
// the all-gather half of the allreduce went by process_vm_readv while its
// reduced half went through the FIFO, 1.3x slower than both through the FIFO.
// With LOOM_SHM_SINGLE_COPY_BYTES set, the allreduce goes single copy again.
// plain: LOOM_SHM_SINGLE_COPY_PLAIN_BYTES, nullptr for the default.
void count_single_copies(Collective coll, const char* single_copy, bool expect_any, int nranks = 2,
                         const char* plain = "256K", const char* algo = nullptr) {
  if (algo) setenv("LOOM_ALGO", algo, 1);
  else if (coll == Collective::kBroadcast) unsetenv("LOOM_ALGO");  // whichever the tuner picks
  else setenv("LOOM_ALGO", coll == Collective::kAllReduce ? "allreduce:ring" : "all_gather:ring", 1);
  run_ranks(nranks, [coll, expect_any](int r, Comm& comm, std::string* err) {
    testing::Case cs;
    cs.coll = coll;
    cs.count = coll == Collective::kAllGather ? size_t{1} << 19 : size_t{1} << 20;  // 4 MiB of floats in all
    const uint64_t single0 = ShmTransport::single_copy_messages();
    if (Status st = testing::run_case(comm, cs); !st.is_ok()) return *err = st.to_string(), false;
    const uint64_t single = ShmTransport::single_copy_messages() - single0;
    if (coll == Collective::kBroadcast && r == cs.root) return true;  // the root receives nothing
    if ((single > 0) != expect_any)
      return *err = std::to_string(single) + " single-copy messages in " +
                    collective_name(coll) + (expect_any ? " (expected some)" : " (expected none)"),
             false;
    return true;
  }, "0", single_copy, plain);
  unsetenv("LOOM_ALGO");
}
TEST(SingleCopyClass, AReducingCollectiveMovesEveryMessageThroughTheFifo) {
  count_single_copies(Collective::kAllReduce, nullptr, false);
}
// Broadcast of 3 ranks through a chain or tree too: its inner ranks forward
// what they have just received. Of 2 ranks nothing is forwarded: the root's
// buffer is stored.
TEST(SingleCopyClass, ABroadcastOfThreeMovesEveryMessageThroughTheFifo) {
  count_single_copies(Collective::kBroadcast, nullptr, false, 3, "256K", "broadcast:chain");
}
// The direct (star) broadcast forwards nothing at any rank count: its
// receivers read the root's buffer as stored messages (plain threshold).
// Were the class decided by the collective alone, a 3-rank direct broadcast
// would go through the FIFO, the root copying every message itself.
TEST(SingleCopyClass, ADirectBroadcastIsStored) {
  count_single_copies(Collective::kBroadcast, nullptr, true, 3, "256K", "broadcast:direct");
}
TEST(SingleCopyClass, ABroadcastOfTwoIsStored) { count_single_copies(Collective::kBroadcast, nullptr, true); }
TEST(SingleCopyClass, AnAllGatherIsStored) { count_single_copies(Collective::kAllGather, nullptr, true); }
TEST(SingleCopyClass, TheThresholdSetGivesTheAllReduceSingleCopy) {
  count_single_copies(Collective::kAllReduce, "256K", true);
}

// By default, between processes with a CPU per rank, stored messages go
// through the FIFO too (its steps let both cores copy at once: all_gather,
// all_to_all, send/recv and the 2-rank broadcast measured 1.05-2x faster
// than by process_vm_readv, config.cc), and oversubscribed too since run 18
// (all_gather and all_to_all at 4 and 8 ranks on 2 cores 1.1-1.5x faster
// through the FIFO; single copy from 256K before, measured when the FIFO
// pages still faulted in on first touch).
TEST(SingleCopyClass, StoredMessagesGoThroughTheFifoWithACpuPerRank) {
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  count_single_copies(Collective::kAllGather, nullptr, cpus < 2, 2, nullptr);
  count_single_copies(Collective::kBroadcast, nullptr, cpus < 2, 2, nullptr);
}
TEST(SingleCopyClass, OversubscribedStoredMessagesGoThroughTheFifo) {
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  if (cpus > 3) GTEST_SKIP() << cpus << " CPUs: " << cpus + 1 << " processes would be too many for this test";
  count_single_copies(Collective::kAllGather, nullptr, false, cpus + 1, nullptr);
}

// With more ranks than cores the direct all_gather stages a rank's block
// once in its scratch (Loom's mem_alloc memory) and every peer reads it from
// there through a mapping: each rank reads n-1 blocks mapped, from heap user
// buffers, where the FIFO would cost its sender a copy per peer. The direct
// broadcast's root stages its buffer alike: each other rank reads it mapped
// once (root 1, to see that the root is not assumed to be rank 0). Below
// LOOM_SHM_ANNOUNCED_MIN_BYTES, or with mapping off at the receivers, the
// same schedule goes through the FIFOs, and the results are right either way
// (run_case checks every element).
void staged_direct(Collective coll, const char* map_shared, const char* announced_min, bool expect_mapped,
                   bool shared_buffers = false, const char* llc = "256K") {
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  if (cpus > 3) GTEST_SKIP() << cpus << " CPUs: " << cpus + 1 << " processes would be too many for this test";
  const int n = cpus + 1;
  setenv("LOOM_ALGO", coll == Collective::kAllGather ? "all_gather:direct" : "broadcast:direct", 1);
  setenv("LOOM_SHM_ANNOUNCED_MIN_BYTES", announced_min, 1);
  // The broadcast stages only once the op's data outgrows the cache.
  setenv("LOOM_LLC_BYTES", llc, 1);
  run_ranks(n, [n, coll, expect_mapped, shared_buffers](int r, Comm& comm, std::string* err) {
    testing::Case cs;
    cs.coll = coll;
    cs.root = 1;
    cs.shared_buffers = shared_buffers;
    // 128 KiB of floats per block, the default threshold, on a fresh
    // communicator: its scratch must still be mem_alloc memory (from 256 KiB,
    // core/memory.cc). Regression: a 128 KiB scratch was private memory and
    // the staged blocks went through the FIFOs after all.
    cs.count = size_t{1} << 15;
    const int reads = coll == Collective::kAllGather ? n - 1 : r == cs.root ? 0 : 1;
    // The broadcast also at 1 MiB, where an idle sender could share the
    // copy (LOOM_SHM_SHARED_COPY): an in-place root only sends. With more
    // ranks than cores it must not: the root wrote half of every receiver's
    // copy by process_vm_writev, one after the other, 2x slower than the
    // receivers reading alone (shm_connection.cc). Regression: it did, staged
    // or from mem_alloc buffers (shared_buffers, not staged).
    std::vector<size_t> counts{cs.count};
    if (coll == Collective::kBroadcast && expect_mapped) counts.push_back(size_t{1} << 18);
    if (shared_buffers) counts = {size_t{1} << 18};
    for (size_t count : counts) {
      cs.count = count;
      for (bool in_place : {false, true}) {
        cs.in_place = in_place;
        const uint64_t mapped0 = ShmTransport::mapped_messages(), pushed0 = ShmTransport::shared_copy_bytes();
        if (Status st = testing::run_case(comm, cs); !st.is_ok()) return *err = st.to_string(), false;
        const uint64_t mapped = ShmTransport::mapped_messages() - mapped0;
        const uint64_t pushed = ShmTransport::shared_copy_bytes() - pushed0;
        const uint64_t want = expect_mapped ? static_cast<uint64_t>(reads) : 0;
        const std::string at = "rank " + std::to_string(r) + ", " + std::to_string(count * 4) + " B" +
                               (in_place ? " in place" : "") + ": ";
        if (mapped != want)
          return *err = at + std::to_string(mapped) + " messages read through a mapping, expected " +
                        std::to_string(want),
                 false;
        if (expect_mapped && pushed != 0)
          return *err = at + std::to_string(pushed) + " B written into the receivers by the sender", false;
      }
    }
    return true;
  }, map_shared, nullptr);
  unsetenv("LOOM_ALGO");
  unsetenv("LOOM_SHM_ANNOUNCED_MIN_BYTES");
  unsetenv("LOOM_LLC_BYTES");
}
TEST(SharedBuffers, OversubscribedDirectAllGatherReadsStagedBlocksMapped) {
  staged_direct(Collective::kAllGather, "1", "128K", true);
}
TEST(SharedBuffers, BelowTheAnnouncedSizeTheStagedBlocksGoThroughTheFifo) {
  staged_direct(Collective::kAllGather, "1", "512K", false);
}
TEST(SharedBuffers, MappingOffTheStagedBlocksGoThroughTheFifo) {
  staged_direct(Collective::kAllGather, "0", "128K", false);
}
TEST(SharedBuffers, OversubscribedDirectBroadcastReadsTheStagedRootBufferMapped) {
  staged_direct(Collective::kBroadcast, "1", "128K", true);
}
TEST(SharedBuffers, BelowTheAnnouncedSizeTheStagedRootBufferGoesThroughTheFifo) {
  staged_direct(Collective::kBroadcast, "1", "512K", false);
}
// Within the cache (3-4 ranks x 1 MiB against 64 MiB) the root's buffer goes
// through the FIFOs: the pipelined FIFO algorithms beat staging there, and
// the direct broadcast's FIFO path is what the cost model prices.
TEST(SharedBuffers, WithinTheCacheTheRootBufferGoesThroughTheFifo) {
  staged_direct(Collective::kBroadcast, "1", "128K", false, false, "64M");
}
// Not staged (announced only from 1 GiB), the root's mem_alloc buffer read
// mapped by every receiver, none of it written by the root.
TEST(SharedBuffers, OversubscribedRootWritesNothingIntoItsReaders) {
  staged_direct(Collective::kBroadcast, "1", "1G", true, true);
}

// LOOM_SHM_MAP_SHARED is the receiving rank's own setting (not agreed at
// init): a rank with it off takes staged blocks through its FIFO. The tuner
// must still choose the same algorithm on every rank, so it must not price
// the staged direct all_gather / broadcast from the rank's own setting.
// Chosen by the tuner (no LOOM_ALGO), rank 0 with mapping off.
void mixed_mapping(Collective coll) {
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  if (cpus > 3) GTEST_SKIP() << cpus << " CPUs: " << 2 * cpus << " processes would be too many for this test";
  const int n = 2 * cpus;
  std::string map = "0";
  for (int r = 1; r < n; ++r) map += ",1";
  setenv("LOOM_TIMEOUT", "20", 1);
  setenv("LOOM_LLC_BYTES", "256K", 1);  // the broadcast stages beyond the cache
  run_ranks(n, [coll](int, Comm& comm, std::string* err) {
    testing::Case cs;
    cs.coll = coll;
    cs.root = 1;
    for (size_t count : {size_t{1} << 15, size_t{1} << 18, size_t{1} << 20}) {
      cs.count = count;
      if (Status st = testing::run_case(comm, cs); !st.is_ok())
        return *err = std::to_string(count * 4) + " B: " + st.to_string(), false;
    }
    return true;
  }, map.c_str(), nullptr);
  unsetenv("LOOM_TIMEOUT");
  unsetenv("LOOM_LLC_BYTES");
}
TEST(SharedBuffers, ARankWithMappingOffRunsTheSameAllGather) { mixed_mapping(Collective::kAllGather); }
TEST(SharedBuffers, ARankWithMappingOffRunsTheSameBroadcast) { mixed_mapping(Collective::kBroadcast); }

// Every rank lays out its segment and reads its peers' with its own
// LOOM_SHM_FIFO_BYTES. Ranks that disagree (one launcher's environment set
// it) must all fail at setup, naming the variable. Regression: with 3 ranks
// the odd one died of SIGBUS prefaulting past the end of a smaller peer
// segment; with 2 ranks they ran and the receiver read zeros at its own
// offsets.
TEST(ShmSetup, RanksWithDifferentFifoSizesFailNamingTheVariable) {
  for (int n : {2, 3}) {
    auto id = testing::unique_id();
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    auto results = testing::run_processes(n, [&](int r, int fd) {
      setenv("LOOM_SHM_FIFO_BYTES", r == 0 ? "4M" : "2M", 1);
      setenv("LOOM_TIMEOUT", "20", 1);
      auto comm = Comm::init_rank(*id, n, r);
      if (comm.is_ok()) {
        const std::string msg = "init succeeded";
        (void)!write(fd, msg.data(), msg.size());
        return 1;
      }
      const std::string err = comm.status().to_string();
      (void)!write(fd, err.data(), err.size());
      return err.find("LOOM_SHM_FIFO_BYTES") != std::string::npos ? 0 : 2;
    }, 60);
    for (int r = 0; r < n; ++r)
      EXPECT_TRUE(WIFEXITED(results[r].status) && WEXITSTATUS(results[r].status) == 0)
          << n << " ranks, rank " << r << ": " << results[r].output;
    EXPECT_TRUE(testing::loom_shm_segments().empty());
  }
}

}  // namespace
}  // namespace loom
