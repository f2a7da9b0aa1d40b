// loom-stress: the random operation plan. Every rank derives the same plan
// from (seed, step index, communicator size) alone, so ranks never disagree
// on what to run and any step can be regenerated without running the steps
// before it (--from). Choices that only one rank sees (its buffers, whether
// it waits in order, whether its caller waits) come from a second stream
// seeded with the rank as well (local_rng).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/types.h"

namespace loom::stress {

// splitmix64: tiny, fast, and good enough for choosing test cases.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n); n > 0.
  uint64_t below(uint64_t n) { return next() % n; }
  bool chance(double p) { return uniform() < p; }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[below(v.size())];
  }

 private:
  uint64_t s_;
};

// Mixes numbers into one seed (order matters).
uint64_t mix(uint64_t a, uint64_t b);
uint64_t mix(uint64_t a, uint64_t b, uint64_t c);

// The op kinds --colls selects from: the seven collectives (Collective,
// kSendRecv being a set of point-to-point transfers) plus a group of several
// collectives (and maybe transfers) in one group_start/group_end.
enum class Kind : int { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kReduce, kAllToAll, kSendRecv, kGroup };
inline constexpr int kNumKinds = 8;
const char* kind_name(Kind k);
bool parse_kinds(const std::string& list, uint32_t* mask, std::string* err);
inline constexpr uint32_t kAllKinds = (1u << kNumKinds) - 1;

// One point-to-point message: src sends `count` x send_dt, dst receives
// recv_count x recv_dt. A group may mix types, but as in NCCL the two ends of
// one message name the same count and type (Loom refuses a receive that only
// matches in bytes: "mismatched operations"), so today recv_* == send_*.
struct Transfer {
  int src = 0, dst = 0;
  size_t count = 0;
  DataType send_dt = DataType::kUint8;
  DataType recv_dt = DataType::kUint8;
  size_t recv_count = 0;
  uint64_t salt = 0;
};

// How an op's data is made (stress_check.h):
// - kVerifiable: perf-tests/verifiable.h, exact for every op (prod and avg
//   included) but of period 5 in rank and index for sums, so a block landing
//   5 or 60 elements off, or from rank r+5, can read as right;
// - kHashBytes: every byte a hash of (source rank, element index), for the
//   collectives that only copy (any misplaced byte shows);
// - kHashValues: for sum / max / min, integers hashed from (rank, index) in a
//   range where every partial result is exact in the type.
enum class Scheme { kVerifiable, kHashBytes, kHashValues };
const char* scheme_name(Scheme s);

// One collective (or one set of transfers) as every rank issues it.
struct Part {
  Collective coll = Collective::kAllReduce;
  DataType dt = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  size_t count = 0;
  int root = 0;
  // In place on every rank, or (mixed_place) each rank decides for itself:
  // NCCL lets ranks differ, since in place is a property of one rank's buffers.
  bool in_place = false;
  bool mixed_place = false;
  // Added to every element index of the closed-form data, so consecutive
  // ops carry different values (stale data from an earlier op shows).
  uint64_t salt = 0;
  Scheme scheme = Scheme::kVerifiable;
  // kSendRecv: the transfers; grouped = inside group_start/group_end, else a
  // single send and its recv issued as plain ops (then exactly one transfer,
  // src != dst).
  std::vector<Transfer> xfers;
  bool grouped = true;
  bool reduces() const {
    return coll == Collective::kAllReduce || coll == Collective::kReduceScatter || coll == Collective::kReduce;
  }
};

// One operation (one Work): a single part, or a group of parts.
struct Op {
  uint64_t index = 0;  // global op number (reported on failure, --from)
  Kind kind = Kind::kAllReduce;
  std::vector<Part> parts;
  bool group = false;   // issued between group_start/group_end
  bool nested = false;  // ... with a nested inner group_start/group_end
  // The same collective as the op before it in an async batch, out of place:
  // a rank may pass the earlier op's send buffer again (two ops in flight
  // read one buffer, as NCCL allows).
  bool twin = false;
};

struct Step {
  enum class Type { kBatch, kSplit } type = Type::kBatch;
  // kBatch: ops issued one after another; async = without waiting in between.
  std::vector<Op> ops;
  bool async = false;
  // kSplit: color and key of every rank (color < 0: not in any child), the
  // seed and length of each child's plan.
  std::vector<int> colors, keys;
  uint64_t child_seed = 0;
  int child_steps = 0;
  bool interleave = false;  // a parent step after each child step
  bool overlap = false;     // ... while the child's step is still in flight
  bool concurrent = false;  // ... on a second thread while the first waits for the child's
  uint64_t op_index = 0;  // the op index the split step takes
};

struct GenOptions {
  size_t max_bytes = size_t{4} << 20;  // largest buffer of one op
  uint32_t kinds = kAllKinds;
  bool split = true;
  bool async = true;
  int depth = 0;  // 0 = world communicator, 1 = a split child, ...
};

// The step `step_index` of the plan of (seed, nranks); its ops are numbered
// from first_op.
Step make_step(uint64_t seed, uint64_t step_index, int nranks, const GenOptions& g, uint64_t first_op);
// Number of op indices a step consumes (a split counts one).
inline uint64_t ops_in(const Step& s) { return s.type == Step::Type::kSplit ? 1 : s.ops.size(); }

// The seed of a rank's own choices for one step.
inline uint64_t local_seed(uint64_t seed, uint64_t step_index, int rank) {
  return mix(seed ^ 0x6c6f63616cull, step_index, static_cast<uint64_t>(rank) + 1);
}

std::string describe(const Part& p);
std::string describe(const Op& op);

}  // namespace loom::stress
