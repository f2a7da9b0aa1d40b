#!/usr/bin/env bash
# Installs every Debian package that building and testing Loom needs.
# Idempotent; safe to run on a fresh Debian 12 machine as root (or with sudo).
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
PKGS=(
  build-essential g++ clang cmake ninja-build pkg-config git
  libgtest-dev libfmt-dev nlohmann-json3-dev
  libhwloc-dev hwloc libibverbs-dev
  libopenmpi-dev openmpi-bin
  # Peers for perf-tests/compare.sh. MPICH installs mpicc/mpirun alternatives at
  # a lower priority than Open MPI, which stays the default; compare.sh calls
  # mpicc.mpich / mpirun.mpich by name.
  mpich libmpich-dev libgloo-dev
  iproute2 procps psmisc
  # gdb: a test that times out reports its ranks' stacks (tests/common).
  gdb
  iperf3 libgloo-dev
  gnuplot-nox
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all packages present"
fi
