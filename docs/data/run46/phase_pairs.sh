#!/usr/bin/env bash
# Run 46: Loom against Open MPI, 2-rank allreduce, in back-to-back pairs, each
# pair bracketed by the core-to-core round trip (mem_bench --latency) before,
# between and after: a pair whose three readings agree on the host's phase
# compares the libraries in that phase, however briefly it lasts.
# Usage: [SIZES=8,64,4K,4M] [ITERS=2000] [WARMUP=100] [ALTERNATE=1] docs/data/run46/phase_pairs.sh [SECONDS] [BUILD]
#   (from the repository root; WARMUP: warm-up calls for both libraries, Run 47)
# Prints: rt_before rt_between rt_after, then per size loom_us ompi_us.
set -uo pipefail
T=${1:-600} B=${2:-build} S=${SIZES:-8,64,4K,4M} N=${ITERS:-2000} W=${WARMUP:-100}
rt() { "$B/bin/mem_bench" --latency 2>/dev/null | awk -F, 'NR == 2 { print int($2) }'; }
end=$(( $(date +%s) + T ))
# The two runs of a pair alternate their order: the run after Loom's found
# a slower machine for a moment at 16 MiB (Open MPI 4.1-4.8 ms per call
# there, 3.2-3.8 ms on its own), so which one goes first is printed too.
loom() { "$B/bin/loomrun" -n 2 --no-prefix --bind core "$B/bin/all_reduce_perf" --sizes $S -n $N -w $W -z 1 -c 0 --csv 2>/dev/null |
         awk -F, 'NR > 1 { printf "%s:%s ", $3, $8 }'; }
ompi() { mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to core:overload-allowed -np 2 "$B/bin/mpi_bench" \
           -c allreduce -s $S -n $N -w $W -l ompi 2>/dev/null | awk -F, '$1 == "ompi" { printf "%s:%s ", $4, $6 }'; }
k=0
while [ "$(date +%s)" -lt "$end" ]; do
  a=$(rt)
  if [ "${ALTERNATE:-0}" = 1 ] && [ $((k % 2)) = 1 ]; then first=ompi; o=$(ompi); b=$(rt); l=$(loom)
  else first=loom; l=$(loom); b=$(rt); o=$(ompi); fi
  c=$(rt)
  k=$((k + 1))
  echo "rt $a $b $c | loom $l| ompi $o| first $first"
done
