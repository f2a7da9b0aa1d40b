// N communicators of one clique on this thread (ncclCommInitAll), destroyed
// at scope exit; for the shim's single-thread API tests.
#pragma once

#include <gtest/gtest.h>

#include "nccl.h"

namespace loom::testing {

template <int N>
struct NcclComms {
  ncclComm_t c[N] = {};
  NcclComms() { EXPECT_EQ(ncclCommInitAll(c, N, nullptr), ncclSuccess) << ncclGetLastError(nullptr); }
  ~NcclComms() {
    for (ncclComm_t x : c) {
      if (x != nullptr) {
        EXPECT_EQ(ncclCommDestroy(x), ncclSuccess) << ncclGetLastError(x);
      }
    }
  }
};

}  // namespace loom::testing
