#!/usr/bin/env bash
# Configures and builds Loom into build/ (Ninja, -Werror).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DLOOM_WERROR=ON "$@"
ninja -C build
