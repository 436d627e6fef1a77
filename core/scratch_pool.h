// Scratch slots for operations in flight: each outstanding operation that needs staging holds
// one slot. Slots are allocated once (page aligned, pre-faulted) and reused; a slot made on the
// hot path is logged, since reserve() ahead of time avoids it.
#pragma once

#include <memory>
#include <vector>

#include "core/host_buffer.h"

namespace hsdp {

class ScratchPool {
 public:
  StatusOr<HostBuffer*> acquire(size_t bytes);
  void release(HostBuffer* slot);
  [[nodiscard]] Status reserve(size_t bytes);  // at least one free slot of `bytes`
  size_t totalBytes() const;

 private:
  std::vector<std::unique_ptr<HostBuffer>> slots_;
  std::vector<HostBuffer*> free_;
};

}  // namespace hsdp
