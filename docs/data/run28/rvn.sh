#!/bin/bash
# usage: rvn.sh ROUNDS "PLIST" SIZES ITERS VARIANT... ; VARIANT = ALGO[:ENV=VAL], ALGO auto = the tuner's choice
# As run27/rv.sh with the iteration count given (-n ITERS -w 3): per round and variant, SIZE:out-of-place-us/in-place-us.
cd "$(dirname "$0")/../../.."  # the repository root
R=$1; PL=$2; S=$3; N=$4; shift 4
for r in $(seq 1 $R); do for p in $PL; do for v in "$@"; do
  A=${v%%:*}; E=; [[ $v == *:* ]] && E=${v#*:}
  out=$(env $E timeout 900 ./build/bin/loomrun -n $p -- ./build/bin/${PERF:-all_reduce_perf} $([ "$A" = auto ] || echo "-A $A") --sizes $S -n $N -w 3 -z 1 2>&1 | grep -E '^\[0\]\s+[0-9]' | awk '{printf "%s:%s/%s%s ", $2, $7, $11, ($10=="0"&&$14=="0")?"":"WRONG"}')
  echo "r$r p$p $v $out"
done; done; done
