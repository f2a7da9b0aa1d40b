import sys,statistics as st
# Usage: probe_summary.py FILE [BASE]: BASE names the reference variant ('base'; 'F' in first-loop-and-probes.log).
log=sys.argv[1]; base=sys.argv[2] if len(sys.argv)>2 else 'base'
blocks=[];cur={}
for l in open(log):
    p=l.split()
    if len(p)==5 and not l.startswith('===') and p[1]!='CHUNKS':
        if p[0]==base and cur: blocks.append(cur); cur={}
        cur[p[0]]=[float(x) for x in p[1:]]
if cur: blocks.append(cur)
names=sorted({k for b in blocks for k in b})
for ph,cond in (("fast",lambda b: b[base][0]<0.3),("slow",lambda b: b[base][0]>=0.3)):
    B=[b for b in blocks if base in b and cond(b) and all((b[k][0]<0.3)==(b[base][0]<0.3) for k in b)]
    print(ph,len(B),"blocks")
    for k in names:
        Bk=[b for b in B if k in b]
        if not Bk: continue
        cols=[]
        for i in range(4):
            cols.append(f"{st.median(b[k][i] for b in Bk):.3f} ({st.median(b[k][i]/b[base][i] for b in Bk):.3f})")
        print(f"  {k:12s} 8oop {cols[0]}  8ip {cols[1]}  64oop {cols[2]}  64ip {cols[3]}  n={len(Bk)}")
