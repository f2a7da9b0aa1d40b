#!/bin/bash
# lat.sh ROUNDS: alternate presend on / off (LOOM_PRESEND_OFF_AB, a knob of presend.patch only) and Open MPI, 2 ranks, 8 B - 4 KiB
cd "$(dirname "$0")/../../.."  # the repository root
for r in $(seq 1 $1); do
  for m in on off; do
    E=; [ $m = off ] && E=LOOM_PRESEND_OFF_AB=1
    echo "r$r $m $(env $E ./build/bin/loomrun -n 2 -- ./build/bin/all_reduce_perf --sizes 8,64,256,1K,4K -n 100000 -w 1000 -z 1 -c 0 2>&1 | grep -E '^\[0\] +[0-9]' | awk '{printf "%s:%s/%s ", $2, $7, $11}')"
  done
  echo "r$r ompi $(mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to core -np 2 ./build/bin/mpi_bench -c allreduce -s 8,64,256,1024,4096 -n 100000 -w 1000 2>&1 | grep '^mpi' | awk -F, '{printf "%s:%s ", $4, $6}')"
done
