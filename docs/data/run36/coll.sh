#!/bin/bash
# usage: [PERF=broadcast] coll.sh ROUNDS NRANKS SIZES [extra loom variants as "label:ENV=..;-A x"]...
cd /work/main
R=$1; N=$2; S=$3; shift 3
B=./build/bin
export LOOM_SOCKET_IFNAME=lo
for r in $(seq $R); do
  mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to core:overload-allowed -np $N $B/mpi_bench -c ${PERF:-all_gather} -s $S -n 30 -w 3 -l ompi 2>/dev/null | grep "^ompi" | awk -F, -v r=$r '{printf "r%s ompi %s %s\n", r, $4, $6}'
  for v in "$@"; do
    lab=${v%%:*}; rest=${v#*:}; envs=${rest%%;*}; args=${rest#*;}
    env $envs $B/loomrun --no-prefix --bind core -n $N $B/${PERF:-all_gather}_perf --sizes $S -z 1 -n 30 -w 3 --csv $args 2>/dev/null | grep "^${PERF:-all_gather}" | awk -F, -v r=$r -v l=$lab '{printf "r%s %s %s %s %s\n", r, l, $3, $8, $12}'
  done
done
