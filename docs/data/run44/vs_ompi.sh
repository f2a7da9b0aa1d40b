#!/bin/bash
# Loom (probe on) vs Open MPI, alternating, 8 ranks, small allreduce
cd "$(dirname "$0")/../../.."  # the repository root
NP=${NP:-8}; SIZES=${SIZES:-8,64,256,1K,4K}; R=${R:-3}; COLL=${COLL:-allreduce}; PERF=${PERF:-all_reduce_perf}
for r in $(seq $R); do
  echo "# round $r $(date +%T) c2c $(build/bin/mem_bench --latency 2>/dev/null | tail -1)"
  timeout 300 build/bin/loomrun --no-prefix --bind core -n $NP build/bin/$PERF --sizes $SIZES -n 500 -w 50 -z 1 --csv 2>/dev/null | awk -F, '$1!="collective"{printf "loom %8s %8s %8s\n", $3, $8, $12}'
  timeout 300 mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to core:overload-allowed -np $NP build/bin/mpi_bench -c $COLL -s $SIZES -n 500 -w 50 -l ompi 2>/dev/null | awk -F, 'NR>1{printf "ompi %8s %8s\n", $4, $6}'
done
