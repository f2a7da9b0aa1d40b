#!/usr/bin/env bash
# ab_short.sh ROUNDS: Executor::run_short off (LOOM_SHORT_PATH=0) against on,
# alternating, 4 and 8 ranks on 2 cores, -z 1, us out of place / in place,
# nccl-tests' average over ranks. (ab-short.txt was taken with the same
# switch under a temporary name, TMP_SHORT_OFF=1, before it became a setting.)
R=${1:-3}
B=${B:-build}
echo "# $(date -u +%FT%TZ) core-to-core round trip: $($B/bin/mem_bench --latency | tail -1)"
for ((i = 1; i <= R; i++)); do
  for c in LOOM_SHORT_PATH=0 on; do
    for n in 4 8; do
      for coll in broadcast reduce all_reduce; do
        printf "%-16s n=%d %-10s " "$c" $n $coll
        env $([ $c != on ] && echo $c) $B/bin/loomrun -n $n -- $B/bin/${coll}_perf --sizes 8,64,1K,2K -n 3000 -w 20 -z 1 -c 0 --csv 2>/dev/null |
          awk -F, '/^\[0\] [a-z_]+,/{printf "%s:%s/%s ", $3, $8, $12} END{print ""}'
      done
    done
  done
done
echo "# $(date -u +%FT%TZ) core-to-core round trip: $($B/bin/mem_bench --latency | tail -1)"
