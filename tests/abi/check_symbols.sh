#!/usr/bin/env bash
# Symbol test for libnccl.so.2:
#  - every function NVIDIA's nccl.h declares is exported (defined, dynamic);
#  - nccl* are weak aliases (W) and pnccl* the strong definitions (T);
#  - nothing else is exported (no Loom or C++ runtime symbols leak);
#  - the SONAME is libnccl.so.2.
# Usage: check_symbols.sh REAL_NCCL_H LIBNCCL_SO_2
set -euo pipefail
header=$1
lib=$2
fail=0

soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
if [[ "$soname" != "libnccl.so.2" ]]; then
  echo "FAIL: SONAME is '$soname', want libnccl.so.2"; fail=1
fi

# Function names declared by the real header: lines that start with a return
# type and the function name (comments never do).
declared=$(grep -E '^[[:space:]]*(ncclResult_t|const char[[:space:]]*\*|void)[[:space:]]*p?nccl[A-Za-z0-9_]*[[:space:]]*\(' "$header" |
           grep -oE 'p?nccl[A-Za-z0-9_]*[[:space:]]*\(' | sed -E 's/[[:space:]]*\($//' | sort -u)
# NCCL 2.28 also exports the host side of its device API, declared in
# nccl_device/*.h beside nccl.h as `NCCL_EXTERN_C __host__ <type> name(`;
# programs built against 2.28 (PyTorch 2.11) reference them.
devdir="$(dirname "$header")/nccl_device"
if [[ -d "$devdir" ]]; then
  device_decl=$(grep -hE 'NCCL_EXTERN_C[[:space:]]+__host__[[:space:]]' "$devdir"/*.h |
                grep -oE 'nccl[A-Za-z0-9_]*[[:space:]]*\(' | sed -E 's/[[:space:]]*\($//' | sort -u)
  if (( $(wc -w <<<"$device_decl") < 5 )); then
    echo "FAIL: found only $(wc -w <<<"$device_decl") host functions in $devdir"; fail=1
  fi
  for f in $device_decl; do declared+=$'\n'"$f"$'\n'"p$f"; done
  declared=$(sort -u <<<"$declared")
fi
count=$(wc -w <<<"$declared")
if (( count < 80 )); then
  echo "FAIL: found only $count functions in $header"; fail=1
fi

exports=$(nm -D --defined-only "$lib" | awk '{print $2, $3}')
for f in $declared; do
  type=$(awk -v n="$f" '$2 == n {print $1}' <<<"$exports")
  want=T; [[ $f == nccl* ]] && want=W
  if [[ -z "$type" ]]; then
    echo "FAIL: $f is not exported"; fail=1
  elif [[ "$type" != "$want" ]]; then
    echo "FAIL: $f has symbol type $type, want $want"; fail=1
  fi
done

extra=$(awk '{print $2}' <<<"$exports" | grep -vE '^p?nccl' || true)
if [[ -n "$extra" ]]; then
  echo "FAIL: exported symbols outside nccl*/pnccl*:"; echo "$extra"; fail=1
fi
# Exported nccl-looking names the real header does not declare (a typo'd
# alias would show here).
unknown=$(comm -13 <(echo "$declared") <(awk '{print $2}' <<<"$exports" | sort -u))
if [[ -n "$unknown" ]]; then
  echo "FAIL: exported but not in the real header:"; echo "$unknown"; fail=1
fi

total=$(wc -l <<<"$exports")
if (( fail == 0 )); then
  echo "check_symbols: OK: $count header functions exported, $total dynamic symbols in total, SONAME $soname"
fi
exit $fail
