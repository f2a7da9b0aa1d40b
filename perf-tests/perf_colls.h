// Per-benchmark rules of the perf suite: buffer shapes and in-place layout,
// nccl-tests' algbw/busbw formulas (doc/PERFORMANCE.md), issuing one
// operation, and closed-form verification.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/comm.h"
#include "perf_options.h"

namespace loom::perf {

struct Shape {
  size_t send_count = 0;  // elements of the send buffer
  size_t recv_count = 0;  // elements of the receive buffer
  size_t count = 0;       // the per-call count argument (nccl-tests' "count" column)
  size_t size_bytes = 0;  // nccl-tests' "size" column
  // algbw = algbw_bytes / time; busbw = algbw * bus_factor.
  double algbw_bytes = 0;
  double bus_factor = 1;
};

Shape shape_for(Bench b, size_t bytes, size_t elem_size, int nranks);
// The per-rank block of a collective of `total` elements in n blocks:
// total/n rounded down to a multiple of 16 bytes (nccl-tests).
size_t block_count(size_t total, size_t elem_size, int nranks);

// Send and receive pointers of one call, in place or not, following NCCL's
// layout (reduce_scatter: send = recv - rank*count; all_gather and
// hypercube: send = recv + rank*count).
struct Buffers {
  std::byte* send;
  std::byte* recv;
};
Buffers buffers_for(Bench b, std::byte* send, std::byte* recv, const Shape& s, size_t elem_size, int rank,
                    bool in_place);

// --fresh: rewrites the call's input (send_count elements at buf.send) before
// call number `iter`, with a byte that changes every call and decodes to a
// normal number in every floating type (0x30-0x37), so sums stay finite and
// no denormal slows a reduction.
void freshen_input(const Buffers& buf, const Shape& s, size_t elem_size, int iter);

// State kept between calls of one sweep (hypercube's local copy must not
// overwrite a block an earlier iteration is still sending).
struct IssueState {
  Work last;
};

// Issues one operation. Inside a group (-m > 1) the returned Work is invalid;
// the group's Work comes from group_end.
Result<Work> issue(Comm& comm, Bench b, const Buffers& buf, const Shape& s, const Options& o, IssueState* st);

// Fills this rank's input(s) for a verification run.
void fill_inputs(Bench b, const Buffers& buf, const Shape& s, const Options& o, int rank, int nranks);
// Elements of this rank's output that differ from the closed-form result;
// *first describes the first one.
size_t count_wrong(Bench b, const Buffers& buf, const Shape& s, const Options& o, int rank, int nranks,
                   std::string* first);

}  // namespace loom::perf
