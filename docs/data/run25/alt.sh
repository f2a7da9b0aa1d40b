#!/bin/bash
# A record of how Run 25 measured (docs/performance.md): base is a build of the previous HEAD in /tmp/base.
# alternate: base loom, new loom, Open MPI; 8..4K allreduce 2 ranks
S=${S:-8,64,256,1K,4K}
for r in $(seq 1 ${R:-3}); do
  echo "== round $r"
  LD_LIBRARY_PATH=/tmp/base/build/lib ./build/bin/loomrun -n 2 -- /tmp/base/build/bin/all_reduce_perf --sizes $S -n 100000 -w 1000 -c 0 -z 1 2>&1 | grep -E "^\[0\] +[0-9]+ " | awk '{print "base", $2, $7, $11}'
  ./build/bin/loomrun -n 2 -- ./build/bin/all_reduce_perf --sizes $S -n 100000 -w 1000 -c 0 -z 1 2>&1 | grep -E "^\[0\] +[0-9]+ " | awk '{print "new ", $2, $7, $11}'
  mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to core -np 2 ./build/bin/mpi_bench -c allreduce -s $S -n 100000 -w 1000 2>&1 | grep "^mpi" | awk -F, '{print "ompi", $4, $6}'
done
