#!/bin/bash
# Run 41: the pipelined binomial broadcast (FIFO) against the staged direct
# broadcast, in one process (broadcast_perf --ab: alternating blocks on two
# communicators), ranks bound round-robin to the cores, blocking calls as
# compare.sh times them. LOOM_LLC_BYTES=1 makes the direct broadcast stage at
# every rank count from LOOM_SHM_ANNOUNCED_MIN_BYTES (128K), in or out of
# the cache. B/A < 1: staging is faster.
# usage (from the build directory): bash ../docs/data/run41/broadcast-ab.sh [REPS]
reps=${1:-2}
for n in 3 4 6 8 16; do
  sizes=64K,256K,1M,2M,4M,8M
  [ "$n" = 16 ] && sizes=256K,1M,2M
  for rep in $(seq "$reps"); do
    printf "ranks %2s rep %s:" "$n" "$rep"
    LOOM_LLC_BYTES=1 ./bin/loomrun --no-prefix --bind core -n "$n" ./bin/broadcast_perf -z 1 -A binomial \
        --ab direct --sizes "$sizes" -n 200 -w 5 -c 0 2>&1 | grep "A/B  " |
      sed -E 's/.*A\/B +([0-9]+) +A [a-z]+ ([0-9.]+) us +B direct ([0-9.]+) us +B\/A ([0-9.]+).*/ \1: \2 \/ \3 = \4;/' | tr -d '\n'
    echo
  done
done
