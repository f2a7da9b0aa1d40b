// loom-stress: buffers with guard bytes, and the regions of them whose
// contents are known in closed form after an operation (perf-tests/verifiable.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/types.h"
#include "stress/stress_plan.h"

namespace loom::stress {

enum class BufKind { kHeap, kMemAlloc, kPooled };
const char* buf_kind_name(BufKind k);

// A buffer of `len` bytes at data(), `misalign` bytes past a 64-byte boundary of
// its allocation, between two guard zones of kGuardBytes that must never change.
struct Alloc {
  static constexpr size_t kGuardBytes = 64;
  std::byte* base = nullptr;  // the allocation
  size_t cap = 0;             // its size
  BufKind kind = BufKind::kHeap;
  size_t misalign = 0;
  size_t len = 0;
  uint8_t guard = 0;
  std::byte* data() const { return base + kGuardBytes + misalign; }
  std::string name() const;  // "heap+3", "mem_alloc", "mem_alloc(pooled)+1"
  ~Alloc();
};

// Hands out buffers of a random kind (this rank's own choice): the heap,
// fresh loom::mem_alloc memory, or mem_alloc memory reused from earlier ops
// (peers keep it mapped: new contents in the same buffer must show), and
// sometimes misaligned. Every buffer is filled with `fill` and its guards set.
class BufferPool {
 public:
  ~BufferPool();
  std::shared_ptr<Alloc> get(size_t len, Rng& local, uint8_t fill);
  void release(std::byte* base, size_t cap);  // from ~Alloc of a pooled buffer
  size_t pooled() const { return free_.size(); }

 private:
  struct Free {
    std::byte* base;
    size_t cap;
  };
  std::vector<Free> free_;
};
BufferPool& pool();

// Expected contents of bytes [off, off + bytes) of a buffer after an op.
struct Region {
  enum class Type {
    kReduced,  // expected_value(index0 + i, dt, op, nranks)
    kCopied,   // what fill(dt, op, src, nranks, index0) writes: byte for byte
    kFill,     // every byte == fill
  };
  std::shared_ptr<Alloc> alloc;
  size_t off = 0, bytes = 0;
  Type type = Type::kFill;
  DataType dt = DataType::kUint8;
  RedOp op = RedOp::kSum;
  int nranks = 1;
  int src = 0;
  uint64_t index0 = 0;
  Scheme scheme = Scheme::kVerifiable;
  uint8_t fill = 0;
  bool output = false;  // written by the op (else: must be unchanged)
  std::string what;
};

// "" when the region holds what it should, else the first wrong element
// ("element 17 (byte 34): got 3 want 4; 5 wrong").
std::string check_region(const Region& r);
// "" when both guard zones are intact, else which byte changed.
std::string check_guards(const Alloc& a);
// Writes the input of `rank` for elements index0 .. index0 + count - 1 at p.
void fill_input(std::byte* p, size_t count, DataType dt, RedOp op, Scheme scheme, int rank, int nranks,
                uint64_t index0);
// kHashValues: the largest magnitude of an input such that every partial
// sum (max, min: every value) of nranks inputs is exact in dt; < 1 when the
// scheme cannot serve (dt, op, nranks).
double hash_bound(DataType dt, RedOp op, int nranks);

}  // namespace loom::stress
