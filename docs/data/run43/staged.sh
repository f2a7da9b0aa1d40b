#!/usr/bin/env bash
# Run 43: staged copies into scratch (direct broadcast / all_gather with ranks sharing cores),
# LOOM_SHM_STREAM_STORES auto / 0 / 1 and Open MPI, us per op (Loom: out of place / in place).
# Usage: docs/data/run43/staged.sh ROUNDS NP COLL SIZES
R=$1 NP=$2 C=$3 S=$4 B=${B:-build} N=${N:-20}
for ((i = 1; i <= R; i++)); do
  echo "# round $i $(date +%T) c2c min,median ns: $($B/bin/mem_bench --latency 2>/dev/null | tail -1 | cut -d, -f2-)"
  for c in auto 0 1; do
    printf "%-6s " $c
    LOOM_SHM_STREAM_STORES=$c $B/bin/loomrun -n $NP -- $B/bin/${C}_perf --sizes $S -n $N -w 3 -c 0 2>/dev/null |
      awk '/^\[0\] +[0-9]+ /{printf "%s %s/%s  ", $2, $7, $11} END{print ""}'
  done
  printf "%-6s " ompi
  mpirun --allow-run-as-root --oversubscribe -np $NP --bind-to core:overload-allowed $B/bin/mpi_bench -c $C -s $S -n $N -w 3 2>/dev/null |
    awk -F, '$1=="mpi"{printf "%s %s  ", $4, $6} END{print ""}'
done
