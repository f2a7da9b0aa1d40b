// alltoall_perf: nccl-tests-compatible benchmark (see perf_common.h).
#include "perf_common.h"

int main(int argc, char** argv) { return loom::perf::perf_main(argc, argv, loom::Collective::kAllToAll); }
