// Closed-form inputs and expected outputs shared by tests and perf-tests.
#pragma once

#include <cstddef>
#include <string>

#include "loom/types.h"

namespace loom::verifiable {

// Input element `index` of rank `rank` of `nranks`. Values are small integers
// chosen so that every reduction over up to 24 ranks is exact in every data
// type (including fp8 and every partial sum along any reduction order); the
// average of floating types takes multiples of nranks (see verifiable.cc).
double input_value(int rank, size_t index, DataType dt, RedOp op, int nranks);
// Closed-form result of reducing input_value over nranks ranks at `index`,
// already rounded to dt. avg: NCCL's, a sum of inputs pre-multiplied by
// T(1/n) for fp16 / bf16 / fp8, one division at the end for the others.
double expected_value(size_t index, DataType dt, RedOp op, int nranks);

void fill(void* buf, size_t count, DataType dt, RedOp op, int rank, int nranks, size_t index_offset = 0);
// Number of elements of buf that differ from expected(index_offset + i); the
// first difference is described in *first.
size_t count_wrong_reduced(const void* buf, size_t count, DataType dt, RedOp op, int nranks, size_t index_offset,
                           std::string* first);
// Number of elements that differ from input_value(rank, index_offset + i).
size_t count_wrong_copied(const void* buf, size_t count, DataType dt, RedOp op, int rank, size_t index_offset,
                          std::string* first);

}  // namespace loom::verifiable
