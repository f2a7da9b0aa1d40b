#!/usr/bin/env bash
# The main job: builds Loom, shows the machine's topology, then runs a 4-rank
# allreduce benchmark (nccl-tests table) over shared memory with results checked.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
if [ -x build/bin/loom-topo ]; then build/bin/loom-topo --nranks 4 || true; fi
build/bin/loomrun -n 4 build/bin/allreduce_perf -b 8 -e 64M -f 4 -c 1
