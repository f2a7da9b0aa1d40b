#!/bin/bash
# (run from the repository root) callgrind profiles of rank 0 and 1 of a 2-rank 8 B allreduce, kept in OUTDIR; compare two with cgdiff.py A/cg.0 B/cg.0 10020
# cg.sh OUTDIR [env...]: callgrind profiles of 2-rank 8 B allreduce, kept
O=$1; shift; mkdir -p $O
cat > $O/wrap.sh <<W
#!/bin/bash
exec valgrind --tool=callgrind --callgrind-out-file=$O/cg.\$LOOM_RANK "\$@"
W
chmod +x $O/wrap.sh
env "$@" LOOM_SPIN_US=0 ./build/bin/loomrun -n 2 --no-prefix -- $O/wrap.sh ./build/bin/all_reduce_perf --sizes 8 -n 5000 -w 10 -z 1 -c 0 > $O/run.log 2>&1
