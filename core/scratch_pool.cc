#include "core/scratch_pool.h"

#include "hsdp/log.h"

namespace hsdp {

StatusOr<HostBuffer*> ScratchPool::acquire(size_t bytes) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if ((*it)->size() >= bytes) {
      HostBuffer* s = *it;
      free_.erase(it);
      return s;
    }
  }
  // Once per new peak of operations in flight; from then on the slot is reused.
  HSDP_INFO(kColl, "scratch pool grows to ", slots_.size() + 1, " slots (", bytes,
            " bytes) for one more operation in flight");
  HSDP_ASSIGN_OR_RETURN(HostBuffer b, HostBuffer::allocate(bytes));
  slots_.push_back(std::make_unique<HostBuffer>(std::move(b)));
  return slots_.back().get();
}

void ScratchPool::release(HostBuffer* slot) { free_.push_back(slot); }

Status ScratchPool::reserve(size_t bytes) {
  for (HostBuffer* s : free_)
    if (s->size() >= bytes) return okStatus();
  HSDP_ASSIGN_OR_RETURN(HostBuffer b, HostBuffer::allocate(bytes));
  slots_.push_back(std::make_unique<HostBuffer>(std::move(b)));
  free_.push_back(slots_.back().get());
  return okStatus();
}

size_t ScratchPool::totalBytes() const {
  size_t n = 0;
  for (const auto& s : slots_) n += s->size();
  return n;
}

}  // namespace hsdp
