// LOOM_NCCL_ALIAS(ncclX): defines the public name ncclX as a weak alias of the
// implementation pncclX, as NCCL does, so a profiler can interpose ncclX and
// forward to pncclX. An alias must sit in the translation unit that defines
// its target, so each api_*.cc lists its own after the definitions.
// nccl.map then exports exactly nccl* and pnccl*.
#pragma once

#define LOOM_NCCL_ALIAS(name) \
  extern "C" decltype(p##name) name __attribute__((weak, alias("p" #name)));
