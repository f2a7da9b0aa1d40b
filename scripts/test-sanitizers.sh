#!/usr/bin/env bash
# Runs the test suite under sanitizers: `address` (ASan + UBSan) or `thread` (TSan).
# Separate from CI's default run because it takes long on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:-address}"
case "$kind" in
  address) san="address,undefined"; dir=build-asan ;;
  thread) san="thread"; dir=build-tsan ;;
  *) echo "usage: $0 address|thread" >&2; exit 2 ;;
esac
cmake -S . -B "$dir" -G Ninja -DLOOM_SANITIZE="$san" -DCMAKE_BUILD_TYPE=Debug
ninja -C "$dir"
cd "$dir"
# hwloc's PCI plugin (libpciaccess) leaks ~1 KiB per topology load inside a
# library that is dlclose()d, so LeakSanitizer cannot even name it. PCI
# discovery is switched off here only; the XML tests still parse PCI trees.
export HWLOC_COMPONENTS=-pci
# The big-count matrices take hours under sanitizers on 2 cores; they run in
# the default suite. LOOM_SANITIZE_EXCLUDE adds more.
exclude="${LOOM_SANITIZE_EXCLUDE:-matrix_threads|harness_golden}"
# The multi-process tests fork their ranks from a process that has no other
# thread (the rendezvous root runs in a helper process: testing::unique_id),
# so TSan runs them too. Except: test_socket_faults, whose "peer closes
# mid-message" case saw the whole message arrive under TSan (its timing
# assumption, that the peer is gone before the receiver posts, does not hold
# there; cause not investigated), and the netns tests (not run under TSan).
if [ "$kind" = thread ]; then
  exclude="$exclude|multiproc/test_socket_faults|netns/"
fi
ctest --output-on-failure --timeout 3000 -E "${exclude}|mpi_launch|perf_cli"
# Open MPI's own components (dlopen'd MCA plugins, ompi_op_base_op_select) leak
# at MPI_Finalize, which LeakSanitizer cannot attribute; the tests that start
# ranks with mpirun (mpi_launch, perf_cli) run with leak checks off and every
# other ASan/UBSan check on.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" ctest --output-on-failure --timeout 3000 -R "mpi_launch|perf_cli"
