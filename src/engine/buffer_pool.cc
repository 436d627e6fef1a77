#include "engine/buffer_pool.h"

#include <algorithm>

#include "hsdp/log.h"

namespace hsdp {

Status BufferPool::init(MemorySpace* space, size_t block_bytes, int initial_blocks) {
  if (!blocks_.empty() || space_ != nullptr)
    return failedPrecondition("buffer pool initialised twice");
  space_ = space;
  block_bytes_ = block_bytes;
  for (int i = 0; i < initial_blocks; ++i) {
    HSDP_ASSIGN_OR_RETURN(SpaceBuffer b, space_->allocate(block_bytes_));
    free_.push_back(b.data());
    blocks_.push_back(std::move(b));
  }
  return okStatus();
}

const SpaceBuffer* BufferPool::find(void* block) const {
  for (const SpaceBuffer& b : blocks_)
    if (b.data() == block) return &b;
  return nullptr;
}

StatusOr<void*> BufferPool::acquire(bool zero) {
  if (space_ == nullptr) return failedPrecondition("buffer pool used before init()");
  if (free_.empty()) {
    // Once per new peak of blocks alive at once (e.g. gradients still being reduced while
    // backward goes on, or accumulation holding every unit's gradient); reused from then on.
    HSDP_INFO(kShard, "buffer pool grows to ", blocks_.size() + 1, " blocks of ", block_bytes_,
              " bytes");
    HSDP_ASSIGN_OR_RETURN(SpaceBuffer b, space_->allocate(block_bytes_));
    free_.push_back(b.data());
    blocks_.push_back(std::move(b));
  }
  void* p = free_.back();
  HSDP_RETURN_IF_ERROR(space_->awaitReuse(*find(p)));
  free_.pop_back();
  ++in_use_;
  peak_ = std::max(peak_, in_use_);
  if (zero) HSDP_RETURN_IF_ERROR(space_->zero(p, block_bytes_, Lane::kCompute));
  return p;
}

Status BufferPool::release(void* block, Lane lane) {
  const SpaceBuffer* b = find(block);
  if (b == nullptr || std::find(free_.begin(), free_.end(), block) != free_.end())
    return failedPrecondition("buffer pool: release of a block that is not in use");
  HSDP_RETURN_IF_ERROR(space_->markReleased(*b, lane));
  free_.push_back(block);
  --in_use_;
  return okStatus();
}

}  // namespace hsdp
