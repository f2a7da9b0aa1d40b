#!/usr/bin/env bash
# stores.sh ROUNDS SIZES: 2-rank allreduce, LOOM_SHM_STREAM_STORES auto / 0 / 1, and Open MPI; us
R=${1:-3} S=${2:-1M,4M,16M} B=${B:-build}
for ((i = 1; i <= R; i++)); do
  echo "# round $i $(date +%T) c2c: $($B/bin/mem_bench --latency 2>/dev/null | tail -1)"
  for c in auto 0 1; do
    printf "%-6s " $c
    LOOM_SHM_STREAM_STORES=$c $B/bin/loomrun -n 2 -- $B/bin/all_reduce_perf --sizes $S -n ${N:-60} -w 5 -c 0 2>/dev/null | awk '/^\[0\] +[0-9]+ /{printf "%s %s/%s  ", $2, $7, $11} END{print ""}'
  done
  printf "%-6s " ompi
  mpirun --allow-run-as-root -np 2 --bind-to core $B/bin/mpi_bench -c allreduce -s $S -n ${N:-60} -w 5 2>/dev/null | awk -F, '$1=="mpi"{printf "%s %s  ", $4, $6} END{print ""}'
done
