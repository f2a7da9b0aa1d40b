#!/usr/bin/env bash
# Interleaved A/B of Loom configurations: every configuration runs once per
# round, rounds alternate (round 1 of all, round 2 of all, ...), and the
# fastest out-of-place time per (configuration, size) is kept, so a burst of
# load during one run does not decide.
#
# Usage: perf-tests/interleave.sh [-B build] [-R rounds] [-n ranks] [-i iters] [-I] [-x "perf args"] COLL SIZES CONFIG...
#   -I       keep the in-place time instead of the out-of-place one
#   COLL     all_reduce | reduce_scatter | all_gather | broadcast | reduce | alltoall | sendrecv
#   SIZES    comma list (256K,1M,4M)
#   CONFIG   ALGO[+fifo][+memalloc]: ALGO is auto or a name for -A; +fifo sets
#            LOOM_SHM_SINGLE_COPY_BYTES=0 and LOOM_SHM_SINGLE_COPY_PLAIN_BYTES=0
#            (every message through the FIFO); +memalloc runs with -R 1;
#            +NAME=VALUE sets that environment variable (+LOOM_SHM_FIFO_STEP_BYTES=64K).
# Example: perf-tests/interleave.sh -R 3 all_reduce 1M,4M ring ring+fifo
# Prints: config size min_us and every round's time.
set -euo pipefail
BUILD=build ROUNDS=3 NR=2 ITERS=20 EXTRA="" COL=8
while getopts "B:R:n:i:x:Ih" o; do
  case $o in
    B) BUILD=$OPTARG ;; R) ROUNDS=$OPTARG ;; n) NR=$OPTARG ;; i) ITERS=$OPTARG ;; x) EXTRA=$OPTARG ;; I) COL=12 ;;
    *) sed -n '2,17p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[[ $# -ge 3 ]] || { sed -n '2,17p' "$0"; exit 2; }
COLL=$1 SIZES=$2; shift 2
PERF=$BUILD/bin/${COLL}_perf
[[ -x $PERF && -x $BUILD/bin/loomrun ]] || { echo "build $PERF first" >&2; exit 2; }
out=$(mktemp); err=$(mktemp); one=$(mktemp); trap 'rm -f "$out" "$err" "$one"' EXIT
for ((i = 1; i <= ROUNDS; i++)); do
  for c in "$@"; do
    algo=${c%%+*} envs=() args=()
    [[ $c == *+fifo* ]] && envs=(LOOM_SHM_SINGLE_COPY_BYTES=0 LOOM_SHM_SINGLE_COPY_PLAIN_BYTES=0)
    [[ $c == *+memalloc* ]] && args+=(-R 1)
    IFS=+ read -ra parts <<< "$c"
    for p in "${parts[@]:1}"; do [[ $p == *=* ]] && envs+=("$p"); done
    [[ $algo != auto ]] && args+=(-A "$algo")
    # A failed run (a wrong result, a bad option) is reported and skipped;
    # under set -e it ended the script without a word.
    # shellcheck disable=SC2086
    if ! env "${envs[@]}" "$BUILD/bin/loomrun" -n "$NR" -- "$PERF" "${args[@]}" $EXTRA --sizes "$SIZES" -n "$ITERS" -w 5 \
        --csv 2>"$err" | awk -F, -v c="$c" -v col="$COL" '$3 + 0 > 0 && $1 ~ /^\[0\]/ {print c, $3, $col}' > "$one"; then
      echo "interleave.sh: $c (round $i) failed, not counted: $(tail -n 3 "$err" | tr '\n' ' ')" >&2
    else
      cat "$one" >> "$out"
    fi
  done
done
awk '{k = $1 " " $2; if (!(k in m) || $3 < m[k]) m[k] = $3; s[k] = s[k] " " $3}
     END {for (k in m) print k, m[k], "|" s[k]}' "$out" | sort -k2,2n -k3,3n
