// The mock CUDA runtime's stream and memory API, for tests that drive the
// shim with it: opens the same library file the shim was pointed at
// (LOOM_CUDART_LIBRARY), so dlopen returns the instance the shim uses.
// Functions the loaded mock lacks are null (the allocation counters exist
// only in the staging build).
#pragma once

#include <dlfcn.h>

#include <cstddef>

#include "nccl.h"

namespace loom::testing {

struct MockCudart {
  explicit MockCudart(const char* path) : lib(dlopen(path, RTLD_NOW | RTLD_LOCAL)) {}
  void* lib;
  template <typename F>
  F sym(const char* name) {
    return reinterpret_cast<F>(lib != nullptr ? dlsym(lib, name) : nullptr);
  }
  int (*stream_create)(cudaStream_t*) = sym<int (*)(cudaStream_t*)>("cudaStreamCreate");
  int (*stream_sync)(cudaStream_t) = sym<int (*)(cudaStream_t)>("cudaStreamSynchronize");
  int (*stream_destroy)(cudaStream_t) = sym<int (*)(cudaStream_t)>("cudaStreamDestroy");
  int (*malloc_dev)(void**, size_t) = sym<int (*)(void**, size_t)>("cudaMalloc");
  int (*free_dev)(void*) = sym<int (*)(void*)>("cudaFree");
  int (*set_device)(int) = sym<int (*)(int)>("cudaSetDevice");
  // After the stream's prior work, sleep delay_ms, then copy (test hook).
  int (*enqueue_copy)(cudaStream_t, void*, const void*, size_t, int) =
      sym<int (*)(cudaStream_t, void*, const void*, size_t, int)>("loom_mock_stream_enqueue_copy");
  int (*set_capturing)(cudaStream_t, int) = sym<int (*)(cudaStream_t, int)>("loom_mock_stream_set_capturing");
  long (*host_live)() = sym<long (*)()>("loom_mock_host_allocs_live");
  long (*host_total)() = sym<long (*)()>("loom_mock_host_allocs_total");
};

}  // namespace loom::testing
