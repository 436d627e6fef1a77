#include "src/buffer_pool.h"

#include <algorithm>
#include <cstring>

#include "hsdp/log.h"

namespace hsdp {

Status BufferPool::init(size_t block_bytes, int initial_blocks) {
  if (!blocks_.empty()) return failedPrecondition("buffer pool initialised twice");
  block_bytes_ = block_bytes;
  for (int i = 0; i < initial_blocks; ++i) {
    HSDP_ASSIGN_OR_RETURN(HostBuffer b, HostBuffer::allocate(block_bytes_));
    free_.push_back(b.data());
    blocks_.push_back(std::move(b));
  }
  return okStatus();
}

StatusOr<void*> BufferPool::acquire(bool zero) {
  if (free_.empty()) {
    // Once per new peak of blocks alive at once (e.g. gradients still being reduced while
    // backward goes on, or accumulation holding every unit's gradient); reused from then on.
    HSDP_INFO(kShard, "buffer pool grows to ", blocks_.size() + 1, " blocks of ", block_bytes_,
              " bytes");
    HSDP_ASSIGN_OR_RETURN(HostBuffer b, HostBuffer::allocate(block_bytes_));
    free_.push_back(b.data());
    blocks_.push_back(std::move(b));
  }
  void* p = free_.back();
  free_.pop_back();
  ++in_use_;
  peak_ = std::max(peak_, in_use_);
  if (zero) std::memset(p, 0, block_bytes_);
  return p;
}

Status BufferPool::release(void* block) {
  bool ours = std::any_of(blocks_.begin(), blocks_.end(),
                          [&](const HostBuffer& b) { return b.data() == block; });
  if (!ours || std::find(free_.begin(), free_.end(), block) != free_.end())
    return failedPrecondition("buffer pool: release of a block that is not in use");
  free_.push_back(block);
  --in_use_;
  return okStatus();
}

}  // namespace hsdp
