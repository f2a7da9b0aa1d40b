#!/usr/bin/env bash
# compare.sh: Loom against Open MPI, MPICH and Gloo on this machine, in one run.
#
#   perf-tests/compare.sh [--quick] [--build DIR] [--ranks "2 4 8"]
#                         [--colls "allreduce reduce_scatter all_gather broadcast"]
#                         [--out DIR] [--timeout SECONDS] [--loom-launcher loomrun|mpirun]
#                         [--loom-nonblocking] [--rounds N] [--fresh] [--mem-alloc] [--thp]
#                         [--bind core|none]
#
# For every collective and rank count (ranks beyond the cores are
# oversubscribed) it runs the same size sweep with
#   Loom     loomrun -n N <coll>_perf --csv -z 1     (build/bin)
#   Open MPI mpirun --allow-run-as-root --oversubscribe -np N mpi_bench
#   MPICH    mpirun.mpich -np N mpi_bench_mpich      (if mpicc.mpich was found)
#   Gloo     loomrun -n N gloo_bench (TCP, every Gloo algorithm; the best counts)
# then measures memcpy and 2-input reduce bandwidth (mem_bench) and prints,
# per collective and rank count, busbw (or time for sizes < 64 KiB) per
# library, the ratio Loom / best MPI, and for 2-rank allreduce the memory
# model (each rank reduces half, then copies the peer's half). From 64 KiB
# every table also shows the copy bound: the busbw at which the cores would do
# nothing but the copies and reductions the collective cannot avoid, at the
# memcpy, reduce, cross-process and cross-core copy rates mem_bench measured in the same
# run, cycling through as much memory as the collective touches per call
# (mem_bench --footprints); and whether the perf issue's target ratio lies
# above it.
# Raw CSV, a markdown summary and a plot land in --out (default
# build/compare-<date>). A missing peer is reported and skipped.
# --loom-launcher mpirun starts Loom's ranks with Open MPI's mpirun instead.
# --bind core (default) pins every library's rank r to CPU r mod cores alike:
# loomrun --bind core (Loom, Gloo), Open MPI --bind-to core:overload-allowed,
# MPICH -bind-to core (left to themselves, Open MPI pins only when the ranks
# fit the cores and MPICH never). --bind none leaves every rank to the kernel.
# Loom runs blocking (-z 1, nccl-tests' flag: each op is waited for before the
# next is issued), as the peers' MPI_Allreduce & co and Gloo's run() return only
# when done; --loom-nonblocking issues them back to back and waits for the last.
# --fresh rewrites every input before each timed call (Loom's --fresh, mpi_bench
# -f), as a training step does, and times the calls alone; nccl-tests' loop
# reuses one unchanged input, which flatters single-copy reads. Gloo's
# benchmark has no such mode and is left out then.
# --rounds N runs the whole set N times, interleaved (round 1 of every library,
# then round 2, ...), and keeps each library's best round per size: with ranks
# oversubscribed one run of a small size moves 1.2-2x between runs, for the
# peers as for Loom, and one load burst then decides a ratio. Odd rounds run
# Loom first, even rounds the peers first (a run can find the machine slower
# right after another's: Open MPI's 16 MiB allreduce 4.1-4.8 ms after Loom's,
# 3.2-3.8 alone, Run 46), and the tables add "per round": the median, over the
# rounds, of the ratio of each round's own rows (raw.csv's round column), next
# to best-of-rounds, which favours whichever library spreads wider.
# --mem-alloc also runs Loom with its buffers from loom::mem_alloc (-R 1, as
# ncclMemAlloc gives them: peers map them instead of reading them with
# process_vm_readv), as a second Loom column "loom-ma" with its own ratio. The
# MPIs' buffers are ordinary memory either way.
# --thp gives Loom's and both MPIs' buffers transparent huge pages (Loom's
# --thp, mpi_bench -H): a single-copy read then pins one page per 2 MiB
# instead of 512. Gloo's benchmark has no such mode and is left out then.
# The summary's header records the core-to-core round trip (mem_bench
# --latency) at the start and the end of the run: the host's phase. Every
# library's run is bracketed by one more reading each side (raw.csv's
# rt_before_ns, rt_after_ns); when the run saw both phases, the tables star a
# ratio whose two rows came from different phases and add each phase's own.
# The summary alone can be recomputed from a raw.csv: --summarize DIR.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build"
RANKS="2 4 8"
COLLS="allreduce reduce_scatter all_gather broadcast"
QUICK=0
OUT=""
TIMEOUT=900
LAUNCHER=loomrun
SUMMARIZE=""
LOOM_MODE=(-z 1)
ROUNDS=1
FRESH=0
MEM_ALLOC=0
THP=0
BIND=core
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --build) BUILD="$(cd "$2" && pwd)"; shift ;;
    --ranks) RANKS="$2"; shift ;;
    --colls) COLLS="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --timeout) TIMEOUT="$2"; shift ;;
    --loom-launcher) LAUNCHER="$2"; shift ;;
    --summarize) SUMMARIZE="$2"; shift ;;
    --loom-nonblocking) LOOM_MODE=() ;;
    --rounds) ROUNDS="$2"; shift ;;
    --fresh) FRESH=1 ;;
    --mem-alloc) MEM_ALLOC=1 ;;
    --thp) THP=1 ;;
    --bind) BIND="$2"; shift ;;
    -h|--help) sed -n '2,56p' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
BIN="$BUILD/bin"
case "$BIND" in
  core) OMPI_BIND=(--bind-to core:overload-allowed); MPICH_BIND=(-bind-to core) ;;
  none) OMPI_BIND=(--bind-to none); MPICH_BIND=(-bind-to none) ;;
  *) echo "compare.sh: --bind core|none, not '$BIND'" >&2; exit 2 ;;
esac
[ -n "$SUMMARIZE" ] && OUT="$SUMMARIZE"
OUT="${OUT:-$BUILD/compare-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
RAW="$OUT/raw.csv"
LOG="$OUT/log.txt"
if [ -n "$SUMMARIZE" ]; then
  [ -s "$RAW" ] || { echo "compare.sh: no $RAW to summarize" >&2; exit 2; }
  # The measuring run's header (host, peers, modes, round trips) stays.
  header=""
  [ -f "$OUT/summary.md" ] && header="$(awk '/^# / { if ($0 !~ /^# summary recomputed/) print; next } { exit }' "$OUT/summary.md")"
  { [ -n "$header" ] && echo "$header"; echo "# summary recomputed from $RAW"; } > "$OUT/summary.md"
else
: > "$LOG"

# Small sizes are latency-bound: many iterations; large ones bandwidth-bound.
if [ "$QUICK" = 1 ]; then
  SMALL="8,4K,64K"; LARGE="1M,4M"
  SMALL_ITERS=(-n 50 -w 5); LARGE_ITERS=(-n 5 -w 1)
else
  SMALL="8,4K,64K,1M"; LARGE="4M,16M,64M,256M"
  SMALL_ITERS=(-n 200 -w 20); LARGE_ITERS=(-n 10 -w 2)
fi

declare -A PERF=([allreduce]=all_reduce_perf [reduce_scatter]=reduce_scatter_perf
                 [all_gather]=all_gather_perf [broadcast]=broadcast_perf)
for b in loomrun mem_bench "${PERF[@]}"; do
  [ -x "$BIN/$b" ] || { echo "compare.sh: $BIN/$b missing: build first (ninja -C $BUILD)" >&2; exit 2; }
done
HAVE_OMPI=0; HAVE_MPICH=0; HAVE_GLOO=0
[ -x "$BIN/mpi_bench" ] && command -v mpirun.openmpi >/dev/null && HAVE_OMPI=1
[ -x "$BIN/mpi_bench_mpich" ] && command -v mpirun.mpich >/dev/null && HAVE_MPICH=1
[ -x "$BIN/gloo_bench" ] && HAVE_GLOO=1
MPI_OPTS=()
if [ "$FRESH" = 1 ]; then
  [ "${LOOM_MODE[*]}" = "-z 1" ] || { echo "compare.sh: --fresh needs blocking Loom runs (drop --loom-nonblocking)" >&2; exit 2; }
  LOOM_MODE+=(--fresh)
  MPI_OPTS=(-f)
  HAVE_GLOO=0  # gloo_bench has no fresh-input mode
fi
echo "# compare.sh on $(hostname): $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/summary.md"
echo "# peers: Open MPI=$HAVE_OMPI MPICH=$HAVE_MPICH Gloo=$HAVE_GLOO; quick=$QUICK; rounds=$ROUNDS (best kept$([ "$ROUNDS" -gt 1 ] && echo "; even rounds run the peers before Loom"))" | tee -a "$OUT/summary.md"
echo "# Loom launched by $LAUNCHER; ranks bound: $BIND (every library alike)" | tee -a "$OUT/summary.md"
LOOM_THP=()
if [ "$THP" = 1 ]; then
  LOOM_THP=(--thp)
  MPI_OPTS+=(-H)
  HAVE_GLOO=0  # gloo_bench has no huge-page mode
  echo "# transparent huge pages for Loom's and the MPIs' buffers (--thp, mpi_bench -H); Gloo left out" | tee -a "$OUT/summary.md"
fi
[ "$MEM_ALLOC" = 1 ] && echo "# loom-ma: Loom with its buffers from loom::mem_alloc (-R 1); the peers' buffers are ordinary memory" | tee -a "$OUT/summary.md"
[ "$FRESH" = 1 ] && echo "# fresh inputs: every input rewritten before each timed call (--fresh); Gloo left out" | tee -a "$OUT/summary.md"
# The core-to-core round trip (mem_bench --latency) at the start and the end:
# on a shared host it moves with the host's load (here 8 B latencies ~2x with it),
# so a run says which phase it measured in.
round_trip() { "$BIN/mem_bench" --latency 2>> "$LOG" | awk -F, 'NR == 2 { printf "%s ns min, %s ns median of 9 batches (CPUs %s)", $2, $3, $1 }'; }
# The lowest round trip alone (ns), taken before and after every library's
# run and kept with its rows (raw.csv rt_before_ns, rt_after_ns): the host
# can change phase within a run, and a ratio of two rows measured in
# different phases says more about the host than about the libraries.
rt_ns() { "$BIN/mem_bench" --latency 2>> "$LOG" | awk -F, 'NR == 2 { printf "%s", $2 }'; }
echo "# core-to-core round trip at the start: $(round_trip)" | tee -a "$OUT/summary.md"
echo "impl,coll,nranks,size,time_us,busbw,wrong,rt_before_ns,rt_after_ns,round" > "$RAW"
if [ "$LAUNCHER" = mpirun ]; then
  LOOM_RUN=(mpirun.openmpi --allow-run-as-root --oversubscribe "${OMPI_BIND[@]}" -np)
else
  LOOM_RUN=("$BIN/loomrun" --no-prefix --bind "$BIND" -n)
fi

# run LABEL CMD...: runs with a deadline, logs everything, returns the status.
# The rows a run printed are taken whatever its status: Loom's benchmark
# exits 1 when a result was wrong, and that row must show as wrong ('x'),
# not vanish.
run() {
  local label="$1"; shift
  echo "## $label: $*" >> "$LOG"
  RT_BEFORE=$(rt_ns)
  timeout --kill-after=10 "$TIMEOUT" "$@" > "$OUT/last.out" 2>> "$LOG"
  local rc=$?
  RT_AFTER=$(rt_ns)
  cat "$OUT/last.out" >> "$LOG"
  if [ $rc -ne 0 ]; then echo "compare.sh: $label failed (exit $rc), see $LOG" >&2; fi
  return $rc
}

# Peer benchmarks print impl,coll,nranks,size,count,time_us,algbw,busbw,wrong.
take_peer() { awk -F, -v rt="$RT_BEFORE,$RT_AFTER,$round" 'NR>1 && NF>=9 {print $1","$2","$3","$4","$6","$8","$9","rt}' "$OUT/last.out" >> "$RAW"; }
# Loom's --csv: collective,nranks,size,count,...,oop_time_us(8),oop_algbw,oop_busbw(10),oop_wrong(11),
# ip_time_us(12),ip_algbw,ip_busbw(14),ip_wrong(15). The peers' calls decide which column is the same
# operation: MPI_Allreduce/Reduce_scatter/Allgather get separate send and receive buffers (out of
# place), MPI_Bcast has one buffer (in place: the root does not copy its input to an output).
take_loom() {
  # Rows of no elements (a block under 16 B, as nccl-tests cuts it) are
  # skipped, as the peers' benchmarks skip them.
  awk -F, -v coll="$1" -v impl="${2:-loom}" -v rt="$RT_BEFORE,$RT_AFTER,$round" 'NR>1 && NF>=15 && $4 > 0 {
    if (coll == "broadcast") print impl","$1","$2","$3","$12","$14","($15==""?0:$15)","rt
    else print impl","$1","$2","$3","$8","$10","($11==""?0:$11)","rt}' "$OUT/last.out" >> "$RAW"; }

# One part (small or large sizes) of one collective and rank count: Loom's run
# (and loom-ma's), then each peer's. A round calls them in its order.
run_loom() {
  run "loom $coll n=$n $part" "${LOOM_RUN[@]}" "$n" "$BIN/${PERF[$coll]}" \
      --sizes "$sizes" "${iters[@]}" "${LOOM_MODE[@]}" "${LOOM_THP[@]}" -c $check --csv; take_loom "$coll"
  if [ "$MEM_ALLOC" = 1 ]; then
    run "loom-ma $coll n=$n $part" "${LOOM_RUN[@]}" "$n" "$BIN/${PERF[$coll]}" \
        --sizes "$sizes" "${iters[@]}" "${LOOM_MODE[@]}" -R 1 -c $check --csv; take_loom "$coll" loom-ma
  fi
}
run_peers() {
  if [ $HAVE_OMPI = 1 ]; then
    run "ompi $coll n=$n $part" mpirun.openmpi --allow-run-as-root --oversubscribe "${OMPI_BIND[@]}" -np "$n" \
        "$BIN/mpi_bench" -c "$coll" -s "$sizes" "${iters[@]}" "${MPI_OPTS[@]}" -l ompi; take_peer
  fi
  if [ $HAVE_MPICH = 1 ]; then
    run "mpich $coll n=$n $part" mpirun.mpich "${MPICH_BIND[@]}" -np "$n" \
        "$BIN/mpi_bench_mpich" -c "$coll" -s "$sizes" "${miters[@]}" "${MPI_OPTS[@]}" -l mpich; take_peer
  fi
  # Gloo's TCP transport needs ms per small operation once oversubscribed
  # and runs every algorithm: fewer iterations keep it within --timeout.
  if [ $HAVE_GLOO = 1 ]; then
    store="$(mktemp -d)"
    run "gloo $coll n=$n $part" "$BIN/loomrun" -n "$n" --no-prefix --bind "$BIND" -- "$BIN/gloo_bench" -c "$coll" -d "$store" \
        -s "$sizes" "${giters[@]}"; take_peer
    rm -rf "$store"
  fi
}

for ((round = 1; round <= ROUNDS; round++)); do
for n in $RANKS; do
  for coll in $COLLS; do
    echo "compare.sh: $coll on $n ranks (round $round of $ROUNDS)" >&2
    for part in small large; do
      if [ $part = small ]; then sizes=$SMALL; iters=("${SMALL_ITERS[@]}"); check=1; giters=(-n 50 -w 5)
        # A rank per core: sub-microsecond latencies need more than 200 samples to
        # be compared at 0.05 us (200 iterations of an 8 B allreduce are 80 us of
        # timing); oversubscribed, MPICH's spinning ranks make 2000 take minutes.
        # A thousand warm-up calls, every library alike: Loom's first ~1000
        # calls after init run ~10% slower (Run 47: 2 ranks, 8 B, 64-call
        # means 30 -> 27 us in the slow phase, the first 2000-call loop 0.25
        # against 0.19 us later in the fast phase), and 100 left that in the
        # first size's row.
        [ "$QUICK" = 0 ] && [ "$n" -le "$(nproc)" ] && iters=(-n 2000 -w 1000)
        miters=("${iters[@]}")
        # Oversubscribed, 50 iterations of a 3 us op are 150 us of timing: one
        # sleeping rank's wake-up (tens of us on a VM) moved a ratio 2-4x from
        # round to round (run 9: 4-rank allreduce 4 KiB 8-28 us). Loom and Open
        # MPI get 500; MPICH (ms per op there, its ranks spin) keeps few.
        [ "$n" -gt "$(nproc)" ] && iters=(-n 500 -w 50) && miters=(-n 10 -w 2)
        # Except its broadcast: the root's eager sends run ahead and ten
        # calls right after the warm-up finish before its spinning ranks
        # start to take turns on the cores. 8 ranks, 8 B, one sitting (run
        # 45): 10 iterations 0.49-0.68 us, 100 159.7-162.5 us, 500 214.4 us;
        # Runs 42-44 read 0.36-0.74 us from 10. A hundred calls of it take
        # well under a second.
        [ "$n" -gt "$(nproc)" ] && [ "$coll" = broadcast ] && miters=(-n 100 -w 10)
      else sizes=$LARGE; iters=("${LARGE_ITERS[@]}"); miters=("${iters[@]}"); check=0; giters=("${LARGE_ITERS[@]}"); fi
      if [ $((round % 2)) = 1 ]; then run_loom; run_peers; else run_peers; run_loom; fi
    done
  done
done
done  # rounds
echo "# core-to-core round trip at the end: $(round_trip)" | tee -a "$OUT/summary.md"

# Rates again at each collective's footprint per core: the send and receive
# buffers of all its ranks, in units of the size (allreduce 2n, reduce_scatter
# and all_gather n+1, broadcast in place n), over min(n, cores) cores, cycled
# through as the collective does: a 2-rank 64 MiB allreduce touches 128 MiB
# per core and call, which leaves the caches where mem_bench's one 32 MiB
# buffer pair does not. These rows run on every core at once (mem_bench).
FOOTPRINTS=0
for n in $RANKS; do
  for coll in $COLLS; do
    case $coll in allreduce) t=$((2 * n)) ;; broadcast) t=$n ;; *) t=$((n + 1)) ;; esac
    c=$(( n < $(nproc) ? n : $(nproc) ))
    f=$(awk -v t=$t -v c=$c 'BEGIN { printf "%g", t / c }')
    case ",$FOOTPRINTS," in *",$f,"*) ;; *) FOOTPRINTS="$FOOTPRINTS,$f" ;; esac
  done
done
echo "compare.sh: memory reference (mem_bench, footprints $FOOTPRINTS)" >&2
"$BIN/mem_bench" --sizes "$SMALL,$LARGE" --footprints "$FOOTPRINTS" > "$OUT/mem.csv" 2>> "$LOG" || echo "compare.sh: mem_bench failed" >&2
fi  # measuring

python3 - "$RAW" "$OUT/mem.csv" "$OUT" "$(nproc)" <<'PY' | tee -a "$OUT/summary.md"
import csv, sys, collections, statistics
raw, memf, out = sys.argv[1:4]
# The cores this run could use (nproc: the affinity mask, as the footprints
# above were computed), not the machine's (os.cpu_count) under taskset.
cores = int(sys.argv[4])
data = collections.defaultdict(dict)   # (coll, n, size) -> impl -> (time_us, busbw, wrong, phase)
by_phase = collections.defaultdict(dict)  # (coll, n, size, phase) -> impl -> the same, that phase's best
wrong_any = set()                       # (coll, n, size, impl) wrong in some round
per_round = collections.defaultdict(dict)  # (coll, n, size, round) -> impl -> that round's best verified row
rows = list(csv.DictReader(open(raw)))
def rts(r):
    """The round trips (ns) measured before and after the row's run; none in
    a raw.csv from before those columns."""
    out = []
    for k in ("rt_before_ns", "rt_after_ns"):
        try: out.append(float(r.get(k) or ""))
        except ValueError: pass
    return [v for v in out if v > 0]
# The host's phases (performance.md, Run 43): the core-to-core round trip
# moves ~5x between them. Two phases are told apart only when this run saw
# both (its highest reading at least twice its lowest), split at the
# geometric mean of the two.
all_rt = [v for r in rows for v in rts(r)]
rt_split = (min(all_rt) * max(all_rt)) ** 0.5 if all_rt and max(all_rt) >= 2 * min(all_rt) else None
def phase_of(r):
    if rt_split is None: return None
    kinds = {"fast" if v < rt_split else "slow" for v in rts(r)}
    return kinds.pop() if len(kinds) == 1 else "mixed"  # none, or the phase changed during the run
def better(new, prev):
    # The best round (--rounds) and, for Gloo, the best algorithm per size,
    # preferring ones that verified; by time (busbw is rounded at small sizes).
    return prev is None or (not new[2], -new[0]) > (not prev[2], -prev[0])
for r in rows:
    impl = "gloo" if r["impl"].startswith("gloo") else r["impl"]
    key = (r["coll"], int(r["nranks"]), int(r["size"]))
    t, bw, wrong = float(r["time_us"]), float(r["busbw"]), float(r["wrong"] or 0)
    if key[2] == 0: continue  # nothing moved (e.g. 8 B split over 4 ranks)
    if wrong: wrong_any.add(key + (impl,))
    row = (t, bw, wrong, phase_of(r))
    if better(row, data[key].get(impl)): data[key][impl] = row
    if row[3] in ("fast", "slow") and better(row, by_phase[key + (row[3],)].get(impl)):
        by_phase[key + (row[3],)][impl] = row
    rnd = (r.get("round") or "").strip()  # none in a raw.csv from before the column
    if rnd and not wrong and t > 0 and better(row, per_round[key + (rnd,)].get(impl)):
        per_round[key + (rnd,)][impl] = row
rounds_seen = {k[3] for k in per_round}
def apart(p, q):
    """Two rows' phases (phase_of) compare unlike: the run saw both phases and
    the rows come from different ones, or from a run during which it turned."""
    return rt_split is not None and (p != q or p == "mixed")
def round_ratios(c, n, s):
    """Loom's ratio within each round (that round's best verified MPI time
    over Loom's), leaving out a round whose two rows come from different
    phases of the host (or a run during which it turned)."""
    out = []
    for rnd in sorted(rounds_seen):
        d = per_round.get((c, n, s, rnd), {})
        mt = [(d[m][0], m) for m in ("ompi", "mpich") if m in d]
        if "loom" not in d or not mt: continue
        best = min(mt)
        if apart(d["loom"][3], d[best[1]][3]): continue
        out.append(best[0] / d["loom"][0])
    return out
mem = {}      # size -> rates with one buffer set (footprint 0): the model and the reference table
mem_fp = {}   # (size, footprint per core) -> rates cycling through that much memory
try:
    for r in csv.DictReader(open(memf)):
        x = float(r["xcopy_gbps"]) if r.get("xcopy_gbps") not in (None, "", "nan") else 0.0
        # Cross-core copy (mem_bench's c2c); 0 in files from before the column.
        cc = float(r["c2c_gbps"]) if r.get("c2c_gbps") not in (None, "", "nan") else 0.0
        rates = (float(r["memcpy_gbps"]), float(r["reduce_gbps"]), float(r["model_busbw_gbps"]), x, cc)
        fp = float(r.get("footprint") or 0)  # files from before the column: one set
        if fp == 0: mem[int(r["size"])] = rates
        else: mem_fp[(int(r["size"]), fp)] = rates
except OSError:
    pass
def footprint(c, n):
    """Bytes a call touches per core, in units of its size: every rank's send
    and receive buffers over min(n, cores) cores (the same formula as above)."""
    return {"allreduce": 2 * n, "broadcast": n}.get(c, n + 1) / min(n, cores)
def rates_for(c, n, s):
    """mem_bench's rates at the collective's footprint (every core at once),
    else with one buffer set on one core (a mem.csv without that row)."""
    f = footprint(c, n)
    fps = [fp for (ss, fp) in mem_fp if ss == s and abs(fp - f) < 1e-6 * max(f, 1)]
    if not fps and mem_fp: missing_fp.add((s, f))
    return mem_fp[(s, fps[0])] if fps else mem.get(s)
missing_fp = set()
def copy_bound(c, n, s):
    """busbw (GB/s) no implementation can beat on these cores: the sum over
    ranks of the copies and reductions the collective cannot avoid, at the
    rates mem_bench measured for this size (on s/2 bytes) while cycling
    through the collective's footprint (rates_for), spread over
    min(n, cores) cores. A byte bound for another rank's private buffer
    crosses once (process_vm_readv, rate X) or twice through shared memory:
    a memcpy in (M) and a copy out of lines another core wrote (C, mem_bench's
    c2c; two memcpys, M/2, in files without it); a byte to be reduced crosses once into memory the reducer
    reads (X, or the sender's memcpy into shared memory, M) and is then
    reduced; a k-input reduction is priced (k+1)/3 two-input passes (it must
    read k inputs and write 1, a two-input pass reads 2 and writes 1)."""
    m = rates_for(c, n, s)
    if not m or m[3] <= 0: return None
    M, R, X, C = m[0], m[1], m[3], m[4]
    through_shm = 1 / (1 / M + 1 / C) if C > 0 else M / 2
    xs, xr = max(X, through_shm), max(X, M)   # per stored / per reduced crossing byte
    p = n
    if c == "all_gather":   # own block copied locally, p-1 blocks cross
        w, f = (p - 1) * s / xs + s / M, (p - 1) / p
    elif c == "broadcast":  # in place: p-1 ranks receive the whole buffer
        w, f = (p - 1) * s / xs, 1.0
    elif c == "reduce_scatter":
        w, f = (p - 1) * s / xr + (p + 1) / 3 * s / R, (p - 1) / p
    elif c == "allreduce":  # reduce-scatter, then every reduced block crosses p-1 times
        w, f = (p - 1) * s / xr + (p + 1) / 3 * s / R + (p - 1) * s / xs, 2 * (p - 1) / p
    else:
        return None
    return f * s * min(p, cores) / w
def target(c, n, s):
    """The perf issue's ratio over the best MPI for this point, or None:
    2-rank allreduce from 4 MiB 2x; reduce_scatter and all_gather from 1 MiB
    2x, broadcast 1.5x; oversubscribed ranks at least 1x everywhere."""
    t = None
    if c == "allreduce" and n == 2 and s >= 4 << 20: t = 2.0
    if c in ("reduce_scatter", "all_gather") and s >= 1 << 20: t = 2.0
    if c == "broadcast" and s >= 1 << 20: t = 1.5
    if n > cores: t = max(t or 1.0, 1.0)
    return t
def human(b):
    for unit, v in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= v and b % v == 0: return f"{b // v} {unit}"
    return f"{b} B"
impls = [i for i in ("loom", "loom-ma", "ompi", "mpich", "gloo") if any(i in d for d in data.values())]
ma = "loom-ma" in impls
print("\nbusbw in GB/s (decimal); sizes below 64 KiB show the time per operation in us instead.")
print("ratio = Loom / best of Open MPI and MPICH (busbw, from the times: best MPI time / Loom's; > 1: Loom is faster).")
print("'x' marks a wrong result (in any round: the time shown is the best verified round's, if any).")
if ma: print("loom-ma: Loom with buffers from loom::mem_alloc (-R 1); ratio-ma = loom-ma / best MPI.")
if rt_split is not None:
    print(f"The host changed phase during this run (core-to-core round trip {min(all_rt):.0f}-{max(all_rt):.0f} ns, "
          "measured before and after every library's run): a run is 'fast' below "
          f"{rt_split:.0f} ns, 'slow' above, 'mixed' when its two readings disagree.")
    print("'*' on a ratio: Loom's and the best MPI's kept rows come from different phases (or a mixed run).")
    print("by phase: the ratio from each phase's best verified rows alone, where Loom and an MPI both have one.")
if len(rounds_seen) > 1:
    print(f"per round: the median over the {len(rounds_seen)} rounds of the ratio from each round's own verified rows "
          "(lowest-highest, rounds counted; a round whose two rows come from different phases is left out). "
          "Odd rounds ran Loom first, even rounds the peers first.")
print("Loom's out-of-place column, except broadcast: in place, the same call as MPI_Bcast (one buffer).\n")
colls = []
for (c, n, s) in data:
    if (c, n) not in colls: colls.append((c, n))
order = {"allreduce": 0, "reduce_scatter": 1, "all_gather": 2, "broadcast": 3}
for c, n in sorted(colls, key=lambda k: (order.get(k[0], 9), k[1])):
    model = c == "allreduce" and n == 2 and mem
    bounded = any(copy_bound(c, n, s) for (cc, nn, s) in data if cc == c and nn == n and s >= 65536)
    head = ["size"] + impls + ["ratio"] + (["ratio-ma"] if ma else []) + (["per round"] if len(rounds_seen) > 1 else []) + \
           (["by phase"] if rt_split is not None else []) + \
           (["model", "loom/model"] if model else []) + \
           (["copy bound", "loom/bound", "target", "target/bound"] if bounded else []) + \
           (["model/2 / bound"] if model and bounded else [])
    print(f"### {c}, {n} ranks\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for s in sorted(s for (cc, nn, s) in data if cc == c and nn == n):
        d = data[(c, n, s)]
        small = s < 65536
        def cell(i):
            if i not in d: return "-"
            t, bw, w, _ = d[i]
            # Sub-10 us latencies with two decimals: at one, 0.47 and 0.54 us
            # both read "0.5 us" beside a ratio of 1.13.
            v = (f"{t:.2f} us" if t < 10 else f"{t:.1f} us") if small else f"{bw:.2f}"
            return v + (" x" if w or (c, n, s, i) in wrong_any else "")
        row = [human(s)] + [cell(i) for i in impls]
        mpis = [d[i][1] for i in ("ompi", "mpich") if i in d and d[i][1] > 0]
        # The ratio from the times (same size and ranks: busbw ratio = inverse
        # time ratio); busbw is printed to 4 decimals and at 8 B is 0.0002-4.
        mpi_t = [d[i][0] for i in ("ompi", "mpich") if i in d and d[i][0] > 0]
        def ratio(i):
            if not (i in d and d[i][0] > 0 and mpi_t): return "-"
            best = min((d[m][0], m) for m in ("ompi", "mpich") if m in d and d[m][0] > 0)[1]
            return f"{min(mpi_t) / d[i][0]:.2f}" + ("*" if apart(d[i][3], d[best][3]) else "")
        row.append(ratio("loom"))
        if ma: row.append(ratio("loom-ma"))
        if len(rounds_seen) > 1:
            rr = sorted(round_ratios(c, n, s))
            row.append(f"{statistics.median(rr):.2f} ({rr[0]:.2f}-{rr[-1]:.2f}, {len(rr)})" if rr else "-")
        if rt_split is not None:
            parts = []
            for ph in ("fast", "slow"):
                p = by_phase.get((c, n, s, ph), {})
                ok = lambda i: i in p and p[i][0] > 0 and not p[i][2]
                mt = [p[m][0] for m in ("ompi", "mpich") if ok(m)]
                if ok("loom") and mt: parts.append(f"{ph} {min(mt) / p['loom'][0]:.2f}")
            row.append(", ".join(parts) or "-")
        if model:
            m = mem.get(s)
            row += [f"{m[2]:.2f}" if m else "-", f"{d['loom'][1] / m[2]:.0%}" if m and "loom" in d else "-"]
        if bounded:
            b = copy_bound(c, n, s) if not small else None
            t = target(c, n, s)
            need = t * max(mpis) if t and mpis else None
            row += [f"{b:.2f}" if b else "-", f"{d['loom'][1] / b:.0%}" if b and "loom" in d else "-",
                    f"{t:g}x = {need:.2f}" if need and not small else "-",
                    (f"{need / b:.2f}" + (" above" if need > b else "")) if b and need and not small else "-"]
            if model:  # the issue's other allreduce target, half the memory model (m above), against the same bound
                row.append((f"{0.5 * m[2] / b:.2f}" + (" above" if 0.5 * m[2] > b else "")) if m and b else "-")
        print("| " + " | ".join(row) + " |")
    print()
if missing_fp:
    print("Note: mem.csv has no footprint row for " + ", ".join(f"{human(s)} x{f:g}" for s, f in sorted(missing_fp)) +
          ": those copy bounds use the one-set, in-cache rates (optimistic).\n")
if mem:
    print("### memory reference (one core)\n")
    print("| size | memcpy GB/s | reduce2 float sum GB/s | 2-rank allreduce model busbw GB/s | cross-process copy GB/s (both cores) | cross-core copy GB/s (both cores) |")
    print("|---|---|---|---|---|---|")
    for s in sorted(mem):
        x = f"{mem[s][3]:.2f}" if mem[s][3] > 0 else "-"
        cc = f"{mem[s][4]:.2f}" if mem[s][4] > 0 else "-"
        print(f"| {human(s)} | {mem[s][0]:.2f} | {mem[s][1]:.2f} | {mem[s][2]:.2f} | {x} | {cc} |")
    print("\nRates of a row of size S are measured on S/2 bytes (what each rank of a 2-rank collective moves).")
    print("copy bound: the busbw at which min(ranks, cores) cores would do only the copies and reductions the")
    print("collective cannot avoid, at these rates measured again while cycling through the memory the collective")
    print("touches per call and core (every rank's send and receive buffers: allreduce 2n x size, reduce_scatter")
    print("and all_gather n+1, broadcast n, over min(n, cores) cores), with every core copying at once.")
    print("A byte for another rank's private buffer crosses by process_vm_readv or through shared memory: a")
    print("memcpy in, then a copy out of lines the other core wrote (the cross-core copy, slower than a memcpy")
    print("within one core's cache).")
    print("target/bound > 1: the issue's target lies above that bound. model/2 / bound: the same for the")
    print("2-rank allreduce's other target, half the memory model (whose rates are one buffer set's, in cache).")
    if mem_fp:
        print("\n### memory reference at the collectives' footprints\n")
        print("| size | footprint per core (x size) | memcpy GB/s (per core, all at once) | reduce2 GB/s (same) | cross-process copy GB/s | cross-core copy GB/s |")
        print("|---|---|---|---|---|---|")
        for (sz, fp) in sorted(mem_fp):
            r = mem_fp[(sz, fp)]
            cc = f"{r[4]:.2f}" if r[4] > 0 else "-"
            print(f"| {human(sz)} | {fp:g} | {r[0]:.2f} | {r[1]:.2f} | {r[3]:.2f} | {cc} |")
# Plot data: 2-rank allreduce busbw per library and the model.
with open(f"{out}/allreduce_2.dat", "w") as f:
    f.write("# size " + " ".join(impls) + " model copy_bound\n")
    for (c, n, s), d in sorted(data.items(), key=lambda kv: kv[0][2]):
        if c != "allreduce" or n != 2 or s < 4096: continue
        vals = [f"{d[i][1]:.4f}" if i in d else "NaN" for i in impls]
        vals.append(f"{mem[s][2]:.4f}" if s in mem else "NaN")
        b = copy_bound(c, n, s) if s >= 65536 else None
        vals.append(f"{b:.4f}" if b else "NaN")
        f.write(f"{s} " + " ".join(vals) + "\n")
with open(f"{out}/allreduce_2.gp", "w") as f:
    f.write(f"set terminal png size 900,560\nset output '{out}/allreduce_2ranks.png'\n")
    f.write("set title 'allreduce, 2 ranks, shared memory'\nset logscale x 2\nset logscale y 10\n")
    f.write("set format x '%.0b%B'\nset xlabel 'size (bytes)'\nset ylabel 'busbw (GB/s)'\nset key top left\nset grid\n")
    f.write("plot " + ", ".join(f"'{out}/allreduce_2.dat' using 1:{k + 2} with linespoints title '{name}'"
                              for k, name in enumerate(impls + ["memory model", "copy bound"])) + "\n")
PY
if command -v gnuplot >/dev/null && [ -s "$OUT/allreduce_2.dat" ]; then
  gnuplot "$OUT/allreduce_2.gp" 2>> "$LOG" && echo "plot: $OUT/allreduce_2ranks.png"
fi
echo "raw results: $RAW; summary: $OUT/summary.md; log: $LOG"
