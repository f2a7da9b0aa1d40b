#!/bin/bash
# knobs.sh ROUNDS: 2 ranks 8/64/256 B allreduce: the session's base build, this build, this build without
# fingerprints / flight recorder / both, Open MPI. us out of place / in place.
cd "$(dirname "$0")/../../.."  # the repository root
S=8,64,256
run() { echo "$1 $(env $2 $3/build/bin/loomrun -n 2 -- $3/build/bin/all_reduce_perf --sizes $S -n 100000 -w 1000 -z 1 -c 0 2>&1 | grep -E '^\[0\] +[0-9]' | awk '{printf "%s:%s/%s ", $2, $7, $11}')"; }
for r in $(seq 1 $1); do
  run "r$r base" X=1 ${BASE:?BASE=the root of a second checkout, built}
  run "r$r new" X=1 /work/main
  run "r$r nofp" LOOM_FINGERPRINT=0 /work/main
  run "r$r norec" LOOM_TRACE_BUFFER_SIZE=0 /work/main
  run "r$r nodiag" "LOOM_FINGERPRINT=0 LOOM_TRACE_BUFFER_SIZE=0" /work/main
  echo "r$r ompi $(mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to core -np 2 ./build/bin/mpi_bench -c allreduce -s $S -n 100000 -w 1000 2>&1 | grep '^mpi' | awk -F, '{printf "%s:%s ", $4, $6}')"
done
