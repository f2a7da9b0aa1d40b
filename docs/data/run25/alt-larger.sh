#!/bin/bash
# A record of how Run 25 measured (docs/performance.md): base is a build of the previous HEAD in /tmp/base.
run() { # label dir n perf sizes iters
  local lib=""; [ $2 = base ] && lib=/tmp/base/build/lib
  local bin=/work/main/build/bin; [ $2 = base ] && bin=/tmp/base/build/bin
  LD_LIBRARY_PATH=$lib ./build/bin/loomrun -n $3 -- $bin/$4 --sizes $5 -n $6 -w 20 -c 0 -z 1 2>&1 | grep -E "^\[0\] +[0-9]+ " | awk -v l="$1 $2 n=$3" '{print l, $2, $7, $11}'
}
for r in 1 2; do
 for b in base new; do
  run ar $b 2 all_reduce_perf 1M,16M 50
  run bc $b 2 broadcast_perf 1M,16M 50
  run rs $b 2 reduce_scatter_perf 1M 50
  run ar $b 4 all_reduce_perf 8,64K,1M 200
  run ar $b 8 all_reduce_perf 8,64K 200
 done
done
