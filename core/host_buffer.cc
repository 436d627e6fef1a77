#include "core/host_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <utility>

namespace hsdp {
namespace {
constexpr size_t kPage = 4096;
}

StatusOr<HostBuffer> HostBuffer::allocate(size_t bytes) {
  HostBuffer b;
  if (bytes == 0) return b;
  size_t rounded = (bytes + kPage - 1) / kPage * kPage;
  void* p = std::aligned_alloc(kPage, rounded);
  if (p == nullptr)
    return Status(StatusCode::kResourceExhausted, strCat("host allocation of ", bytes, " bytes"));
  // Touch every page now, once, instead of on the first collective that uses the buffer.
  std::memset(p, 0, rounded);
  b.data_ = p;
  b.bytes_ = bytes;
  return b;
}

// allocateNuma is in numa.cc, with the hwloc code.

void HostBuffer::release() {
  if (data_ == nullptr) return;
  // CUDA builds (HSDP_HAVE_CUDA), when allocateNuma pins the buffer: cudaHostUnregister(data_)
  // goes here, before the pages are unmapped.
  if (mapped_ > 0)
    munmap(static_cast<char*>(data_) - offset_, mapped_);
  else
    std::free(data_);
  data_ = nullptr;
  bytes_ = 0;
  mapped_ = 0;
  offset_ = 0;
  numa_nodes_.clear();
}

HostBuffer::~HostBuffer() { release(); }

HostBuffer::HostBuffer(HostBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      mapped_(std::exchange(o.mapped_, 0)),
      offset_(std::exchange(o.offset_, 0)),
      numa_nodes_(std::move(o.numa_nodes_)) {
  o.numa_nodes_.clear();
}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
    offset_ = std::exchange(o.offset_, 0);
    numa_nodes_ = std::move(o.numa_nodes_);
    o.numa_nodes_.clear();
  }
  return *this;
}

}  // namespace hsdp
