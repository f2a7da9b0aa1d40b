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
ctest --output-on-failure --timeout 1800 -E "${LOOM_SANITIZE_EXCLUDE:-^$}"
