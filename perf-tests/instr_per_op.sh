#!/usr/bin/env bash
# Instructions per operation, per rank, counted by callgrind: a measure of the
# per-op path that the shared machine's noise does not move (timings of a
# sub-microsecond op move 10-20% between runs; these counts move by the
# polling a rank does while it waits, about +-50 per op).
#
# Usage: perf-tests/instr_per_op.sh [-B BUILD] [-n RANKS] [-c COLL] [-s SIZE] [-i ITERS]
#   COLL: allreduce | broadcast | reduce | all_gather | reduce_scatter (default broadcast)
#   Defaults: build, 4 ranks, 8 bytes, 10000 iterations (each runs out of place
#   and in place: 2 x ITERS ops, plus warm-up).
# Prints, per rank, the instructions inclusive of the Comm call (loom::Comm::<coll>)
# divided by the number of calls (taken as 2 x (ITERS + 10 warm-up); the perf
# binary's warm-up schedule may differ by a few calls: < 0.2%). Needs valgrind (apt-get install valgrind).
# Blocking mode (-z 1), as compare.sh runs Loom; LOOM_SPIN_US=0 so that a waiting
# rank sleeps instead of counting polls.
set -euo pipefail
B=build; N=4; COLL=broadcast; SIZE=8; ITERS=10000
while getopts "B:n:c:s:i:h" o; do
  case $o in
    B) B=$OPTARG ;; n) N=$OPTARG ;; c) COLL=$OPTARG ;; s) SIZE=$OPTARG ;; i) ITERS=$OPTARG ;;
    *) sed -n 2,14p "$0"; exit 2 ;;
  esac
done
case $COLL in
  allreduce) PERF=all_reduce_perf ;;
  broadcast|reduce|all_gather|reduce_scatter) PERF=${COLL}_perf ;;
  *) echo "instr_per_op.sh: unknown collective $COLL" >&2; exit 2 ;;
esac
command -v valgrind >/dev/null || { echo "instr_per_op.sh: valgrind not found (apt-get install valgrind)" >&2; exit 2; }
[ -x "$B/bin/$PERF" ] || { echo "instr_per_op.sh: $B/bin/$PERF not built" >&2; exit 2; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
cat > "$OUT/wrap.sh" <<EOF
#!/bin/bash
exec valgrind --tool=callgrind --callgrind-out-file=$OUT/cg.\$LOOM_RANK "\$@"
EOF
chmod +x "$OUT/wrap.sh"
WARM=10
echo "instr_per_op.sh: $COLL $SIZE B on $N ranks, $ITERS iterations under callgrind (takes a minute)" >&2
LOOM_SPIN_US=0 "$B/bin/loomrun" -n "$N" --no-prefix -- "$OUT/wrap.sh" "$B/bin/$PERF" --sizes "$SIZE" \
  -n "$ITERS" -w "$WARM" -z 1 -c 0 > "$OUT/run.log" 2>&1 || { cat "$OUT/run.log" >&2; exit 1; }
CALLS=$(( 2 * (ITERS + WARM) ))
FN="loom::Comm::${COLL}("
echo "rank,instructions_per_op"
for ((r = 0; r < N; ++r)); do
  callgrind_annotate --inclusive=yes "$OUT/cg.$r" 2>/dev/null | grep -F "$FN" | head -1 |
    awk -v r=$r -v calls=$CALLS '{gsub(",", "", $1); printf "%d,%.0f\n", r, $1 / calls}'
done
