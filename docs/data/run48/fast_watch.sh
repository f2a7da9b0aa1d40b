#!/bin/bash
cd /work/main
B=build/bin
run_lat() { $B/loomrun -n 2 --no-prefix --bind core $B/all_reduce_perf --sizes 8,64 -n 20000 -w 1000 -z 1 -c 0 --csv 2>/dev/null | awk -F, '$1=="allreduce"{printf "%s %s ", $8, $12}'; echo; }
end=$(( $(date +%s) + ${1:-3000} ))
while [ $(date +%s) -lt $end ]; do
  [ -e /tmp/fastwatch.stop ] && exit 0
  if pgrep -x "ninja|cc1plus|ctest|ld|c++" >/dev/null; then sleep 20; continue; fi
  rt=$($B/mem_bench --latency | tail -1 | cut -d, -f2)
  if awk -v r="$rt" 'BEGIN{exit !(r<300)}'; then
    echo "=== $(date +%T) rt $rt" >> $LOG
    for i in 1 2 3; do
      for v in $VARIANTS; do
        case $v in
          base) echo "base $(run_lat)" >> $LOG ;;
          T) echo "T $(LOOM_TRACE_BUFFER_SIZE=0 run_lat)" >> $LOG ;;
          ompi) echo "ompi $(mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to core:overload-allowed -np 2 $B/mpi_bench -c allreduce -s 8,64 -n 20000 -w 1000 -l ompi 2>/dev/null | awk -F, '$1 == "ompi" { printf "%s %s ", $6, $6 }')" >> $LOG ;;
          ALL) echo "ALL $(export PROBE_GATE=1 PROBE_NOFENCE=1 PROBE_REC=3; run_lat)" >> $LOG ;;
          *) echo "$v $(export $v; run_lat)" >> $LOG ;;
        esac
      done
    done
    echo "rt-after $($B/mem_bench --latency | tail -1 | cut -d, -f2)" >> $LOG
  else
    sleep 15
  fi
done
