#!/usr/bin/env bash
# The long loom-stress soak (not part of `ctest`): runs of RUN_SECONDS each with
# a new seed, 2-8 ranks, over shared memory and TCP sockets, with each
# algorithm forced by LOOM_ALGO and transport settings moved to their edges
# (small FIFOs, no slots, single copy everywhere, tiny chunks, ...), until
# MINUTES have passed. Every rank gets the same environment.
#
#   scripts/soak.sh [minutes]        (default 30; needs build/ from scripts/build.sh)
#   RUN_SECONDS=60 SEED0=1000 LOGDIR=/tmp/soak STOP_ON_FAIL=1 scripts/soak.sh 10
#   SOAK_RANKS="6 8 12 16" SOAK_EXTRA_ENV="LOOM_SHM_SLOTS=0" scripts/soak.sh 20
#
# A failing run's log is kept in LOGDIR with its environment and replay line;
# the script exits non-zero when any run failed or a /dev/shm segment was left.
set -uo pipefail
# The whole script is one command list, read before it runs: editing or
# rebuilding while a soak runs cannot change what this one executes.
{
cd "$(dirname "$0")/.."
MINUTES=${1:-30}
RUN_SECONDS=${RUN_SECONDS:-45}
SEED0=${SEED0:-$(( $(date +%s) % 100000 * 100 ))}
LOGDIR=${LOGDIR:-/tmp/loom-soak.$$}
STOP_ON_FAIL=${STOP_ON_FAIL:-0}
BIN=build/bin
[[ -x $BIN/loom-stress && -x $BIN/loomrun ]] || { echo "soak.sh: build first (scripts/build.sh)" >&2; exit 2; }
mkdir -p "$LOGDIR"

read -r -a RANKS <<<"${SOAK_RANKS:-2 3 4 5 6 8 2 3 4}"
# Each collective's algorithms (src/algorithms/algorithms.cc), several per
# spec; "" = the tuner's choice. A forced algorithm that cannot serve a call
# falls back to the tuner with a warning.
ALGOS=(
  ""
  "allreduce:ring;reduce_scatter:ring;all_gather:ring;broadcast:chain;reduce:chain;all_to_all:direct"
  "allreduce:tree;reduce_scatter:rabenseifner;all_gather:hypercube;broadcast:tree;reduce:tree;all_to_all:pairwise"
  "allreduce:hypercube;all_gather:bruck;broadcast:binomial;reduce:binomial"
  "allreduce:rabenseifner;all_gather:direct;broadcast:direct"
  "allreduce:direct"
  "allreduce:two_shot"
  "allreduce:0-4K:hypercube,4K-64K:tree,64K-:rabenseifner;broadcast:0-8K:direct,8K-:binomial"
)
# Transport settings at their edges (one set per run).
SHM_KNOBS=(
  ""
  "LOOM_SHM_SLOTS=0"
  "LOOM_SHM_SINGLE_COPY_BYTES=4K LOOM_SHM_SINGLE_COPY_PLAIN_BYTES=4K"
  "LOOM_SHM_FIFO_BYTES=12K LOOM_SHM_FIFO_STEP_BYTES=4K"
  "LOOM_SHM_FIFO_BYTES=4100"
  "LOOM_CHUNK_BYTES=4K"
  "LOOM_SHM_MAP_SHARED=0"
  "LOOM_SHM_ANNOUNCED_MIN_BYTES=4K"
  "LOOM_MAX_QUEUED_OPS=2 LOOM_FINGERPRINT=0"
  "LOOM_SPIN=0 LOOM_SPIN_US=0 LOOM_ENGINE_SPIN_US=50"
  "LOOM_SHM_SHARED_COPY=0 LOOM_SHM_SINGLE_COPY_BYTES=64K"
)
SOCK_KNOBS=(
  ""
  "LOOM_SOCKET_NSOCKS=1 LOOM_SOCKET_NTHREADS=1"
  "LOOM_SOCKET_NSOCKS=4 LOOM_SOCKET_SLICE_BYTES=4K"
  "LOOM_SOCKET_BUF_BYTES=64K LOOM_SOCKET_DIRECT_BYTES=4K"
  "LOOM_SOCKET_DIRECT_BYTES=0"
)

end=$(( $(date +%s) + ${MINUTES%.*} * 60 ))
i=0; runs=0; failed=0
echo "soak: ${MINUTES} min, ${RUN_SECONDS} s per run, seeds from $SEED0, logs in $LOGDIR"
while (( $(date +%s) < end )); do
  seed=$(( SEED0 + i ))
  n=${RANKS[$(( i % ${#RANKS[@]} ))]}
  algo=${ALGOS[$(( (i / 2) % ${#ALGOS[@]} ))]}
  if (( i % 4 == 3 )); then
    transport=socket
    knobs=${SOCK_KNOBS[$(( (i / 4) % ${#SOCK_KNOBS[@]} ))]}
  else
    transport=shm
    knobs=${SHM_KNOBS[$(( (i / 3) % ${#SHM_KNOBS[@]} ))]}
  fi
  # Large buffers now and then; mostly the sizes up to 1 MiB where the paths change.
  maxb=1M; (( i % 5 == 4 )) && maxb=4M
  left=$(( end - $(date +%s) )); secs=$(( left < RUN_SECONDS ? (left > 5 ? left : 5) : RUN_SECONDS ))
  envs=(LOOM_TRANSPORT=$transport LOOM_SOCKET_IFNAME=lo LOOM_TIMEOUT=120 $knobs ${SOAK_EXTRA_ENV:-})
  [[ -n $algo ]] && envs+=("LOOM_ALGO=$algo")
  # One run in seven: the ranks as threads of one process (Comm::init_all:
  # single copy between threads, shared mappings); one in five (of the
  # rest) on fake hosts (LOOM_HOST_ID per rank: shm inside, TCP between,
  # hierarchical allreduce).
  launch=($BIN/loomrun -n "$n" -- $BIN/loom-stress); mode=procs
  if (( i % 7 == 5 )); then
    launch=($BIN/loom-stress --threads "$n"); mode=threads
  elif (( i % 5 == 2 )) && [[ $transport == shm ]]; then
    hosts=$(( i % 2 ? 2 : 3 )); (( i % 3 == 0 )) && hosts=mod2
    launch=($BIN/loomrun -n "$n" -- $BIN/loom-stress --fake-hosts $hosts); mode=hosts:$hosts; transport=auto
    envs=(LOOM_SOCKET_IFNAME=lo LOOM_TIMEOUT=120 $knobs ${SOAK_EXTRA_ENV:-})
    algo_h=("$algo" "allreduce:hierarchical")
    algo=${algo_h[$(( i % 2 ))]}
    [[ -n $algo ]] && envs+=("LOOM_ALGO=$algo")
  fi
  log=$LOGDIR/run-$seed.log
  printf 'soak: seed %s  %d %-7s %-6s %-60s %s\n' "$seed" "$n" "$mode" "$transport" "$knobs" "${algo:-(tuner)}"
  { echo "env: ${envs[*]}"; echo "cmd: ${launch[*]} --seed $seed --seconds $secs --max-bytes $maxb"; } >"$log"
  timeout $(( secs + 300 )) env "${envs[@]}" LOOM_DEBUG=WARN \
    "${launch[@]}" --seed "$seed" --seconds "$secs" --max-bytes "$maxb" --progress 0 >>"$log" 2>&1
  rc=$?
  runs=$(( runs + 1 ))
  if (( rc != 0 )); then
    failed=$(( failed + 1 ))
    echo "soak: FAILED (exit $rc): $log"
    grep -m3 -E "FAIL|reproduce" "$log" | sed 's/^/    /'
    (( STOP_ON_FAIL )) && break
  else
    grep -m1 "PASS" "$log" | sed 's/^/    /'
    rm -f "$log"
  fi
  i=$(( i + 1 ))
done
left_segments=$(ls /dev/shm 2>/dev/null | grep -c '^loom-' || true)
echo "soak: $runs runs, $failed failed; /dev/shm loom-* segments now: $left_segments (logs: $LOGDIR)"
(( failed == 0 && left_segments == 0 ))
exit
}
