#!/bin/bash
# knob.sh ROUNDS "ENV1|ENV2|..." : alternate env settings, 2 ranks allreduce 8 B/64 B, plus Open MPI
cd "$(dirname "$0")/../../.."  # the repository root
IFS='|' read -ra MODES <<< "$2"
for r in $(seq 1 $1); do
  for m in "${MODES[@]}"; do
    echo "r$r [$m] $(env $m ./build/bin/loomrun -n 2 -- ./build/bin/all_reduce_perf --sizes 8,64 -n 100000 -w 1000 -z 1 -c 0 2>&1 | grep -E '^\[0\] +[0-9]' | awk '{printf "%s:%s ", $2, $7}')"
  done
  echo "r$r ompi $(mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to core -np 2 ./build/bin/mpi_bench -c allreduce -s 8,64 -n 100000 -w 1000 2>&1 | grep '^mpi' | awk -F, '{printf "%s:%s ", $4, $6}')"
done
