#!/bin/bash
# ab.sh ROUNDS: alternate a base checkout (BASE=dir, built; here 1f530fe) / this one, and Open MPI; 2 ranks allreduce, out-of-place us
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
for r in $(seq 1 $1); do
  for b in base new; do
    D=$BASE; [ $b = new ] && D=$ROOT
    echo "r$r $b $(cd $D && ./build/bin/loomrun -n 2 -- ./build/bin/all_reduce_perf --sizes 8,64,256,1K,4K -n 100000 -w 1000 -z 1 -c 0 2>&1 | grep -E '^\[0\] +[0-9]' | awk '{printf "%s:%s ", $2, $7}')"
  done
  echo "r$r ompi $(cd $ROOT && mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to core -np 2 ./build/bin/mpi_bench -c allreduce -s 8,64,256,1024,4096 -n 100000 -w 1000 2>&1 | grep '^mpi' | awk -F, '{printf "%s:%s ", $4, $6}')"
done
