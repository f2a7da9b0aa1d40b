# Summarizes phase_pairs.sh output: pairs whose three round-trip readings are all fast (< 300 ns) or all slow.
# Usage: python3 docs/data/run46/phase_pairs_summary.py docs/data/run46/phase-pairs.txt [loom|ompi: only pairs with it first]
import sys, re, statistics as st
rows = []
for line in open(sys.argv[1]):
    m = re.match(r'rt (\d+) (\d+) (\d+) \| loom (.*)\| ompi (.*?)(\| first (\w+))?$', line.strip())
    if not m: continue
    rts = [int(m.group(i)) for i in (1, 2, 3)]
    lo = dict(kv.split(':') for kv in m.group(4).split())
    om = dict(kv.split(':') for kv in m.group(5).split())
    if len(sys.argv) > 2 and (m.group(7) or 'loom') != sys.argv[2]: continue  # only pairs with that library first
    rows.append((rts, lo, om))
thr = 300
for name, sel in (("fast (all three < 300 ns)", lambda r: max(r) < thr), ("slow (all three >= 300 ns)", lambda r: min(r) >= thr)):
    rs = [r for r in rows if sel(r[0])]
    print(f"{name}: {len(rs)} pairs of {len(rows)}")
    if not rs: continue
    sizes = sorted({k for _, l, o in rs for k in l if k in o}, key=int)
    for size in sizes:
        pairs = [(float(l[size]), float(o[size])) for _, l, o in rs if size in l and size in o]
        if not pairs: continue
        ratios = sorted(o / l for l, o in pairs)
        ls = sorted(l for l, _ in pairs); os_ = sorted(o for _, o in pairs)
        print(f"  {size:>8} B: loom median {st.median(ls):.3f} (min {ls[0]:.3f}) us, ompi median {st.median(os_):.3f} (min {os_[0]:.3f}); "
              f"ratio ompi/loom median {st.median(ratios):.2f}, range {ratios[0]:.2f}-{ratios[-1]:.2f}, pairs with loom ahead {sum(r > 1 for r in ratios)}/{len(ratios)}, at 2x or more {sum(r >= 2 for r in ratios)}/{len(ratios)}")
