#!/usr/bin/env bash
# Run 42: 2-rank allreduce latency, Loom against Open MPI and MPICH, rounds
# alternating (us per op; Loom: out-of-place / in-place).
# Usage: docs/data/run42/latency.sh [ROUNDS] [BUILD]   (from the repository root)
set -euo pipefail
R=${1:-5} B=${2:-build} S=8,64,256,1K,4K
for ((i = 1; i <= R; i++)); do
  echo "# round $i"
  "$B/bin/loomrun" -n 2 -- "$B/bin/all_reduce_perf" --sizes $S -n 100000 -w 1000 -c 0 -z 1 2>/dev/null |
    awk '/^\[0\] +[0-9]+ /{printf "loom %s %s/%s\n", $2, $7, $11}'
  mpirun --allow-run-as-root -np 2 --bind-to core "$B/bin/mpi_bench" -c allreduce -s $S -n 100000 -w 1000 2>/dev/null |
    awk -F, '$1=="mpi"{printf "openmpi %s %s\n", $4, $6}'
  mpirun.mpich -np 2 -bind-to core "$B/bin/mpi_bench_mpich" -c allreduce -s $S -n 100000 -w 1000 2>/dev/null |
    awk -F, '$1=="mpi"{printf "mpich %s %s\n", $4, $6}'
done
