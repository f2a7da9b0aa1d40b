// hypercube_perf: nccl-tests' hypercube pattern (an all-gather built from
// log2(n) grouped send/recv exchanges with rank ^ mask); power-of-two ranks.
#include "perf_common.h"

int main(int argc, char** argv) { return loom::perf::perf_main(argc, argv, loom::perf::Bench::kHypercube); }
