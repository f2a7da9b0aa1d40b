// N communicators of one clique on this thread (ncclCommInitAll), each with a
// stream of the mock CUDA runtime; at scope exit the streams are synchronised
// and destroyed and the communicators destroyed (a test that aborted one sets
// its slot to nullptr). For the shim's stream-order tests.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>

#include "gpu/mock/mock_cudart_api.h"
#include "nccl.h"

namespace loom::testing {

template <int N>
struct StreamWorld {
  ncclComm_t c[N] = {};
  cudaStream_t s[N] = {};
  explicit StreamWorld(MockCudart& m) : rt(m) {
    EXPECT_NE(rt.enqueue_copy, nullptr) << dlerror();
    EXPECT_EQ(ncclCommInitAll(c, N, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
    for (auto& st : s) EXPECT_EQ(rt.stream_create(&st), 0);
  }
  void sync() {
    for (auto& st : s) ASSERT_EQ(rt.stream_sync(st), 0);
  }
  ~StreamWorld() {
    for (int r = 0; r < N; ++r) {
      EXPECT_EQ(rt.stream_sync(s[r]), 0);
      EXPECT_EQ(rt.stream_destroy(s[r]), 0);
      if (c[r] == nullptr) continue;
      EXPECT_EQ(ncclCommDestroy(c[r]), ncclSuccess) << ncclGetLastError(c[r]);
    }
  }
  MockCudart& rt;  // the mock runtime the streams belong to
};

}  // namespace loom::testing
