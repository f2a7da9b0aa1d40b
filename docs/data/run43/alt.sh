#!/usr/bin/env bash
# alt.sh ROUNDS SIZES 'ENV=..,ENV2=..' ... : alternate env configurations, 2-rank allreduce, us out/in
R=$1 S=$2; shift 2
B=${B:-build}
for ((i = 1; i <= R; i++)); do
  for c in "$@"; do
    envs=(); [ "$c" != def ] && IFS=, read -ra envs <<< "$c"
    printf "%-40s " "$c"
    env "${envs[@]}" $B/bin/loomrun -n 2 -- $B/bin/all_reduce_perf --sizes $S -n ${N:-40} -w 5 -c 0 2>/dev/null | awk '/^\[0\] +[0-9]+ /{printf "%s %s/%s  ", $2, $7, $11} END{print ""}'
  done
done
