#!/bin/bash
# usage: rv.sh ROUNDS "PLIST" SIZES VARIANT... ; VARIANT = ALGO[:ENV=VAL]
# Prints, per round and variant, SIZE:out-of-place-us/in-place-us (WRONG if a result failed its check); PERF=reduce_scatter_perf for reduce_scatter; ALGO auto = the tuner's choice.
cd "$(dirname "$0")/../../.."  # the repository root
R=$1; PL=$2; S=$3; shift 3
for r in $(seq 1 $R); do for p in $PL; do for v in "$@"; do
  A=${v%%:*}; E=; [[ $v == *:* ]] && E=${v#*:}
  out=$(env $E timeout 900 ./build/bin/loomrun -n $p -- ./build/bin/${PERF:-all_reduce_perf} $([ "$A" = auto ] || echo "-A $A") --sizes $S -n 4 -w 1 -z 1 2>&1 | grep -E '^\[0\]\s+[0-9]' | awk '{printf "%s:%s/%s%s ", $2, $7, $11, ($10=="0"&&$14=="0")?"":"WRONG"}')
  echo "r$r p$p $v $out"
done; done; done
