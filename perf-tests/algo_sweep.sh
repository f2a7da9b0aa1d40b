#!/usr/bin/env bash
# Algorithm sweep: runs every algorithm of a collective (forced with LOOM_ALGO)
# across sizes and rank counts, collects the tuner's prediction for each
# (LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=TUNE: "... -> algo (source, predicted X us ...)")
# and the automatic choice (a run without LOOM_ALGO), then prints predicted vs
# measured time, the error, and whether the automatic choice is within 10% of
# the best measured algorithm at every size. Writes CSV + PNG plots of busbw vs size (gnuplot).
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
#   -C N       confirmation rounds (default 5, 0 = none): every size where the
#              automatic choice measured more than 10% slower than the best is
#              measured again, the chosen and the best algorithm only, N times,
#              with enough iterations for ~20 ms of timing per run, the size
#              given twice (the first pass is a warm-up). Out of place each
#              round is one process timing both (--ab: 20 alternating blocks,
#              so a change of the host's pace hits both alike); in place (-I)
#              separate runs, interleaved. The verdict is taken from these
#              fastest-of-N times, and the table shows both ratios
#   -K         confirm every judged size, not only the misses (the verdict
#              then comes from the confirmation runs everywhere)
#   -N         no runs: analyze (and plot) what -o DIR already holds
#   -x ARGS    extra arguments for the *_perf runs, e.g. -x "-z 1": blocking,
#              one op at a time: the model predicts one op's latency, while
#              back-to-back rooted ops (broadcast, reduce) overlap each other
#   -I         judge the in-place column instead of the out-of-place one (the
#              same runs time both; the tuner may choose differently in place)
#   -o DIR     output directory (default: algo-sweep-out)
# Example (quick, small scale): perf-tests/algo_sweep.sh -r 2,4 -e 4M -n 5
set -euo pipefail

BUILD=build COLL=allreduce RANKS=2,4,8 MINB=8 MAXB=256M FACTOR=4 ITERS=10 WARM=2 ALGOS="" OUT=algo-sweep-out ROUNDS=1 EXTRA=""
CONFIRM=5 ANALYZE_ONLY=0 PLACE=oop CONFIRM_ALL=0
while getopts "B:c:r:b:e:f:n:w:a:o:R:C:NKx:Ih" opt; do
  case $opt in
    B) BUILD=$OPTARG ;; c) COLL=$OPTARG ;; r) RANKS=$OPTARG ;; b) MINB=$OPTARG ;; e) MAXB=$OPTARG ;;
    f) FACTOR=$OPTARG ;; n) ITERS=$OPTARG ;; w) WARM=$OPTARG ;; a) ALGOS=$OPTARG ;; o) OUT=$OPTARG ;;
    R) ROUNDS=$OPTARG ;; C) CONFIRM=$OPTARG ;; N) ANALYZE_ONLY=1 ;; x) EXTRA=$OPTARG ;; I) PLACE=ip ;;
    K) CONFIRM_ALL=1 ;;
    *) sed -n '2,36p' "$0"; exit 2 ;;
  esac
done

case $COLL in
  allreduce) BIN=all_reduce_perf; DEFAULT="ring,tree,hypercube,rabenseifner,direct,two_shot" ;;
  all_gather) BIN=all_gather_perf; DEFAULT="ring,hypercube,bruck" ;;
  reduce_scatter) BIN=reduce_scatter_perf; DEFAULT="ring,rabenseifner" ;;
  broadcast) BIN=broadcast_perf; DEFAULT="chain,tree,binomial,direct" ;;
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
(( ANALYZE_ONLY )) || for n in "${rank_list[@]}"; do
  run_one "$n" auto 1  # the automatic choice and the model's predictions
  for ((round = 1; round <= ROUNDS; round++)); do
    for a in "${algo_list[@]}"; do run_one "$n" "$a" "$round"; done
  done
done

# Analysis: predicted vs measured per algorithm, and the automatic choice.
# $1 = misses: list the sizes where the choice is more than 10% off the best
# ("n size choice best best_us" per line); $1 = report: the tables, with the
# confirmation runs' verdict where there are any.
analyze() {
python3 - "$OUT" "$COLL" "$RANKS" "$ALGOS" "$1" "$PLACE" "$CONFIRM_ALL" <<'EOF'
import collections, csv, os, re, sys
out, coll, ranks, algos, mode, place = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4].split(","), sys.argv[5], sys.argv[6]
confirm_all = sys.argv[7] == "1"
# Confirmation runs: (n, size, algo) -> fastest time over the rounds, and the rounds.
confirm, confirm_rounds = {}, collections.Counter()
cpath = os.path.join(out, "confirm.csv")
if mode == "report" and os.path.exists(cpath):
    for r in csv.reader(open(cpath)):
        if len(r) != 5 or not r[4]: continue
        key, t = (int(r[0]), int(r[1]), r[2]), float(r[4])
        confirm_rounds[key] += 1
        if t > 0 and (key not in confirm or t < confirm[key]): confirm[key] = t
# loomrun merges the ranks' stderr into stdout with a "[rank]" prefix; the
# engine logs "... rank 0: allreduce 8 B -> tree (LOOM_ALGO, predicted 2.0 us, ...)".
# An in-place call's line says so ("... 65536 B in place -> ..."): -I reads those.
pat = re.compile(r"rank 0: (\S+) (\d+) B" + (" in place" if place == "ip" else "") +
                 r" -> (\S+) \(([^,]+), predicted (-?[\d.]+) us")
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
            t = float(row[place + "_time_us"])
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
    if mode == "report":
        print(f"\n### {coll}, {n} ranks: measured us (predicted us, error %)")
        print("| size | " + " | ".join(algos) + " | auto choice | best measured | auto/best | confirmed | ok |")
        print("|" + "---|" * (len(algos) + 6))
    bad = empty = 0
    for s in sizes:
        b = per_rank_bytes(s, n)
        if b < 4:
            # Less than one float per rank: every algorithm runs the same
            # empty schedule (no message), so there is no choice to judge.
            empty += 1
            if mode == "report":
                print(f"| {s} | " + " | ".join("-" for _ in algos) + " | - | - | - | - | 0 elements per rank, not judged |")
            continue
        cells, best, honoured = [], None, {}
        for a in algos:
            m, p = data[a]
            t = m.get(s)
            pr = p.get(b)
            if t is None or (pr and pr[0] != a):
                # Not run, or LOOM_ALGO could not be honoured (supports() said no).
                cells.append("n/a"); continue
            honoured[a] = t
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
        if mode == "misses":
            if (not ok or confirm_all) and chosen_t is not None: print(n, s, choice, best[0], f"{best[1]:.3f}")
            continue
        # A miss measured again (-C): the chosen and the best algorithm,
        # interleaved; the verdict is theirs (the sweep's ratio stays shown).
        confirmed = "-"
        cc, cb = confirm.get((n, s, choice)), confirm.get((n, s, best[0] if best else ""))
        if (not ok or confirm_all) and cc and cb:
            cratio = cc / cb
            confirmed = f"{cratio:.2f} ({cc:.1f} vs {cb:.1f} us, {confirm_rounds[(n, s, choice)]} rounds)"
            ok = cratio <= 1.10
        bad += not ok
        print(f"| {s} | " + " | ".join(cells) + f" | {choice} | {best[0] if best else '-'} | {ratio:.2f} | {confirmed} | {'yes' if ok else 'NO'} |")
        # The plot shows only what each algorithm ran itself: an n/a cell
        # (another algorithm ran in its place) is a gap, not that one's time.
        rows.append((s, {a: honoured.get(a) for a in algos}))
    if mode == "misses": continue
    summary.append((n, bad, len(sizes) - empty))
    # busbw-style data for gnuplot: size then one time column per algorithm.
    with open(os.path.join(out, f"{coll}_n{n}.dat"), "w") as f:
        f.write("# size " + " ".join(algos) + "\n")
        for s, ts in rows:
            f.write(f"{s} " + " ".join(f"{ts[a]:.3f}" if ts[a] else "NaN" for a in algos) + "\n")
if mode == "misses": sys.exit(0)
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
    if not (bw > 0): print(f"ring fit n={n}: no bandwidth fit (the largest size is latency-bound)"); continue
    print(f"ring fit n={n}: LOOM_TUNE_ALPHA_US={alpha:.3g} LOOM_TUNE_BW_GBPS={bw:.3g}")
print()
for n, bad, total in summary:
    print(f"{coll} n={n}: automatic choice within 10% of the best at {total-bad}/{total} sizes")
EOF
}

# Confirmation: a 10% verdict on one run of a few hundred microseconds is at
# the mercy of one preemption (a 0.7 us op timed 100 times measures 1.5 us
# once in a while). Each miss is measured again before it counts.
(( ANALYZE_ONLY )) || : > "$OUT/confirm.csv"
if (( CONFIRM > 0 && ! ANALYZE_ONLY )); then
  analyze misses > "$OUT/misses.txt"
  extra=()
  [[ -n $EXTRA ]] && read -r -a extra <<< "$EXTRA"
  while read -r n s choice best tbest; do
    [[ $choice == *"?" ]] && continue
    iters=$(python3 -c "print(max(20, min(20000, int(20000 / max($tbest, 0.1)))))")
    echo "== confirming $COLL n=$n size $s: $choice against $best, $CONFIRM rounds of $iters iterations" >&2
    for ((round = 1; round <= CONFIRM; round++)); do
      if [[ $PLACE == oop ]]; then
        # "#  A/B  SIZE  A chain 3.525 us  B binomial 2.341 us  B/A 0.664", the
        # second (warm) pass; the names are what each communicator ran.
        line=$("$LOOMRUN" -n "$n" "$PERF" -A "$choice" --ab "$best" --ab-blocks 20 --sizes "$s,$s" -c 0 -n "$iters" \
                 -w "$WARM" "${extra[@]}" 2>> "$OUT/confirm.log" < /dev/null | grep "A/B  *[0-9]" | tail -1) \
          || { echo "   failed: see $OUT/confirm.log" >&2; continue; }
        read -r ra ta rb tb <<< "$(awk '{for (i = 1; i < NF; i++) { if ($i == "A") print_a = $(i+1) " " $(i+2); if ($i == "B") print_b = $(i+1) " " $(i+2) } } END {print print_a, print_b}' <<< "$line")"
        if [[ $ra != "$choice" || $rb != "$best" ]]; then
          echo "   --ab ran '$ra' / '$rb', not $choice / $best: round not counted" >&2
          continue
        fi
        echo "$n,$s,$choice,$round,$ta" >> "$OUT/confirm.csv"
        echo "$n,$s,$best,$round,$tb" >> "$OUT/confirm.csv"
        continue
      fi
      for a in "$choice" "$best"; do
        csvf="$OUT/confirm_last.csv"
        rm -f "$csvf"
        env "LOOM_ALGO=$COLL:$a" "$LOOMRUN" -n "$n" "$PERF" --sizes "$s,$s" -c 0 -n "$iters" -w "$WARM" \
            "${extra[@]}" --csv="$csvf" > /dev/null 2>> "$OUT/confirm.log" < /dev/null \
          || { echo "   failed: see $OUT/confirm.log" >&2; continue; }
        # The second row: the first pass over the size is a warm-up.
        t=$(awk -F, -v col=$([[ $PLACE == ip ]] && echo 12 || echo 8) 'NR > 1 {t = $col} END {print t}' "$csvf")
        echo "$n,$s,$a,$round,$t" >> "$OUT/confirm.csv"
      done
    done
  done < "$OUT/misses.txt"
fi
analyze report

# Plots: bus bandwidth vs size, one PNG per rank count. busbw is nccl-tests'
# (size / time) x the collective's factor: 2(n-1)/n for allreduce, (n-1)/n
# for reduce_scatter, all_gather and all_to_all, 1 for broadcast and reduce.
if command -v gnuplot > /dev/null; then
  for n in "${rank_list[@]}"; do
    dat="$OUT/${COLL}_n$n.dat"
    [[ -s $dat ]] || continue
    case $COLL in
      allreduce) factor="2.0*($n-1)/$n" ;;
      reduce_scatter | all_gather | all_to_all) factor="($n-1.0)/$n" ;;
      *) factor="1.0" ;;
    esac
    plot=""
    i=2
    for a in "${algo_list[@]}"; do
      plot+="${plot:+, }'$dat' using 1:(\$1/\$$i/1e3*$factor) with linespoints title '$a'"
      i=$((i + 1))
    done
    gnuplot <<EOF
set terminal png size 900,600 noenhanced
set output '$OUT/${COLL}_n$n.png'
set logscale x 2
set logscale y 10
set format x '%.0b%B'
set xlabel 'size (bytes)'
set ylabel 'busbw (GB/s) = size / time x $factor'
set title '$COLL, $n ranks (LOOM_ALGO forced per line)'
set key left top
plot $plot
EOF
  done
  echo "plots: $OUT/${COLL}_n*.png" >&2
fi
