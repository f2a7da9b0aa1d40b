// The registry behind loom::mem_alloc (include/loom/memory.h): every buffer
// this process allocated in a shared-memory file, so that a sender can tell
// its peers where a message's bytes live in a file they may map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "loom/status.h"

namespace loom::shared_buffers {

// Where [p, p + len) lies in a shared buffer of this process.
struct Ref {
  uint64_t id = 0;            // unique to this buffer: never reused, in any process (random base)
  int fd = -1;                // this process's descriptor of the buffer's file
  uint64_t inode = 0;         // of that file, for the peer to check what it got
  uint64_t offset = 0;        // of p in the file
  uint64_t file_bytes = 0;    // the file's size
};

Result<void*> allocate(size_t bytes);
// false when p is not the start of a live shared buffer.
bool release(void* p);
// The buffer holding all of [p, p + len), if any. Lock-free when no buffer is live.
std::optional<Ref> find(const void* p, size_t len);
// Buffers freed by this process so far. A peer that mapped buffers of this
// process drops them all when this number changes (include/loom/memory.h).
uint64_t releases();
size_t live();

}  // namespace loom::shared_buffers
