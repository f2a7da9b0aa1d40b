// nccl-tests-compatible benchmark driver shared by every *_perf binary:
// same flags (-b -e -f -i -n -w -c -d -o -r -z), same table and footer, same
// algbw/busbw formulas, decimal GB/s, closed-form verifiable data.
#pragma once

#include "loom/types.h"

namespace loom::perf {

// Runs the benchmark for `coll` with argv; returns the process exit code.
int perf_main(int argc, char** argv, Collective coll);

}  // namespace loom::perf
