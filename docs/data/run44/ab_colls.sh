#!/bin/bash
# A/B: LOOM_TUNE_PROBE_ALGOS=0 vs 1 (and Open MPI), alternating; out-of-place us per size
cd "$(dirname "$0")/../../.."  # the repository root
NP=${NP:-8}; SIZES=${SIZES:-256,4K,64K}; R=${R:-3}
for r in $(seq $R); do
  echo "# round $r $(date +%T) c2c $(build/bin/mem_bench --latency 2>/dev/null | tail -1)"
  for c in all_gather reduce_scatter; do
    for p in 0 1; do
      LOOM_TUNE_PROBE_ALGOS=$p timeout 300 build/bin/loomrun --no-prefix --bind core -n $NP build/bin/${c}_perf --sizes $SIZES -n 500 -w 50 -z 1 -c 0 --csv 2>/dev/null | awk -F, -v p=$p -v c=$c 'NR>1{printf "%-14s probe=%s %8s %8s\n", c, p, $3, $8}'
    done
    timeout 300 mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to core:overload-allowed -np $NP build/bin/mpi_bench -c $c -s $SIZES -n 500 -w 50 -l ompi 2>/dev/null | awk -F, -v c=$c 'NR>1{printf "%-14s ompi    %8s %8s\n", c, $4, $6}'
  done
done
