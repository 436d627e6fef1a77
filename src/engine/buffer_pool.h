// Fixed-size blocks for gathered parameters and full gradients. FSDP frees a unit's gathered
// buffer after use; here "free" returns the block to the pool, because allocating fresh memory
// costs a page fault per 4 KiB on these machines (and a cudaMalloc synchronises the device).
// Capacity only grows (to the peak number of blocks alive at once), and the report counts both
// capacity and peak use. Blocks live in the engine's memory space (core/memory_space.h); on a
// device a released block is handed out again only after its last use (an event), so reuse is
// ordered on the streams rather than by waiting on the host.
#pragma once

#include <cstddef>
#include <vector>

#include "core/memory_space.h"

namespace hsdp {

class BufferPool {
 public:
  BufferPool() = default;
  // Sets the space, the block size and preallocates `initial_blocks` pre-faulted blocks.
  [[nodiscard]] Status init(MemorySpace* space, size_t block_bytes, int initial_blocks);

  // A block of blockBytes(), zero-filled when `zero` (a gradient accumulates into it). Work on
  // the compute lane from now on is ordered after the block's previous use.
  StatusOr<void*> acquire(bool zero);
  // The block's last use is the work enqueued on `lane` so far.
  [[nodiscard]] Status release(void* block, Lane lane = Lane::kCompute);

  size_t blockBytes() const { return block_bytes_; }
  size_t capacityBytes() const { return blocks_.size() * block_bytes_; }
  size_t inUseBytes() const { return in_use_ * block_bytes_; }
  size_t peakBytes() const { return peak_ * block_bytes_; }

 private:
  const SpaceBuffer* find(void* block) const;
  MemorySpace* space_ = nullptr;
  size_t block_bytes_ = 0;
  std::vector<SpaceBuffer> blocks_;
  std::vector<void*> free_;
  size_t in_use_ = 0;
  size_t peak_ = 0;
};

}  // namespace hsdp
