#!/usr/bin/env bash
# Builds Loom and runs the whole test suite with CTest (about 10 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
# Tests that fork ranks or use shared memory run one at a time: on 2 cores,
# running them in parallel only oversubscribes the machine further.
ctest --output-on-failure --timeout 900
