#!/bin/bash
# ab3.sh ROUNDS "DIRS": alternate builds; 2 ranks allreduce, out-of-place/in-place us
for r in $(seq 1 $1); do
  for D in $2; do
    echo "r$r $(basename $D) $(cd $D && ./build/bin/loomrun -n 2 -- ./build/bin/all_reduce_perf --sizes 8,64,256,1K,4K -n 100000 -w 1000 -z 1 -c 0 2>&1 | grep -E '^\[0\] +[0-9]' | awk '{printf "%s:%s/%s ", $2, $7, $11}')"
  done
done
