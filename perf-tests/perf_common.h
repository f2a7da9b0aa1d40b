// nccl-tests-compatible benchmark driver shared by every *_perf binary:
// nccl-tests' flags, table and footer, algbw/busbw formulas, decimal GB/s,
// closed-form verifiable data; plus Loom's flags (perf_options.h). Ranks come
// from loomrun / torchrun / Slurm variables, or from MPI under mpirun.
#pragma once

#include "loom/types.h"
#include "perf_options.h"

namespace loom::perf {

// Runs the benchmark with argv; returns the process exit code (0 = every
// value verified and every output written).
int perf_main(int argc, char** argv, Bench bench);
int perf_main(int argc, char** argv, Collective coll);

}  // namespace loom::perf
