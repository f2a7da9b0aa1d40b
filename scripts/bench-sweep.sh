#!/usr/bin/env bash
# bench-sweep.sh: every *_perf binary over one size sweep under loomrun, with
# JSON results and a plot per collective; for a quick look at the whole suite.
#
#   scripts/bench-sweep.sh [-n RANKS] [--build DIR] [--out DIR] [-- extra perf flags]
# Defaults: 2 ranks, build/, -b 8 -e 64M -f 4 -n 20 -w 5 -c 1.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build"; N=2; OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    -n) N="$2"; shift ;;
    --build) BUILD="$(cd "$2" && pwd)"; shift ;;
    --out) OUT="$2"; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "bench-sweep.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
EXTRA=("$@")
[ ${#EXTRA[@]} -eq 0 ] && EXTRA=(-b 8 -e 64M -f 4 -n 20 -w 5 -c 1)
OUT="${OUT:-$BUILD/bench-sweep-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
rc=0
for b in all_reduce reduce_scatter all_gather broadcast reduce alltoall sendrecv hypercube; do
  echo "== ${b}_perf, $N ranks"
  "$BUILD/bin/loomrun" -n "$N" --no-prefix -- "$BUILD/bin/${b}_perf" "${EXTRA[@]}" \
      -J "$OUT/$b.json" --plot "$OUT/$b.png" || rc=1
done
echo "results: $OUT"
exit $rc
