#!/bin/bash
# A record of how Run 26 measured (docs/performance.md): base is a build of the previous HEAD
# (0587594, whole halves) in /tmp/base; new is this build (256 KiB slices from 4 MiB).
# Per round: base, new, Open MPI; 2-rank allreduce, -z 1, us (out of place, in place).
S=${S:-4M,16M,64M,256M}
for r in $(seq 1 ${R:-3}); do
  echo "== round $r"
  LD_LIBRARY_PATH=/tmp/base/build/lib ./build/bin/loomrun -n 2 --no-prefix -- /tmp/base/build/bin/all_reduce_perf --sizes $S -n 10 -w 2 -z 1 -c 0 --csv 2>/dev/null | awk -F, 'NR>1{print "base", $3, $8, $12}'
  ./build/bin/loomrun -n 2 --no-prefix -- ./build/bin/all_reduce_perf --sizes $S -n 10 -w 2 -z 1 -c 0 --csv 2>/dev/null | awk -F, 'NR>1{print "new ", $3, $8, $12}'
  mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to core -np 2 ./build/bin/mpi_bench -c allreduce -s $S -n 10 -w 2 2>/dev/null | awk -F, 'NR>1{print "ompi", $4, $6}'
done
