// Fixed-size blocks for gathered parameters and full gradients. FSDP frees a unit's gathered
// buffer after use; here "free" returns the block to the pool, because allocating fresh memory
// costs a page fault per 4 KiB on these machines. Capacity only grows (to the peak number of
// blocks alive at once), and the report counts both capacity and peak use.
#pragma once

#include <cstddef>
#include <vector>

#include "hsdp/host_buffer.h"

namespace hsdp {

class BufferPool {
 public:
  BufferPool() = default;
  // Sets the block size and preallocates `initial_blocks` pre-faulted blocks.
  [[nodiscard]] Status init(size_t block_bytes, int initial_blocks);

  // A block of blockBytes(), zero-filled when `zero` (a gradient accumulates into it).
  StatusOr<void*> acquire(bool zero);
  [[nodiscard]] Status release(void* block);

  size_t blockBytes() const { return block_bytes_; }
  size_t capacityBytes() const { return blocks_.size() * block_bytes_; }
  size_t inUseBytes() const { return in_use_ * block_bytes_; }
  size_t peakBytes() const { return peak_ * block_bytes_; }

 private:
  size_t block_bytes_ = 0;
  std::vector<HostBuffer> blocks_;
  std::vector<void*> free_;
  size_t in_use_ = 0;
  size_t peak_ = 0;
};

}  // namespace hsdp
