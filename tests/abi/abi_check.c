/* Loom's nccl.h as C (no CUDA headers) against NVIDIA's: see abi_check.h. */
#include <nccl.h>

#include "abi_check.h"

int main(void) {
  loom_abi_run_common();
  printf("abi_check (C): compile-time items OK, %d run-time items checked, %d mismatches\n",
         loom_abi_checked, loom_abi_failures);
  return loom_abi_failures == 0 ? 0 : 1;
}
