#include "collectives/nccl/cuda_resources.h"

#include <utility>

#include "collectives/nccl/cuda_check.h"
#include "hsdp/log.h"

namespace hsdp::gpu {
namespace {

// Destructors cannot return a Status; a failure there (usually a sticky error from an earlier
// fault, already reported) is logged.
void logRelease(cudaError_t err, const char* what) {
  if (err != cudaSuccess && err != cudaErrorCudartUnloading)
    HSDP_WARN(kInit, "releasing a CUDA ", what, " failed: ", cudaGetErrorName(err), " (",
              cudaGetErrorString(err), ")");
}

}  // namespace

int deviceCount(std::string* why) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why)
      *why =
          strCat("cudaGetDeviceCount: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
    (void)cudaGetLastError();  // not sticky; keep it from surfacing in a later check
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount: 0 devices";
  return n;
}

Status checkDevicePointer(const void* p, int device) {
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return invalidArgument(p, " is not memory CUDA knows (", cudaGetErrorString(err), ")");
  }
  if (attr.type == cudaMemoryTypeManaged) return okStatus();
  if (attr.type == cudaMemoryTypeDevice && attr.device == device) return okStatus();
  if (attr.type == cudaMemoryTypeDevice)
    return invalidArgument(p, " is on device ", attr.device, ", not device ", device);
  return invalidArgument(p, " is host memory, not device memory");
}

StatusOr<DeviceGuard> DeviceGuard::set(int device) {
  int previous = -1;
  HSDP_CUDA_CHECK(cudaGetDevice(&previous));
  if (previous != device) HSDP_CUDA_CHECK(cudaSetDevice(device));
  return DeviceGuard(previous == device ? -1 : previous);
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) logRelease(cudaSetDevice(previous_), "device guard");
}

// ---- DeviceBuffer ------------------------------------------------------------------------------

StatusOr<DeviceBuffer> DeviceBuffer::allocate(size_t bytes) {
  DeviceBuffer b;
  HSDP_CUDA_CHECK(cudaGetDevice(&b.device_));
  if (bytes > 0) {
    cudaError_t err = cudaMalloc(&b.data_, bytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return Status(StatusCode::kResourceExhausted,
                    strCat("cudaMalloc of ", bytes, " bytes on device ", b.device_, ": ",
                           cudaGetErrorString(err)));
    }
    HSDP_CUDA_CHECK(err);
  }
  b.size_ = bytes;
  return b;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      device_(std::exchange(o.device_, -1)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    device_ = std::exchange(o.device_, -1);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

void DeviceBuffer::reset() {
  if (data_ != nullptr) logRelease(cudaFree(data_), "device buffer");
  data_ = nullptr;
  size_ = 0;
}

// ---- PinnedBuffer ------------------------------------------------------------------------------

StatusOr<PinnedBuffer> PinnedBuffer::allocate(size_t bytes) {
  PinnedBuffer b;
  if (bytes > 0) {
    cudaError_t err = cudaHostAlloc(&b.data_, bytes, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return Status(StatusCode::kResourceExhausted,
                    strCat("cudaHostAlloc of ", bytes, " bytes: ", cudaGetErrorString(err)));
    }
    HSDP_CUDA_CHECK(err);
  }
  b.size_ = bytes;
  return b;
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() { reset(); }

void PinnedBuffer::reset() {
  if (data_ != nullptr) logRelease(cudaFreeHost(data_), "pinned host buffer");
  data_ = nullptr;
  size_ = 0;
}

// ---- Stream ------------------------------------------------------------------------------------

StatusOr<Stream> Stream::create(std::string name, int priority) {
  Stream s;
  HSDP_CUDA_CHECK(cudaStreamCreateWithPriority(&s.stream_, cudaStreamNonBlocking, priority));
  s.name_ = std::move(name);
  return s;
}

Stream::Stream(Stream&& o) noexcept
    : stream_(std::exchange(o.stream_, nullptr)), name_(std::move(o.name_)) {}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    reset();
    stream_ = std::exchange(o.stream_, nullptr);
    name_ = std::move(o.name_);
  }
  return *this;
}

Stream::~Stream() { reset(); }

void Stream::reset() {
  // cudaStreamDestroy returns at once; work still queued on the stream completes first.
  if (stream_ != nullptr) logRelease(cudaStreamDestroy(stream_), "stream");
  stream_ = nullptr;
}

// ---- Event -------------------------------------------------------------------------------------

StatusOr<Event> Event::create(bool timing) {
  Event e;
  HSDP_CUDA_CHECK(
      cudaEventCreateWithFlags(&e.event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  return e;
}

Event::Event(Event&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    reset();
    event_ = std::exchange(o.event_, nullptr);
  }
  return *this;
}

Event::~Event() { reset(); }

void Event::reset() {
  if (event_ != nullptr) logRelease(cudaEventDestroy(event_), "event");
  event_ = nullptr;
}

}  // namespace hsdp::gpu
