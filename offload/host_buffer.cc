#include "hsdp/host_buffer.h"

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

HostBuffer::~HostBuffer() { std::free(data_); }

HostBuffer::HostBuffer(HostBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

}  // namespace hsdp
