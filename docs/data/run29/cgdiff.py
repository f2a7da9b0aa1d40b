import re,subprocess,sys
# cgdiff.py A B CALLS: self instructions per call of each function in callgrind profile A and B, where they differ
def load(f):
    out=subprocess.run(['callgrind_annotate','--inclusive=no','--threshold=100','--auto=no',f],capture_output=True,text=True).stdout
    d={}
    for line in out.splitlines():
        m=re.match(r'\s*([\d,]+) \([ \d.]+%\)\s+(.*)$',line)
        if not m: continue
        name=m.group(2)
        if 'PROGRAM TOTALS' in name: continue
        name=re.sub(r'\(.*','',name.split(':',1)[1] if ':' in name else name)[:90]
        d[name]=d.get(name,0)+int(m.group(1).replace(',',''))
    return d
a=load(sys.argv[1]); b=load(sys.argv[2]); n=float(sys.argv[3])
rows=[(a.get(k,0)/n,b.get(k,0)/n,k) for k in set(a)|set(b)]
rows=[r for r in rows if abs(r[0]-r[1])>2]
rows.sort(key=lambda r:-(r[0]-r[1]))
print("total %.0f %.0f"%(sum(a.values())/n,sum(b.values())/n))
for x,y,k in rows: print("%8.1f %8.1f %8.1f  %s"%(x,y,x-y,k))
