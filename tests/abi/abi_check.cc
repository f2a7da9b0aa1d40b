// Loom's nccl.h as C++ against NVIDIA's: layouts and values (abi_check.h)
// plus every function's type, compared through its typeid (the mangled type
// names the tags of NCCL's structs and enums, so a changed parameter shows).
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <typeinfo>

#include "abi_check.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define RUN_FUNC(fn) \
  loom_abi_report(std::strcmp(typeid(fn).name(), REAL_FUNC_##fn) == 0, "type of " #fn);

int main() {
  loom_abi_run_common();
  LOOM_ABI_ITEMS(CHECK_NOTHING_1, CHECK_NOTHING_1, CHECK_NOTHING_2, CHECK_NOTHING_1,
                 CHECK_NOTHING_2, CHECK_NOTHING_2, CHECK_NOTHING_3, RUN_FUNC, CHECK_NOTHING_1)
#ifdef LOOM_NCCL_HAVE_CUDA_HEADERS
  const char* mode = "with CUDA headers";
#else
  const char* mode = "without CUDA headers";
#endif
  std::printf("abi_check (C++, %s): compile-time items OK, %d run-time items checked, %d mismatches\n",
              mode, loom_abi_checked, loom_abi_failures);
  return loom_abi_failures == 0 ? 0 : 1;
}
