// Diagnostics building blocks without processes: fingerprint messages, the
// recorder's ring buffer, and loom-doctor's handling of bad dump files.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "diag/analyze.h"
#include "diag/fingerprint.h"
#include "diag/recorder.h"

namespace loom::diag {
namespace {

CollArgs coll(Collective c, size_t count, int rank, int root = 0) {
  CollArgs a;
  a.coll = c;
  a.count = count;
  a.rank = rank;
  a.nranks = 4;
  a.root = root;
  return a;
}

TEST(Fingerprint, MismatchNamesBothCalls) {
  CollArgs b = coll(Collective::kBroadcast, 4096, 2, 1), ar = coll(Collective::kAllReduce, 4096, 3);
  Fingerprint sender, receiver;
  sender.set(&b, 57, 57);
  receiver.set(&ar, 57, 57);
  std::byte h[kFingerprintBytes];
  sender.encode(3, 1024, h);
  Status st = receiver.check(2, 1024, h);
  EXPECT_EQ(st.code(), StatusCode::kInvalidUsage);
  EXPECT_EQ(st.message(),
            "mismatched operations: rank 2 called broadcast(root=1, 4096 x fp32) as op #57 where rank 3 called "
            "allreduce(sum, 4096 x fp32)");
}

TEST(Fingerprint, MatchingCallsPassAndEveryFieldCounts) {
  CollArgs a = coll(Collective::kAllReduce, 4096, 0), b = coll(Collective::kAllReduce, 4096, 1);
  Fingerprint fa, fb;
  fa.set(&a, 3, 3);
  fb.set(&b, 3, 3);
  std::byte h[kFingerprintBytes];
  fa.encode(1, 2048, h);
  EXPECT_TRUE(fb.check(0, 2048, h).is_ok());
  // Different op, count, dtype, collective sequence: each is caught.
  CollArgs c = b;
  c.op = RedOp::kMax;
  fb.set(&c, 3, 3);
  EXPECT_FALSE(fb.check(0, 2048, h).is_ok());
  c = b;
  c.count = 4095;
  fb.set(&c, 3, 3);
  EXPECT_FALSE(fb.check(0, 2048, h).is_ok());
  c = b;
  c.dt = DataType::kBfloat16;
  fb.set(&c, 3, 3);
  EXPECT_FALSE(fb.check(0, 2048, h).is_ok());
  fb.set(&b, 4, 4);
  Status st = fb.check(0, 2048, h);
  EXPECT_NE(st.message().find("collective #3 vs #4"), std::string::npos) << st.message();
}

// The receiver compares the header as bytes: fields the collective ignores
// must not make matching calls differ (regression guard for that compare).
TEST(Fingerprint, FieldsTheCollectiveIgnoresDoNotCount) {
  CollArgs b0 = coll(Collective::kBroadcast, 64, 0, 2), b1 = coll(Collective::kBroadcast, 64, 1, 2);
  b0.op = RedOp::kSum;
  b1.op = RedOp::kMax;  // a broadcast reduces nothing
  Fingerprint f0, f1;
  f0.set(&b0, 10, 7);
  f1.set(&b1, 12, 7);  // op sequences may differ (send/recv in between): informational
  std::byte h[kFingerprintBytes];
  f0.encode(1, 64, h);
  EXPECT_TRUE(f1.check(0, 64, h).is_ok());
  CollArgs a0 = coll(Collective::kAllReduce, 64, 0, 0), a1 = coll(Collective::kAllReduce, 64, 1, 3);
  f0.set(&a0, 1, 1);
  f1.set(&a1, 1, 1);  // an allreduce has no root
  f0.encode(1, 64, h);
  EXPECT_TRUE(f1.check(0, 64, h).is_ok());
  // ... while the fields it uses still count.
  CollArgs b2 = coll(Collective::kBroadcast, 64, 1, 3);
  f0.set(&b0, 10, 7);
  f1.set(&b2, 10, 7);
  f0.encode(1, 64, h);
  Status st = f1.check(0, 64, h);
  EXPECT_EQ(st.code(), StatusCode::kInvalidUsage);
  EXPECT_NE(st.message().find("broadcast(root=2, 64 x fp32)"), std::string::npos) << st.message();
}

TEST(Fingerprint, DataWhereAHeaderBelongsIsOutOfStep) {
  CollArgs a = coll(Collective::kAllReduce, 16, 1);
  Fingerprint f;
  f.set(&a, 9, 9);
  std::byte junk[kFingerprintBytes] = {};
  Status st = f.check(0, 8, junk);
  EXPECT_NE(st.message().find("out of step"), std::string::npos) << st.message();
}

TEST(Fingerprint, SendRecvComparesCountAndDestination) {
  CollArgs s;
  s.coll = Collective::kSendRecv;
  s.rank = 0;
  s.p2p.push_back({true, 1, 1024});
  CollArgs r;
  r.coll = Collective::kSendRecv;
  r.rank = 1;
  r.p2p.push_back({false, 0, 512});
  Fingerprint fs, fr;
  fs.set(&s, 5, 0);
  fr.set(&r, 5, 0);
  std::byte h[kFingerprintBytes];
  fs.encode(1, 1024, h);
  Status st = fr.check(0, 512, h);
  EXPECT_EQ(st.message(),
            "mismatched operations: rank 0 called send(1024 x fp32 to rank 1) as op #5 where rank 1 called recv(512 x "
            "fp32 from rank 0)");
  EXPECT_TRUE(fr.check(0, 1024, h).is_ok());
}

TEST(Recorder, KeepsTheLastNOps) {
  FlightRecorder rec(4);
  CollArgs a = coll(Collective::kAllReduce, 8, 0);
  for (uint64_t s = 0; s < 10; ++s) {
    rec.on_enqueue(s, s, a);
    rec.on_start(s, "ring", 2);
    if (s < 9) rec.on_end(s, s != 8);
  }
  auto j = rec.to_json();
  ASSERT_EQ(j.size(), 4u);
  EXPECT_EQ(j[0]["seq"], 6);
  EXPECT_EQ(j[2]["state"], "failed");
  EXPECT_EQ(j[3]["state"], "started");
  EXPECT_EQ(j[3]["algo"], "ring");
  EXPECT_EQ(FlightRecorder(0).to_json().size(), 0u);
  // A limit renders only the newest entries, oldest first.
  j = rec.to_json(2);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["seq"], 8);
  EXPECT_EQ(j[1]["seq"], 9);
  EXPECT_EQ(rec.to_json(0).size(), 0u);
  EXPECT_EQ(rec.to_json(100).size(), 4u);
}

// An op run at issue is recorded in one go while it waits (enqueued and
// started at the same moment, each field written once): its entry reads as
// a started op, and nothing of the older op its slot held is left.
TEST(Recorder, AnOpRunAtIssueIsOneStartedEntry) {
  FlightRecorder rec(2);
  CollArgs p2p = coll(Collective::kSendRecv, 0, 0);
  p2p.p2p.push_back({true, 1, 64});
  rec.on_enqueue(0, 0, p2p);
  rec.on_start(0, "p2p", 1);
  rec.on_end(0, true);
  rec.on_enqueue(1, 1, p2p);
  const int64_t t = rec.on_run_at_issue(2, 7, coll(Collective::kAllReduce, 1000, 0), "rabenseifner", 5);
  EXPECT_GT(t, 0);
  auto j = rec.to_json();
  ASSERT_EQ(j.size(), 2u);
  const auto& e = j[1];
  EXPECT_EQ(e["seq"], 2);
  EXPECT_EQ(e["coll"], "allreduce");
  EXPECT_EQ(e["coll_seq"], 7);
  EXPECT_EQ(e["count"], 1000);
  EXPECT_EQ(e["state"], "started");
  EXPECT_EQ(e["algo"], "rabenseifner");
  EXPECT_EQ(e["nphases"], 5);
  EXPECT_EQ(e["enqueued_ns"], t);
  EXPECT_EQ(e["started_ns"], t);
  EXPECT_EQ(e["ended_ns"], 0) << "the slot's older op ended; this one has not";
  EXPECT_FALSE(e.contains("p2p"));
  rec.on_end(2, true);
  EXPECT_EQ(rec.to_json()[1]["state"], "completed");
  EXPECT_GT(FlightRecorder(0).on_run_at_issue(3, 3, coll(Collective::kAllReduce, 8, 0), "ring", 1), 0)
      << "without a recorder the clock is still read (running_since)";
}

// An entry is one cache line: the call's small fields share one word, and the
// ring holds a power of two of entries (a mask, not a division, per op). A
// dump still keeps exactly the last N ops for any N, and every field reads
// back as written, at the edges of its bits.
TEST(Recorder, OneLineEntriesKeepEveryFieldAndTheLastNOfAnyN) {
  FlightRecorder rec(3);  // a ring of 4, a dump of 3
  EXPECT_EQ(rec.capacity(), 3u);
  CollArgs a = coll(Collective::kBroadcast, (size_t{1} << 40) + 3, 0, 2'000'000'000);
  a.dt = static_cast<DataType>(kNumDataTypes - 1);
  a.op = RedOp::kAvg;
  CollArgs p2p = coll(Collective::kSendRecv, 0, 0);
  for (int i = 0; i < 6; ++i) p2p.p2p.push_back({i % 2 == 0, 100 + i, size_t{1} << 33});
  for (uint64_t s = 0; s < 10; ++s) {
    if (s == 8) {
      rec.on_enqueue(s, s, p2p);
      rec.on_start(s, "p2p", 70000);  // phases saturate at 65535
      rec.on_end(s, false);
    } else {
      rec.on_run_at_issue(s, s + 1000, a, "rabenseifner", static_cast<int>(s));
      if (s != 9) rec.on_end(s, true);
    }
  }
  auto j = rec.to_json();
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0]["seq"], 7);
  const auto& b = j[2];
  EXPECT_EQ(b["seq"], 9);
  EXPECT_EQ(b["coll"], "broadcast");
  EXPECT_EQ(b["count"], (uint64_t{1} << 40) + 3);
  EXPECT_EQ(b["dtype"], dtype_name(a.dt));
  EXPECT_EQ(b["op"], "avg");
  EXPECT_EQ(b["root"], 2'000'000'000);
  EXPECT_EQ(b["coll_seq"], 1009);
  EXPECT_EQ(b["nphases"], 9);
  EXPECT_EQ(b["state"], "started");
  EXPECT_EQ(b["algo"], "rabenseifner");
  EXPECT_EQ(j[0]["state"], "completed");
  const auto& p = j[1];
  EXPECT_EQ(p["coll"], "sendrecv") << p.dump();
  EXPECT_EQ(p["state"], "failed");
  EXPECT_EQ(p["nphases"], 65535);
  EXPECT_EQ(p["p2p_total"], 6);
  ASSERT_EQ(p["p2p"].size(), 4u);
  EXPECT_EQ(p["p2p"][3]["peer"], 103);
  EXPECT_EQ(p["p2p"][3]["send"], false);
  EXPECT_EQ(p["p2p"][0]["count"], 0x7fffffff) << "counts saturate at 2^31 - 1";
  EXPECT_FALSE(b.contains("p2p"));
}

// Non-blocking calls queue behind a hung op (up to LOOM_MAX_QUEUED_OPS,
// 1024, as many as the default ring holds). The hung op keeps its entry
// until it ends, and so does every queued op; an op issued when its slot is
// still held by an unfinished one is not recorded. Regression: op S + ring
// took S's slot at issue, so the dump lost the hung op, and S's failure
// (on_end) was written onto the queued op's entry.
TEST(Recorder, AnUnfinishedOpKeepsItsEntryWhenTheQueueOutgrowsTheRing) {
  FlightRecorder rec(4);  // a ring of 4
  auto call = [](uint64_t s) { return coll(Collective::kAllReduce, 100 + s, 0); };
  rec.on_enqueue(0, 0, call(0));
  rec.on_start(0, "ring", 2);  // op 0 runs and hangs
  for (uint64_t s = 1; s < 6; ++s) rec.on_enqueue(s, s, call(s));
  EXPECT_EQ(rec.unrecorded(), 2u) << "ops 4 and 5 found their slots held by ops 0 and 1";
  rec.on_end(0, false);  // the watchdog fails op 0
  rec.on_start(4, "ring", 2);  // never recorded: writes nothing
  rec.on_end(4, false);
  auto j = rec.to_json();
  ASSERT_EQ(j.size(), 4u) << j.dump();
  EXPECT_EQ(j[0]["seq"], 0) << "older than the last 4 issued, but kept: unfinished then, failed now";
  EXPECT_EQ(j[0]["state"], "failed");
  EXPECT_EQ(j[0]["count"], 100);
  EXPECT_EQ(j[0]["algo"], "ring");
  EXPECT_GT(j[0]["ended_ns"], 0);
  for (uint64_t s = 1; s < 4; ++s) {
    EXPECT_EQ(j[s]["seq"], s);
    EXPECT_EQ(j[s]["state"], "enqueued") << j.dump();
    EXPECT_EQ(j[s]["count"], 100 + s);
    EXPECT_EQ(j[s]["ended_ns"], 0);
  }
  // Once the queue has drained, new ops take the slots again: the dump is
  // the last 4 issued, and the failed op while its slot lasts.
  for (uint64_t s = 1; s < 4; ++s) {
    rec.on_start(s, "ring", 2);
    rec.on_end(s, true);
  }
  for (uint64_t s = 6; s < 8; ++s) rec.on_enqueue(s, s, call(s));
  j = rec.to_json();
  ASSERT_EQ(j.size(), 3u) << j.dump();
  EXPECT_EQ(j[0]["seq"], 0);
  EXPECT_EQ(j[1]["seq"], 6);
  EXPECT_EQ(j[2]["seq"], 7);
  for (uint64_t s = 8; s < 10; ++s) rec.on_enqueue(s, s, call(s));
  EXPECT_EQ(rec.unrecorded(), 2u);
  j = rec.to_json();
  ASSERT_EQ(j.size(), 4u) << j.dump();
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(j[i]["seq"], 6 + i);
}

nlohmann::json rank_state(int rank, bool in_op) {
  nlohmann::json peers = nlohmann::json::array();
  for (int r = 0; r < 2; ++r) peers.push_back({{"rank", r}, {"pid", 100 + r}, {"host", "h"}, {"diag", ""}});
  nlohmann::json op = {{"seq", 3}, {"coll", "allreduce"}, {"count", 8}, {"dtype", "float32"}, {"op", "sum"},
                       {"root", 0}, {"coll_seq", 3}, {"state", "started"}, {"enqueued_ns", 1}, {"started_ns", 1},
                       {"ended_ns", 0}};
  nlohmann::json comm = {{"name", "w"}, {"id", "c1"}, {"rank", rank}, {"nranks", 2}, {"status", "ok"},
                         {"peers", peers}, {"ops", nlohmann::json::array({op})}};
  if (in_op)
    comm["current"] = {{"seq", 3}, {"op", op}, {"started_ns", 1}, {"phase", 0}, {"nphases", 1}, {"waiting_peer", 1},
                       {"steps", nlohmann::json::array({{{"peer", 1}, {"kind", "recv"}, {"done", 0}, {"total", 32}}})}};
  return {{"schema", "loom-diag"}, {"version", 1}, {"host", "h"}, {"pid", 100 + rank}, {"time_ns", 2},
          {"comms", nlohmann::json::array({comm})}};
}

TEST(Doctor, BadDumpsAreNamedAndTheRestIsAnalysed) {
  std::string dir = "/tmp/loom-diag-unit-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/loom-rank0-h-100.json") << rank_state(0, true).dump(1);
  std::string full = rank_state(1, false).dump(1);
  std::ofstream(dir + "/loom-rank1-h-101.json") << full.substr(0, full.size() / 2);  // truncated
  std::ofstream(dir + "/loom-rank9-h-999.json") << "{\"schema\": \"loom-diag\", \"version\": 1, ]";  // corrupt
  std::ofstream(dir + "/other.json") << "{\"hello\": 1}";
  std::ofstream(dir + "/empty.json") << "";
  nlohmann::json typed = rank_state(1, false);
  typed["pid"] = "1000";  // a string where a number belongs (regression: std::terminate)
  std::ofstream(dir + "/loom-rank7-h-1000.json") << typed.dump(1);
  nlohmann::json null_rank = rank_state(1, false);
  null_rank["comms"][0]["rank"] = nullptr;
  std::ofstream(dir + "/loom-rank8-h-1001.json") << null_rank.dump(1);
  Snapshot s = load_dumps(dir);
  std::string problems;
  for (const auto& p : s.problems) problems += p + "\n";
  EXPECT_NE(problems.find("loom-rank1-h-101.json: truncated"), std::string::npos) << problems;
  EXPECT_NE(problems.find("loom-rank9-h-999.json: corrupt"), std::string::npos) << problems;
  EXPECT_NE(problems.find("other.json: not a loom-diag dump"), std::string::npos) << problems;
  EXPECT_NE(problems.find("empty.json: empty file"), std::string::npos) << problems;
  EXPECT_NE(problems.find("loom-rank7-h-1000.json: corrupt"), std::string::npos) << problems;
  EXPECT_NE(problems.find("loom-rank8-h-1001.json: corrupt"), std::string::npos) << problems;
  EXPECT_NE(problems.find("no dump from 'w' rank 1 (pid 101 on h)"), std::string::npos) << problems;
  Verdict v = analyze(s);
  EXPECT_EQ(v.cls, "HANG") << v.to_text();
  EXPECT_EQ(v.ranks, std::vector<int>{1}) << v.to_text();
  EXPECT_NE(v.to_text().find("problem: loom-rank1-h-101.json: truncated"), std::string::npos);
  std::filesystem::remove_all(dir);
  // Missing directory: a problem, not a crash.
  Snapshot none = load_dumps(dir);
  EXPECT_EQ(analyze(none).cls, "NO_DATA");
  EXPECT_FALSE(none.problems.empty());
}

// The same allreduce with different counts can run different algorithms on
// the two ranks: the receiver then reads data where it expected the header
// ("out of step"), not the peer's call. The ranks' recorded calls say what
// differs: an argument mismatch naming the rank. Regression: it was called a
// collective mismatch (DoctorCases.DifferentArguments, now and then in CI).
TEST(Doctor, OutOfStepWithTheSameCollectiveIsAnArgumentMismatch) {
  Snapshot s;
  s.processes = {rank_state(0, true), rank_state(1, true)};
  auto& c0 = s.processes[0]["comms"][0];
  auto& c1 = s.processes[1]["comms"][0];
  c1["current"]["op"]["count"] = 4;
  c1["ops"][0]["count"] = 4;
  for (auto* c : {&c0, &c1}) {
    (*c)["status"] = "failed";
    (*c)["current"]["state"] = "failed";
  }
  c0["error"] = "InvalidUsage: comm rank 0: allreduce #3 (two_shot, 8 x float32, sum): mismatched operations: the "
                "stream from rank 1 is out of step at op #3 (expected an operation header, got data): rank 1 "
                "exchanged a different number of messages with rank 0 in an earlier or this op than rank 0 called "
                "allreduce(sum, 8 x fp32) expects";
  Verdict v = analyze(s);
  EXPECT_EQ(v.cls, "ARGUMENT_MISMATCH") << v.to_text();
  EXPECT_NE(v.summary.find("rank 1 called allreduce(sum, 4 x"), std::string::npos) << v.to_text();
  // Without the calls in the dumps, the report alone: a collective mismatch.
  c0.erase("current");
  c1.erase("current");
  EXPECT_EQ(analyze(s).cls, "COLLECTIVE_MISMATCH") << analyze(s).to_text();
}

TEST(Doctor, IdleRankIsStuckInUserCode) {
  Snapshot s;
  s.processes = {rank_state(0, true), rank_state(1, false)};
  Verdict v = analyze(s);
  EXPECT_EQ(v.cls, "STUCK_IN_USER_CODE") << v.to_text();
  EXPECT_EQ(v.ranks, std::vector<int>{1});
}

}  // namespace
}  // namespace loom::diag

namespace loom::diag {
namespace {

// Four ranks on two hosts, "ha" (ranks 0, 1) and "hb" (ranks 2, 3), all in
// allreduce op #7 (schema 2: peers carry host hashes, processes their host id).
// waits[r] = the peer rank r is blocked on (-1: not in the op).
nlohmann::json two_host_state(int rank, const std::vector<int>& waits, const std::string& error = "") {
  auto host_of = [](int r) { return r < 2 ? std::string("ha") : std::string("hb"); };
  nlohmann::json peers = nlohmann::json::array();
  for (int r = 0; r < 4; ++r)
    peers.push_back({{"rank", r}, {"pid", 100 + r}, {"host", "vm"}, {"host_hash", host_of(r) == "ha" ? "00aa" : "00bb"},
                     {"addr", fmt::format("198.51.100.{}:4000", r < 2 ? 10 : 11)}, {"diag", ""}});
  nlohmann::json op = {{"seq", 7}, {"coll", "allreduce"}, {"count", 1024}, {"dtype", "float32"}, {"op", "sum"},
                       {"root", 0}, {"coll_seq", 7}, {"state", "started"}, {"enqueued_ns", 1}, {"started_ns", 1},
                       {"ended_ns", 0}};
  nlohmann::json comm = {{"name", "comm"}, {"id", "c2"}, {"rank", rank}, {"nranks", 4}, {"peers", peers},
                         {"status", error.empty() ? "ok" : "failed"}, {"ops", nlohmann::json::array({op})}};
  if (!error.empty()) comm["error"] = error;
  if (waits[rank] >= 0)
    comm["current"] = {{"seq", 7}, {"op", op}, {"state", "failed"}, {"started_ns", 1}, {"phase", 0}, {"nphases", 2},
                       {"waiting_peer", waits[rank]},
                       {"steps", nlohmann::json::array({{{"peer", waits[rank]}, {"kind", "recv"}, {"done", 0},
                                                         {"total", 4096}}})}};
  return {{"schema", "loom-diag"}, {"version", 2}, {"reason", "comm 'comm' rank failed: Timeout"}, {"host", "vm"},
          {"host_id", host_of(rank)}, {"host_hash", host_of(rank) == "ha" ? "00aa" : "00bb"}, {"pid", 100 + rank},
          {"time_ns", 3'000'000'001}, {"comms", nlohmann::json::array({comm})}};
}

// Files that read well one by one but break the analysis: a rank number
// beyond int in an error's text (std::stoi threw out_of_range), and two
// files of a 2-rank communicator whose peer tables name ranks 0 and 5
// (map::at threw in the partition check). Regression: loom-doctor died with
// std::terminate (exit 134) and no verdict; now the first file is named as
// corrupt and the rest analysed, the second pair gets NO_VERDICT with the
// reason, and loom-doctor exits 1 for it (no verdict), 0 with one.
TEST(Doctor, DumpsThatBreakTheAnalysisGetNoVerdictNotACrash) {
  const std::string dir = "/tmp/loom-diag-unit-break-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  nlohmann::json huge = rank_state(0, true);
  huge["comms"][0]["error"] =
      "InvalidUsage: comm rank 0: allreduce #3 (ring, 8 x float32, sum): mismatched operations: rank 99999999999 "
      "called allreduce(sum, 8 x fp32) as op #3 where rank 1 called broadcast(root=0, 8 x fp32)";
  std::ofstream(dir + "/loom-rank0-h-100.json") << huge.dump(1);
  std::ofstream(dir + "/loom-rank1-h-101.json") << rank_state(1, true).dump(1);
  Snapshot s = load_dumps(dir);
  std::string problems;
  for (const auto& p : s.problems) problems += p + "\n";
  EXPECT_NE(problems.find("loom-rank0-h-100.json: corrupt"), std::string::npos) << problems;
  const Verdict rest = analyze(s);  // rank 1's file: in the op, waiting on rank 1's peer
  EXPECT_EQ(rest.cls, "HANG") << rest.to_text();
  EXPECT_NE(rest.to_text().find("problem: loom-rank0-h-100.json: corrupt"), std::string::npos) << rest.to_text();
  std::filesystem::remove_all(dir);

  Snapshot odd;
  for (int r = 0; r < 2; ++r) {
    nlohmann::json st = two_host_state(r, {1, 0, -1, -1});
    auto& comm = st["comms"][0];
    comm["nranks"] = 2;
    nlohmann::json peers = nlohmann::json::array({comm["peers"][0], comm["peers"][2]});
    peers[1]["rank"] = 5;  // a peer table that contradicts nranks
    comm["peers"] = peers;
    st["host_id"] = r == 0 ? "ha" : "hb";
    st["host_hash"] = r == 0 ? "00aa" : "00bb";
    odd.processes.push_back(st);
  }
  Verdict v = analyze(odd);
  EXPECT_EQ(v.cls, "NO_VERDICT") << v.to_text();
  EXPECT_NE(v.summary.find("the dumps contradict one another"), std::string::npos) << v.to_text();
}

Snapshot snapshot_of(const std::vector<int>& waits, const std::vector<int>& alive, const std::string& error = "") {
  Snapshot s;
  for (int r : alive) s.processes.push_back(two_host_state(r, waits, error));
  return s;
}

const std::string kTimeout = "Timeout: comm rank 0: allreduce #7 (ring, 1024 x float32, sum): deadline (LOOM_TIMEOUT) passed";

TEST(Doctor, MutualWaitsAcrossHostsAreLinkDown) {
  // 0 -> 1 inside host ha, 1 -> 3 and 2 -> 0 and 3 -> 1 across.
  Verdict v = analyze(snapshot_of({1, 3, 0, 1}, {0, 1, 2, 3}, kTimeout));
  EXPECT_EQ(v.cls, "LINK_DOWN") << v.to_text();
  EXPECT_EQ(v.ranks, (std::vector<int>{0, 1, 2, 3})) << v.to_text();
  EXPECT_NE(v.line().find("between host ha (ranks 0 and 1) and host hb (ranks 2 and 3) is cut"), std::string::npos)
      << v.to_text();
  const std::string text = v.to_text();
  EXPECT_NE(text.find("across the cut: rank 1 on ha waits on rank 3 on hb (recv 0/4096 B)"), std::string::npos) << text;
  EXPECT_NE(text.find("across the cut: rank 2 on hb waits on rank 0 on ha"), std::string::npos) << text;
  EXPECT_NE(text.find("within host ha: rank 0 waits on rank 1"), std::string::npos) << text;
  EXPECT_NE(text.find("alive on host hb (state written by every process): rank 2 (pid 102"), std::string::npos) << text;
}

TEST(Doctor, OneWayWaitsOrOneHostAreNotLinkDown) {
  // Host hb waits on ha, but ha's ranks wait only on each other: a hang on ha.
  EXPECT_EQ(analyze(snapshot_of({1, 0, 0, 1}, {0, 1, 2, 3}, kTimeout)).cls, "HANG");
  // Host hb's ranks never entered the op: not a link.
  Verdict idle = analyze(snapshot_of({2, 3, -1, -1}, {0, 1, 2, 3}, kTimeout));
  EXPECT_EQ(idle.cls, "STUCK_IN_USER_CODE") << idle.to_text();
  // Every rank on one host (same hash): no link between hosts to blame.
  Snapshot one = snapshot_of({1, 3, 0, 1}, {0, 1, 2, 3}, kTimeout);
  for (auto& p : one.processes)
    for (auto& peer : p["comms"][0]["peers"]) peer["host_hash"] = "00aa";
  EXPECT_EQ(analyze(one).cls, "HANG") << analyze(one).to_text();
}

TEST(Doctor, DeadProcessOnTheOtherHostIsRankDiedNotLinkDown) {
  // Rank 3 on hb was killed: no state of its own; its host peer reports it.
  const std::string died = "RemoteError: comm rank 2: allreduce #7 (ring, 1024 x float32, sum): rank 3 (pid 103 on vm) died";
  Snapshot s = snapshot_of({1, 3, 0, 3}, {0, 1, 2}, kTimeout);
  s.processes[2] = two_host_state(2, {1, 3, 3, 3}, died);
  Verdict v = analyze(s);
  EXPECT_EQ(v.cls, "RANK_DIED") << v.to_text();
  EXPECT_EQ(v.ranks, std::vector<int>{3}) << v.to_text();
  // Without anyone having seen it die (only timeouts), a rank without state
  // is still not "alive": no LINK_DOWN.
  Verdict quiet = analyze(snapshot_of({1, 3, 0, 1}, {0, 1, 2}, kTimeout));
  EXPECT_NE(quiet.cls, "LINK_DOWN") << quiet.to_text();
}

TEST(Doctor, ConnectionErrorToAnotherHostIsLinkDown) {
  // The socket transport's text when TCP gives up on a peer.
  const std::string err = "RemoteError: comm rank 1: allreduce #7 (ring, 1024 x float32, sum): receiving from rank 3 on "
                          "host vm (198.51.100.11:4000) failed on stream 0: Connection timed out";
  Snapshot s = snapshot_of({1, 3, 0, 1}, {0, 1, 2, 3}, kTimeout);
  s.processes[1] = two_host_state(1, {1, 3, 0, 1}, err);
  Verdict v = analyze(s);
  EXPECT_EQ(v.cls, "LINK_DOWN") << v.to_text();
  EXPECT_EQ(v.ranks, (std::vector<int>{1, 3})) << v.to_text();
  EXPECT_NE(v.line().find("between host ha (rank 1) and host hb (rank 3)"), std::string::npos) << v.to_text();
}

// The socket transport sees a killed peer only as a connection its kernel
// closed: that peer, without state of its own, is gone. Regression: HANG
// naming a rank that was alive.
TEST(Doctor, SocketPeerThatClosedAndLeftNoStateIsRankDied) {
  const std::string closed = "RemoteError: comm rank 2: allreduce #7 (ring, 1024 x float32, sum): rank 3 on host vm "
                             "(198.51.100.11:4000) closed the connection (the process exited, was killed, or destroyed "
                             "its communicator while this rank still needed data from it)";
  Snapshot s = snapshot_of({1, 2, 3, 3}, {0, 1, 2}, kTimeout);
  s.processes[2] = two_host_state(2, {1, 2, 3, 3}, closed);
  Verdict v = analyze(s);
  EXPECT_EQ(v.cls, "RANK_DIED") << v.to_text();
  EXPECT_EQ(v.ranks, std::vector<int>{3}) << v.to_text();
  EXPECT_NE(v.summary.find("rank 3 (pid 103 on vm)"), std::string::npos) << v.to_text();
  // A peer that closed but still wrote its state (it destroyed its comm) is
  // not called dead.
  Snapshot alive = snapshot_of({1, 2, 3, -1}, {0, 1, 2, 3}, kTimeout);
  alive.processes[2] = two_host_state(2, {1, 2, 3, -1}, closed);
  EXPECT_NE(analyze(alive).cls, "RANK_DIED") << analyze(alive).to_text();
}

// Four ranks on one host; rank 2 finished its part of allreduce #7 and waits
// in #8 (on rank 1) for the others, who still wait in #7: ranks 0 and 1 on
// rank 3, rank 3 on rank 1. Only waits inside #7 name the culprit (rank 3).
Snapshot one_op_apart(int ahead_count_at_7) {
  Snapshot s = snapshot_of({3, 3, 1, 1}, {0, 1, 2, 3}, kTimeout);
  for (auto& p : s.processes)
    for (auto& peer : p["comms"][0]["peers"]) peer["host_hash"] = "00aa";
  auto& c2 = s.processes[2]["comms"][0];
  nlohmann::json done = c2["ops"][0];
  done["state"] = "completed";
  done["count"] = ahead_count_at_7;
  nlohmann::json next = c2["ops"][0];
  next["seq"] = 8;
  next["coll_seq"] = 8;
  c2["ops"] = nlohmann::json::array({done, next});
  c2["current"]["seq"] = 8;
  c2["current"]["op"] = next;
  return s;
}

TEST(Doctor, RanksOneOpApartAreAHangNotAMismatch) {
  Verdict v = analyze(one_op_apart(1024));
  EXPECT_EQ(v.cls, "HANG") << v.to_text();
  EXPECT_EQ(v.ranks, std::vector<int>{3}) << v.to_text();
  EXPECT_NE(v.summary.find("rank 2 finished their part of it"), std::string::npos) << v.to_text();
  EXPECT_NE(v.summary.find("op #7"), std::string::npos) << v.to_text();
  // The op #7 rank 2 recorded differs from the others': a real mismatch.
  Verdict m = analyze(one_op_apart(512));
  EXPECT_EQ(m.cls, "ARGUMENT_MISMATCH") << m.to_text();
  EXPECT_EQ(m.ranks, std::vector<int>{2}) << m.to_text();
}

// Two runs' dumps in one directory: the same rank of the same communicator
// twice. Regression: mixed silently (one file overwrote the other's rank).
TEST(Doctor, DumpsOfTwoRunsInOneDirectoryAreNamed) {
  std::string dir = "/tmp/loom-diag-runs-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  nlohmann::json old0 = rank_state(0, true), old1 = rank_state(1, false);
  nlohmann::json new1 = rank_state(1, true);
  new1["pid"] = 201;
  new1["time_ns"] = 50;
  std::ofstream(dir + "/loom-rank0-h-100.json") << old0.dump(1);
  std::ofstream(dir + "/loom-rank1-h-101.json") << old1.dump(1);
  std::ofstream(dir + "/loom-rank1-h-201.json") << new1.dump(1);
  Snapshot s = load_dumps(dir);
  std::string problems;
  for (const auto& p : s.problems) problems += p + "\n";
  EXPECT_NE(problems.find("loom-rank1-h-101.json and loom-rank1-h-201.json both hold 'w' rank 1"), std::string::npos)
      << problems;
  ASSERT_EQ(s.processes.size(), 2u);
  for (const auto& p : s.processes) EXPECT_NE(p.value("pid", 0), 101) << "the older run's rank 1 was kept";
  std::filesystem::remove_all(dir);
}

// Live status of a job that records no ops (LOOM_TRACE_BUFFER_SIZE=0): the
// engine's finished_seq still shows progress. Regression: called stuck.
TEST(Doctor, FinishedSeqShowsProgressWithoutRecordedOps) {
  auto at = [](uint64_t seq) {
    Snapshot s;
    s.processes = {rank_state(0, true), rank_state(1, true)};
    for (auto& p : s.processes) {
      auto& c = p["comms"][0];
      c["ops"] = nlohmann::json::array();
      c["current"]["seq"] = seq;
      c["current"].erase("op");
      c["finished_seq"] = seq;
    }
    return s;
  };
  Snapshot before = at(10), now = at(20);
  EXPECT_EQ(analyze(now, &before).cls, "PROGRESSING") << analyze(now, &before).to_text();
  EXPECT_NE(analyze(at(10), &before).cls, "PROGRESSING");
}

}  // namespace
}  // namespace loom::diag
