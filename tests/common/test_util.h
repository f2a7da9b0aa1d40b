// Helpers shared by Loom's tests: closed-form inputs and expected outputs
// (nccl-tests "verifiable" style: no reference rank), and a collective case
// runner used by the thread, process and netns matrices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/comm.h"

namespace loom::testing {

// Input element `index` of rank `rank`. Values are small integers chosen so
// that every reduction over up to 24 ranks is exact in every data type
// (including fp8 and every partial sum along any reduction order).
double input_value(int rank, size_t index, DataType dt, RedOp op);
// Closed-form result of reducing input_value over nranks ranks at `index`,
// already rounded to dt (avg: one division at the end, as Loom does).
double expected_value(size_t index, DataType dt, RedOp op, int nranks);

void fill(void* buf, size_t count, DataType dt, RedOp op, int rank, size_t index_offset = 0);
// Number of elements of buf that differ from expected(index_offset + i); the
// first difference is described in *first.
size_t count_wrong_reduced(const void* buf, size_t count, DataType dt, RedOp op, int nranks, size_t index_offset,
                           std::string* first);
// Number of elements that differ from input_value(rank, index_offset + i).
size_t count_wrong_copied(const void* buf, size_t count, DataType dt, RedOp op, int rank, size_t index_offset,
                          std::string* first);

struct Case {
  Collective coll = Collective::kAllReduce;
  DataType dt = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  size_t count = 0;
  bool in_place = false;
  int root = 0;
  std::string name() const;
};

// Runs one case on this rank of comm (every rank must run the same case) and
// checks the result in closed form. Returns an error naming the first wrong
// element, or ok.
Status run_case(Comm& comm, const Case& c);

// The correctness matrix of the foundation issue: every collective x dtype x op
// x count x in/out-of-place. `big` is the 1M+3 count; see the .cc for which
// cases run at that size.
std::vector<Case> correctness_matrix(int nranks, bool include_big);

}  // namespace loom::testing
