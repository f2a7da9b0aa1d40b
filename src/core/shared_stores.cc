#include "core/shared_stores.h"

#include <algorithm>
#include <cstring>

#include "core/config.h"
#include "diag/recorder.h"
#include "kernels/host_reduce.h"

namespace loom {

size_t SharedStores::copy(std::byte* dst, const std::byte* src, size_t n, size_t piece) {
  size_t streamed = 0;
  for (size_t off = 0; off < n;) {
    const size_t len = std::min(piece, n - off);
    std::byte* d = dst + off;
    const std::byte* s = src + off;
    off += len;
    if (!timed(len)) {
      if (cached_bytes(len, 0) == len) {
        std::memcpy(d, s, len);
      } else {
        kernels::stream_copy(d, s, len);
        ++streamed;
      }
      continue;
    }
    const int64_t t0 = diag::now_ns();
    const size_t cached = cached_bytes(len, t0);
    int64_t t1 = t0;
    if (cached > 0) {
      std::memcpy(d, s, cached);
      t1 = diag::now_ns();
    }
    if (cached < len) {
      kernels::stream_copy(d + cached, s + cached, len - cached);
      ++streamed;
    }
    record(cached, t1 - t0, t1);
  }
  return streamed;
}

SharedStores::Policy SharedStores::configured() {
  const int v = params::shm_stream_stores();
  return v < 0 ? Policy::kAuto : v == 0 ? Policy::kCached : Policy::kStreaming;
}

}  // namespace loom
