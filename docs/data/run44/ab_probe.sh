#!/bin/bash
# A/B: LOOM_TUNE_PROBE_ALGOS=0 vs 1, alternating, out-of-place/in-place us per size
cd "$(dirname "$0")/../../.."  # the repository root
NP=${NP:-8}; SIZES=${SIZES:-8,64,256,1K,4K,16K,64K,256K,1M}; R=${R:-3}
for r in $(seq $R); do
  echo "# round $r $(date +%T) c2c $(build/bin/mem_bench --latency 2>/dev/null | tail -1)"
  for p in 0 1; do
    LOOM_TUNE_PROBE_ALGOS=$p timeout 300 build/bin/loomrun --no-prefix --bind core -n $NP build/bin/all_reduce_perf --sizes $SIZES -n 500 -w 50 -z 1 --csv 2>/dev/null | awk -F, -v p=$p 'NR>1{printf "probe=%s %8s %8s %8s\n", p, $3, $8, $12}'
  done
done
