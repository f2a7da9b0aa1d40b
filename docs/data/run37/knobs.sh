#!/bin/bash
# knobs.sh ROUNDS: 2 ranks 8/64/256 B allreduce, alternated: Loom as built, without fingerprints,
# without the flight recorder, without both, and Open MPI. Loom: us out of place / in place;
# Open MPI: us. Ranks pinned alike (loomrun --bind core, mpirun --bind-to core).
cd "$(dirname "$0")/../../.."  # the repository root
S=8,64,256
run() { echo "$1 $(env $2 build/bin/loomrun -n 2 --bind core -- build/bin/all_reduce_perf --sizes $S -n 100000 -w 1000 -z 1 -c 0 2>&1 | grep -E '^\[0\] +[0-9]' | awk '{printf "%s:%s/%s ", $2, $7, $11}')"; }
for r in $(seq 1 "$1"); do
  run "r$r loom" X=1
  run "r$r nofp" LOOM_FINGERPRINT=0
  run "r$r norec" LOOM_TRACE_BUFFER_SIZE=0
  run "r$r nodiag" "LOOM_FINGERPRINT=0 LOOM_TRACE_BUFFER_SIZE=0"
  echo "r$r ompi $(mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to core -np 2 ./build/bin/mpi_bench -c allreduce -s $S -n 100000 -w 1000 2>&1 | grep '^mpi' | awk -F, '{printf "%s:%s ", $4, $6}')"
done
