#!/usr/bin/env bash
# GPU checks for a machine with an NVIDIA GPU (none of this can run in CI):
#   1. what the machine has (nvidia-smi, where the CUDA runtime / NVML are);
#   2. loom-topo: topology discovery through the real NVML and CUDA runtime;
#   3. gpu_test_cuda_real: the shim's staged device-buffer collectives, stream
#      order and discovery against the real runtime (prints staged busbw);
#   4. tests/gpu/torch_smoke.py: PyTorch's NCCL backend on Loom's libnccl.so.2
#      (LD_PRELOAD), device tensors, 2 ranks on GPU 0 (skipped without torch).
# Usage: scripts/gpu-check.sh [PREFIX]   PREFIX has bin/ and lib/ (default: build,
#        whose test binary is build/tests/gpu_test_cuda_real). Log on stdout.
set -u
here="$(cd "$(dirname "$0")/.." && pwd)"
prefix="${1:-$here/build}"
test_bin="$prefix/bin/gpu_test_cuda_real"
[ -x "$test_bin" ] || test_bin="$prefix/tests/gpu_test_cuda_real"
cudalib=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$d" ] && cudalib="$cudalib:$d"; done
export LD_LIBRARY_PATH="$prefix/lib${cudalib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LOOM_TIMEOUT="${LOOM_TIMEOUT:-60}"
fail=0
step() { echo; echo "===== $* ====="; }

step "machine"
nvidia-smi -L || echo "nvidia-smi failed"
nvidia-smi topo -m 2>/dev/null | head -12
ldconfig -p | grep -E "libcudart|libnvidia-ml|libcuda\.so" | head -6
ls "${cudalib#:}" 2>/dev/null | grep -E "^libcudart" | head -3

step "loom-topo (LOOM_DEBUG=INFO, INIT)"
LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=INIT timeout 60 "$prefix/bin/loom-topo" 2>&1 | head -60 || fail=1

step "gpu_test_cuda_real"
if timeout 300 "$test_bin"; then :; else echo "gpu_test_cuda_real: exit $?"; fail=1; fi

step "torch_smoke (PyTorch NCCL backend on Loom's libnccl.so.2)"
if python3 -c "import torch" 2>/dev/null; then
  LD_PRELOAD="$prefix/lib/libnccl.so.2" LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=INIT \
    timeout 300 python3 "$here/tests/gpu/torch_smoke.py" --ranks 2 2>&1 | tail -40
  [ "${PIPESTATUS[0]}" = 0 ] || fail=1
else
  echo "SKIP: no torch"
fi
echo
echo "gpu-check: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
