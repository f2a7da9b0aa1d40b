#!/usr/bin/env bash
# Algorithm sweep: runs every algorithm of a collective (forced with LOOM_ALGO)
# across sizes and rank counts, collects the tuner's prediction for each
# (LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=TUNE: "... -> algo (source, predicted X us ...)")
# and the automatic choice (a run without LOOM_ALGO), then prints predicted vs
# measured time, the error, and whether the automatic choice is within 10% of
# the best measured algorithm at every size. Writes CSV + PNG plots (gnuplot).
#
# Usage: perf-tests/algo_sweep.sh [options]
#   -B DIR     build directory (default: build)
#   -c COLL    allreduce | all_gather | reduce_scatter | broadcast | reduce | all_to_all (default allreduce)
#   -r LIST    rank counts, comma separated (default 2,4,8)
#   -b SIZE    smallest size (default 8)      -e SIZE  largest size (default 256M)
#   -f F       size factor (default 4)        -n N     iterations per size (default 10)
#   -w N       warm-up iterations (default 2)
#   -a LIST    algorithms (default: every one registered for COLL)
#   -R N       rounds (default 1): every algorithm runs N times, interleaved
#              (round 1 of all, round 2 of all, ...); each size keeps its
#              fastest round, so a load burst during one run does not decide
#   -x ARGS    extra arguments for the *_perf runs, e.g. -x "-z 1": blocking,
#              one op at a time: the model predicts one op's latency, while
#              back-to-back rooted ops (broadcast, reduce) overlap each other
#   -o DIR     output directory (default: algo-sweep-out)
# Example (quick, small scale): perf-tests/algo_sweep.sh -r 2,4 -e 4M -n 5
set -euo pipefail

BUILD=build COLL=allreduce RANKS=2,4,8 MINB=8 MAXB=256M FACTOR=4 ITERS=10 WARM=2 ALGOS="" OUT=algo-sweep-out ROUNDS=1 EXTRA=""
while getopts "B:c:r:b:e:f:n:w:a:o:R:x:h" opt; do
  case $opt in
    B) BUILD=$OPTARG ;; c) COLL=$OPTARG ;; r) RANKS=$OPTARG ;; b) MINB=$OPTARG ;; e) MAXB=$OPTARG ;;
    f) FACTOR=$OPTARG ;; n) ITERS=$OPTARG ;; w) WARM=$OPTARG ;; a) ALGOS=$OPTARG ;; o) OUT=$OPTARG ;;
    R) ROUNDS=$OPTARG ;; x) EXTRA=$OPTARG ;;
    *) sed -n '2,23p' "$0"; exit 2 ;;
  esac
done

case $COLL in
  allreduce) BIN=all_reduce_perf; DEFAULT="ring,tree,hypercube,rabenseifner,direct,two_shot" ;;
  all_gather) BIN=all_gather_perf; DEFAULT="ring,hypercube,bruck" ;;
  reduce_scatter) BIN=reduce_scatter_perf; DEFAULT="ring,rabenseifner" ;;
  broadcast) BIN=broadcast_perf; DEFAULT="chain,tree,binomial" ;;
  reduce) BIN=reduce_perf; DEFAULT="chain,tree,binomial" ;;
  all_to_all) BIN=alltoall_perf; DEFAULT="direct,pairwise" ;;
  *) echo "unknown collective $COLL" >&2; exit 2 ;;
esac
ALGOS=${ALGOS:-$DEFAULT}
LOOMRUN=$BUILD/bin/loomrun
PERF=$BUILD/bin/$BIN
[[ -x $LOOMRUN && -x $PERF ]] || { echo "build $LOOMRUN and $PERF first" >&2; exit 2; }
mkdir -p "$OUT"

# One run: $1 = ranks, $2 = algorithm or "auto", $3 = round. Leaves
# $OUT/<coll>_n<r>_<algo>[_r<round>].{csv,log} (round 1 has no suffix).
run_one() {
  local n=$1 algo=$2 base="$OUT/${COLL}_n$1_$2"
  [[ ${3:-1} -gt 1 ]] && base+="_r$3"
  local env=(LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=TUNE)
  [[ $algo != auto ]] && env+=("LOOM_ALGO=$COLL:$algo")
  echo "== $COLL n=$n $algo" >&2
  # -c 0: no verification in the timed runs (the tests check correctness).
  local extra=()
  [[ -n $EXTRA ]] && read -r -a extra <<< "$EXTRA"
  if ! env "${env[@]}" "$LOOMRUN" -n "$n" "$PERF" -b "$MINB" -e "$MAXB" -f "$FACTOR" -c 0 -n "$ITERS" -w "$WARM" \
      "${extra[@]}" --csv="$base.csv" > "$base.out" 2> "$base.log"; then
    echo "   failed: see $base.log" >&2
  fi
}

IFS=, read -r -a rank_list <<< "$RANKS"
IFS=, read -r -a algo_list <<< "$ALGOS"
for n in "${rank_list[@]}"; do
  run_one "$n" auto 1  # the automatic choice and the model's predictions
  for ((round = 1; round <= ROUNDS; round++)); do
    for a in "${algo_list[@]}"; do run_one "$n" "$a" "$round"; done
  done
done

# Analysis: predicted vs measured per algorithm, and the automatic choice.
python3 - "$OUT" "$COLL" "$RANKS" "$ALGOS" <<'EOF'
import csv, os, re, sys
out, coll, ranks, algos = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4].split(",")
# loomrun merges the ranks' stderr into stdout with a "[rank]" prefix; the
# engine logs "... rank 0: allreduce 8 B -> tree (LOOM_ALGO, predicted 2.0 us, ...)".
pat = re.compile(r"rank 0: (\S+) (\d+) B -> (\S+) \(([^,]+), predicted (-?[\d.]+) us")
coll_log = coll
# bytes in the TUNE line are per-rank buffer bytes; the perf CSV's size is
# nccl-tests' size: the same for allreduce/broadcast/reduce, nranks x for the others.
def load(n, algo):
    base = os.path.join(out, f"{coll}_n{n}_{algo}")
    meas, pred = {}, {}
    # Every round (base.csv, base_r2.csv, ...): the fastest one per size.
    rounds = [base + ".csv"] + [f"{base}_r{k}.csv" for k in range(2, 1000) if os.path.exists(f"{base}_r{k}.csv")]
    for path in rounds:
        if not os.path.exists(path): continue
        for row in csv.DictReader(open(path)):
            t = float(row["oop_time_us"])
            s = int(row["size"])
            if t > 0 and (s not in meas or t < meas[s]): meas[s] = t
    for ext in (".out", ".log"):
        if not os.path.exists(base + ext): continue
        for line in open(base + ext, errors="replace"):
            m = pat.search(line)
            if m and m.group(1) == coll_log:
                b = int(m.group(2))
                pred.setdefault(b, (m.group(3), m.group(4), float(m.group(5))))
    return meas, pred

def per_rank_bytes(size, n):
    return size if coll in ("allreduce", "broadcast", "reduce") else size // n

summary = []
for n in map(int, ranks):
    data = {a: load(n, a) for a in algos}
    auto_meas, auto_pred = load(n, "auto")
    sizes = sorted(set().union(*[set(m.keys()) for m, _ in data.values()]))
    rows = []
    print(f"\n### {coll}, {n} ranks: measured us (predicted us, error %)")
    print("| size | " + " | ".join(algos) + " | auto choice | best measured | auto/best | ok |")
    print("|" + "---|" * (len(algos) + 5))
    bad = 0
    for s in sizes:
        b = per_rank_bytes(s, n)
        cells, best = [], None
        for a in algos:
            m, p = data[a]
            t = m.get(s)
            pr = p.get(b)
            if t is None or (pr and pr[0] != a):
                # Not run, or LOOM_ALGO could not be honoured (supports() said no).
                cells.append("n/a"); continue
            if best is None or t < best[1]: best = (a, t)
            if pr and pr[1] == "LOOM_ALGO" and pr[2] > 0:
                cells.append(f"{t:.1f} ({pr[2]:.1f}, {100*(pr[2]-t)/t:+.0f}%)")
            else:
                cells.append(f"{t:.1f} (-)")
        choice = auto_pred.get(b, ("?", "", -1))[0]
        if choice in data and data[choice][1].get(b, (choice,))[0] != choice: choice += "?"
        # Compare like with like: the forced run of the chosen algorithm.
        chosen_t = data[choice][0].get(s) if choice in data else None
        ratio = chosen_t / best[1] if (best and chosen_t) else float("nan")
        ok = chosen_t is not None and ratio <= 1.10
        bad += not ok
        print(f"| {s} | " + " | ".join(cells) + f" | {choice} | {best[0] if best else '-'} | {ratio:.2f} | {'yes' if ok else 'NO'} |")
        rows.append((s, {a: data[a][0].get(s) for a in algos}))
    summary.append((n, bad, len(sizes)))
    # busbw-style data for gnuplot: size then one time column per algorithm.
    with open(os.path.join(out, f"{coll}_n{n}.dat"), "w") as f:
        f.write("# size " + " ".join(algos) + "\n")
        for s, ts in rows:
            f.write(f"{s} " + " ".join(f"{ts[a]:.3f}" if ts[a] else "NaN" for a in algos) + "\n")
# Calibration hint from the ring (every rank count): t = 2(p-1) alpha +
# 2(p-1)/p S beta + (p-1)/p S gamma, with gamma kept at the model's 8 GB/s;
# alpha from the smallest size, beta from the largest.
print()
for n in map(int, ranks):
    m, _ = load(n, "ring")
    if len(m) < 2: continue
    s0, s1 = min(m), max(m)
    alpha = m[s0] / (2 * (n - 1))
    gamma = 1 / 8000.0
    beta = (m[s1] - 2 * (n - 1) * alpha - (n - 1) / n * s1 * gamma) / (2 * (n - 1) / n * s1)
    bw = 1 / (beta * 1e3) if beta > 0 else float("nan")
    print(f"ring fit n={n}: LOOM_TUNE_ALPHA_US={alpha:.1f} LOOM_TUNE_BW_GBPS={bw:.2f}")
print()
for n, bad, total in summary:
    print(f"{coll} n={n}: automatic choice within 10% of the best at {total-bad}/{total} sizes")
EOF

# Plots: algorithm bandwidth (size / time) vs size, one PNG per rank count.
if command -v gnuplot > /dev/null; then
  for n in "${rank_list[@]}"; do
    dat="$OUT/${COLL}_n$n.dat"
    [[ -s $dat ]] || continue
    plot=""
    i=2
    for a in "${algo_list[@]}"; do
      plot+="${plot:+, }'$dat' using 1:(\$1/\$$i/1e3) with linespoints title '$a'"
      i=$((i + 1))
    done
    gnuplot <<EOF
set terminal png size 900,600 noenhanced
set output '$OUT/${COLL}_n$n.png'
set logscale x 2
set logscale y 10
set format x '%.0b%B'
set xlabel 'size (bytes)'
set ylabel 'algbw (GB/s) = size / time'
set title '$COLL, $n ranks (LOOM_ALGO forced per line)'
set key left top
plot $plot
EOF
  done
  echo "plots: $OUT/${COLL}_n*.png" >&2
fi
