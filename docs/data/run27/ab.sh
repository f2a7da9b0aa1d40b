#!/bin/bash
# usage: ab.sh ROUNDS P PERF SIZES ; alternates the tuner's default against LOOM_CHUNK_BYTES=1G (whole blocks)
# Prints, per round, SIZE:out-of-place-us/in-place-us for the tuner's choice (new) and for the same choice in whole blocks (whole).
cd "$(dirname "$0")/../../.."  # the repository root
R=$1; p=$2; PERF=$3; S=$4
for r in $(seq 1 $R); do for v in new whole; do
  E=; [ $v = whole ] && E=LOOM_CHUNK_BYTES=1G
  out=$(env $E timeout 900 ./build/bin/loomrun -n $p -- ./build/bin/$PERF --sizes $S -n 4 -w 1 -z 1 2>&1 | grep -E '^\[0\]\s+[0-9]' | awk '{printf "%s:%s/%s%s ", $2, $7, $11, ($10=="0"&&$14=="0")?"":"WRONG"}')
  echo "r$r p$p $PERF $v $out"
done; done
