#include "stress/stress_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "kernels/host_reduce.h"
#include "loom/memory.h"
#include "verifiable.h"

namespace loom::stress {

const char* buf_kind_name(BufKind k) {
  switch (k) {
    case BufKind::kHeap: return "heap";
    case BufKind::kMemAlloc: return "mem_alloc";
    case BufKind::kPooled: return "mem_alloc(reused)";
  }
  return "?";
}

std::string Alloc::name() const {
  return misalign ? fmt::format("{}+{}", buf_kind_name(kind), misalign) : std::string(buf_kind_name(kind));
}

Alloc::~Alloc() {
  switch (kind) {
    case BufKind::kHeap: std::free(base); break;
    case BufKind::kMemAlloc: (void)mem_free(base); break;
    case BufKind::kPooled: pool().release(base, cap); break;
  }
}

BufferPool& pool() {
  thread_local BufferPool p;  // one per rank (ranks are threads with --threads)
  return p;
}

BufferPool::~BufferPool() {
  for (const Free& f : free_) (void)mem_free(f.base);
}

namespace {
uint8_t guard_byte(uint8_t g, size_t i) { return static_cast<uint8_t>(g ^ (i * 37)); }

// expected_value(index) depends on the index only modulo 3, 4, 5, 7, 11 and
// nranks (verifiable.cc's inputs), so one period of it serves every index.
const std::vector<double>& expected_period(DataType dt, RedOp op, int nranks) {
  struct Key {
    DataType dt;
    RedOp op;
    int n;
  };
  thread_local std::vector<std::pair<Key, std::vector<double>>> cache;
  for (const auto& [k, v] : cache)
    if (k.dt == dt && k.op == op && k.n == nranks) return v;
  size_t period = 4620;  // lcm(3, 4, 5, 7, 11)
  period = std::lcm(period, static_cast<size_t>(nranks));
  std::vector<double> v(period);
  for (size_t i = 0; i < period; ++i) v[i] = verifiable::expected_value(i, dt, op, nranks);
  cache.push_back({Key{dt, op, nranks}, std::move(v)});
  return cache.back().second;
}
}  // namespace

std::shared_ptr<Alloc> BufferPool::get(size_t len, Rng& local, uint8_t fill) {
  auto a = std::make_shared<Alloc>();
  a->len = len;
  a->misalign = local.chance(0.25) ? 1 + local.below(7) : 0;
  a->guard = static_cast<uint8_t>(1 + local.below(255));
  const size_t need = len + 2 * Alloc::kGuardBytes + 8;
  const uint64_t k = local.below(20);
  if (k < 9) {
    a->kind = BufKind::kHeap;
  } else if (k < 14) {
    a->kind = BufKind::kMemAlloc;
  } else {
    a->kind = BufKind::kPooled;
  }
  // Drawn whether used or not: the rank's later choices must not depend on
  // what the pool holds (a replay with --from starts with an empty pool).
  const uint64_t pick = local.next();
  if (a->kind == BufKind::kPooled) {
    // Any free pooled buffer that is large enough, else a new one for the pool.
    std::vector<size_t> fit;
    for (size_t i = 0; i < free_.size(); ++i)
      if (free_[i].cap >= need) fit.push_back(i);
    if (!fit.empty()) {
      const size_t i = fit[pick % fit.size()];
      a->base = free_[i].base;
      a->cap = free_[i].cap;
      free_.erase(free_.begin() + static_cast<long>(i));
    } else {
      // Round up so later, slightly larger requests can reuse it.
      a->cap = std::max<size_t>(need, size_t{1} << (64 - __builtin_clzll(need)));
      Result<void*> r = mem_alloc(a->cap);
      if (!r.is_ok()) {
        fprintf(stderr, "loom-stress: mem_alloc(%zu): %s\n", a->cap, r.status().to_string().c_str());
        std::exit(4);
      }
      a->base = static_cast<std::byte*>(*r);
    }
  } else if (a->kind == BufKind::kMemAlloc) {
    a->cap = need;
    Result<void*> r = mem_alloc(need);
    if (!r.is_ok()) {
      fprintf(stderr, "loom-stress: mem_alloc(%zu): %s\n", need, r.status().to_string().c_str());
      std::exit(4);
    }
    a->base = static_cast<std::byte*>(*r);
  } else {
    a->cap = need;
    a->base = static_cast<std::byte*>(std::aligned_alloc(64, (need + 63) / 64 * 64));
    if (!a->base) {
      fprintf(stderr, "loom-stress: out of memory (%zu bytes)\n", need);
      std::exit(4);
    }
  }
  const size_t front = Alloc::kGuardBytes + a->misalign;
  for (size_t i = 0; i < front; ++i) a->base[i] = std::byte{guard_byte(a->guard, i)};
  std::memset(a->data(), fill, len);
  for (size_t i = 0; i < Alloc::kGuardBytes; ++i) a->data()[len + i] = std::byte{guard_byte(a->guard, front + i)};
  return a;
}

void BufferPool::release(std::byte* base, size_t cap) {
  // Keep a few for reuse; free the rest (a peer's mapping of a freed buffer
  // is dropped later: that path wants exercise too).
  if (free_.size() < 6) {
    free_.push_back({base, cap});
  } else {
    (void)mem_free(base);
  }
}

std::string check_guards(const Alloc& a) {
  const size_t front = Alloc::kGuardBytes + a.misalign;
  for (size_t i = 0; i < front; ++i)
    if (a.base[i] != std::byte{guard_byte(a.guard, i)})
      return fmt::format("guard byte {} before the buffer changed (0x{:02x}, was 0x{:02x})", front - i,
                         static_cast<unsigned>(a.base[i]), guard_byte(a.guard, i));
  for (size_t i = 0; i < Alloc::kGuardBytes; ++i)
    if (a.data()[a.len + i] != std::byte{guard_byte(a.guard, front + i)})
      return fmt::format("guard byte {} past the end of the buffer changed (0x{:02x}, was 0x{:02x})", i,
                         static_cast<unsigned>(a.data()[a.len + i]), guard_byte(a.guard, front + i));
  return "";
}

namespace {

uint64_t hash2(uint64_t a, uint64_t b) {
  Rng r(a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull));
  return r.next();
}

bool is_unsigned(DataType dt) {
  return dt == DataType::kUint8 || dt == DataType::kUint32 || dt == DataType::kUint64;
}

// The largest integer every result of dt holds exactly (and within range).
double exact_limit(DataType dt) {
  switch (dt) {
    case DataType::kInt8: return 127;
    case DataType::kUint8: return 255;
    case DataType::kInt32: return 2147483647.0;
    case DataType::kUint32: return 4294967295.0;
    case DataType::kInt64:
    case DataType::kUint64:
    case DataType::kFloat64: return 9007199254740992.0;  // 2^53: exact in the checker's double too
    case DataType::kFloat32: return 16777216.0;
    case DataType::kFloat16: return 2048;
    case DataType::kBfloat16: return 256;
    case DataType::kFp8E4M3: return 16;
    case DataType::kFp8E5M2: return 8;
  }
  return 0;
}

double hash_value(DataType dt, RedOp op, int nranks, int rank, uint64_t index) {
  const uint64_t b = static_cast<uint64_t>(hash_bound(dt, op, nranks));
  const uint64_t h = hash2(static_cast<uint64_t>(rank) + 1, index);
  if (is_unsigned(dt)) return static_cast<double>(h % (b + 1));
  return static_cast<double>(h % (2 * b + 1)) - static_cast<double>(b);
}

double hash_expected(DataType dt, RedOp op, int nranks, uint64_t index) {
  double acc = hash_value(dt, op, nranks, 0, index);
  for (int r = 1; r < nranks; ++r) {
    const double v = hash_value(dt, op, nranks, r, index);
    acc = op == RedOp::kSum ? acc + v : op == RedOp::kMax ? std::max(acc, v) : std::min(acc, v);
  }
  return acc;
}

}  // namespace

double hash_bound(DataType dt, RedOp op, int nranks) {
  if (op == RedOp::kMax || op == RedOp::kMin) return std::floor(exact_limit(dt));
  if (op != RedOp::kSum || nranks < 1) return 0;
  // Partial sums of up to nranks inputs of magnitude <= b stay within the limit.
  return std::floor(exact_limit(dt) / nranks);
}

void fill_input(std::byte* p, size_t count, DataType dt, RedOp op, Scheme scheme, int rank, int nranks,
                uint64_t index0) {
  switch (scheme) {
    case Scheme::kVerifiable: verifiable::fill(p, count, dt, op, rank, nranks, index0); return;
    case Scheme::kHashBytes: {
      const size_t es = dtype_size(dt);
      for (size_t e = 0; e < count; ++e) {
        const uint64_t h = hash2(static_cast<uint64_t>(rank) + 1, index0 + e);
        std::memcpy(p + e * es, &h, es);  // little-endian: the low es bytes
      }
      return;
    }
    case Scheme::kHashValues:
      for (size_t e = 0; e < count; ++e)
        kernels::store_element(p, e, dt, hash_value(dt, op, nranks, rank, index0 + e));
      return;
  }
}

namespace {
std::string hex(const std::byte* p, size_t n) {
  std::string s = "0x";
  for (size_t i = n; i-- > 0;) s += fmt::format("{:02x}", static_cast<unsigned>(p[i]));
  return s;
}
}  // namespace

std::string check_region(const Region& r) {
  const std::byte* p = r.alloc->data() + r.off;
  switch (r.type) {
    case Region::Type::kFill: {
      size_t wrong = 0, first = 0;
      for (size_t i = 0; i < r.bytes; ++i)
        if (p[i] != std::byte{r.fill} && wrong++ == 0) first = i;
      if (!wrong) return "";
      return fmt::format("byte {}: got 0x{:02x} want 0x{:02x}; {} wrong byte(s) of {}", first,
                         static_cast<unsigned>(p[first]), r.fill, wrong, r.bytes);
    }
    case Region::Type::kCopied: {
      const size_t es = dtype_size(r.dt);
      const size_t count = r.bytes / es;
      thread_local std::vector<std::byte> want;
      want.resize(std::max<size_t>(r.bytes, 1));
      fill_input(want.data(), count, r.dt, r.op, r.scheme, r.src, r.nranks, r.index0);
      if (std::memcmp(p, want.data(), r.bytes) == 0) return "";
      size_t wrong = 0, first = 0;
      for (size_t e = 0; e < count; ++e)
        if (std::memcmp(p + e * es, want.data() + e * es, es) != 0 && wrong++ == 0) first = e;
      // Where the wrong bytes came from, when they are some rank's input
      // elsewhere (a misplaced block): look for them near the expected index.
      std::string origin;
      if (r.scheme == Scheme::kHashBytes && es >= 4) {
        std::vector<std::byte> probe(es);
        for (int src = 0; src < std::max(r.nranks, 1) && origin.empty(); ++src)
          for (int64_t d = -65536; d <= 65536 && origin.empty(); ++d) {
            const int64_t idx = static_cast<int64_t>(r.index0 + first) + d;
            if (idx < 0) continue;
            fill_input(probe.data(), 1, r.dt, r.op, r.scheme, src, r.nranks, static_cast<uint64_t>(idx));
            if (std::memcmp(probe.data(), p + first * es, es) == 0)
              origin = fmt::format(" = rank {}'s element at index {} ({:+d})", src, idx, d);
          }
      }
      return fmt::format("element {} (byte {}): got {}{} want {} (rank {}'s input at index {}, {}); {} wrong element(s) of {}",
                         first, first * es, hex(p + first * es, es), origin, hex(want.data() + first * es, es), r.src,
                         r.index0 + first, scheme_name(r.scheme), wrong, count);
    }
    case Region::Type::kReduced: {
      const size_t es = dtype_size(r.dt);
      const size_t count = r.bytes / es;
      const std::vector<double>* period =
          r.scheme == Scheme::kVerifiable ? &expected_period(r.dt, r.op, r.nranks) : nullptr;
      size_t wrong = 0, first = 0;
      double got0 = 0, want0 = 0;
      for (size_t e = 0; e < count; ++e) {
        const double want = period ? (*period)[(r.index0 + e) % period->size()]
                                   : hash_expected(r.dt, r.op, r.nranks, r.index0 + e);
        const double got = kernels::load_element(p, e, r.dt);
        if (got != want && wrong++ == 0) {
          first = e;
          got0 = got;
          want0 = want;
        }
      }
      if (!wrong) return "";
      return fmt::format("element {} (byte {}): got {} want {} (reduction over {} ranks, index {}, {}); {} wrong element(s) of {}",
                         first, first * es, got0, want0, r.nranks, r.index0 + first, scheme_name(r.scheme), wrong, count);
    }
  }
  return "";
}

}  // namespace loom::stress
