#!/usr/bin/env bash
# Run 43: 2 ranks, the build before this run (BEFORE, f4409df built in a git
# worktree) against HEAD and Open MPI, alternating, us per op (Loom: out of
# place / in place). Each round starts with the core-to-core round trip
# (mem_bench --latency: ~96 ns when the host keeps the vCPUs on one L3,
# ~490 ns when it keeps them apart).
# Usage: [NP=ranks] docs/data/run43/before-after.sh ROUNDS BEFORE_BUILD [SIZES] [COLLS]
set -euo pipefail
R=$1 OLD=$2 S=${3:-1M,4M,16M} C=${4:-all_reduce} B=build N=${N:-40} NP=${NP:-2}
for ((i = 1; i <= R; i++)); do
  echo "# round $i $(date +%T) c2c min,median ns: $($B/bin/mem_bench --latency 2>/dev/null | tail -1 | cut -d, -f2-)"
  for coll in $C; do
    for side in before after; do
      bin=$B; [ $side = before ] && bin=$OLD
      printf "%-15s %-6s " $coll $side
      "$bin/bin/loomrun" -n $NP -- "$bin/bin/${coll}_perf" --sizes $S -n $N -w 5 -c 0 2>/dev/null |
        awk '/^\[0\] +[0-9]+ /{printf "%s %s/%s  ", $2, $7, $11} END{print ""}'
    done
    m=$coll; [ $coll = all_reduce ] && m=allreduce
    printf "%-15s %-6s " $coll ompi
    mpirun --allow-run-as-root --oversubscribe -np $NP --bind-to core:overload-allowed "$B/bin/mpi_bench" -c $m -s $S -n $N -w 5 2>/dev/null |
      awk -F, '$1=="mpi"{printf "%s %s  ", $4, $6} END{print ""}'
  done
done
