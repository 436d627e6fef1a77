// RAII owners of CUDA resources: device buffers, pinned host buffers, streams, events, and a
// guard that makes a device current for a scope. Each is created by a factory returning
// StatusOr (failures carry CUDA's message through HSDP_CUDA_CHECK), is move-only, and releases
// its resource in the destructor without throwing (a failure there is logged, not returned).
//
//   HSDP_ASSIGN_OR_RETURN(gpu::DeviceBuffer buf, gpu::DeviceBuffer::allocate(bytes));
//   HSDP_ASSIGN_OR_RETURN(gpu::Stream s, gpu::Stream::create("offload-d2h"));
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "hsdp/status.h"

namespace hsdp::gpu {

// CUDA devices this process can use; 0 when there is no driver, no device, or the runtime cannot
// start (never an error: callers decide whether that is fatal; tests skip). When 0 and `why` is
// not null, *why receives CUDA's reason.
int deviceCount(std::string* why = nullptr);

// OK when `p` is device memory of `device` or managed memory; otherwise an InvalidArgument that
// says what it is ("<p> is host memory", "... is on device 1, not device 0", "... is not memory
// CUDA knows"). Kernels and NCCL would fault on such a pointer, and a fault poisons the context.
Status checkDevicePointer(const void* p, int device);

// Makes `device` current for the guard's lifetime and restores the previous one afterwards.
class DeviceGuard {
 public:
  static StatusOr<DeviceGuard> set(int device);
  DeviceGuard(DeviceGuard&& o) noexcept : previous_(o.previous_) { o.previous_ = -1; }
  DeviceGuard& operator=(DeviceGuard&&) = delete;
  DeviceGuard(const DeviceGuard&) = delete;
  ~DeviceGuard();

 private:
  explicit DeviceGuard(int previous) : previous_(previous) {}
  int previous_;  // -1: nothing to restore
};

// Device memory (cudaMalloc on the current device).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static StatusOr<DeviceBuffer> allocate(size_t bytes);
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }
  int device() const { return device_; }

 private:
  void reset();
  void* data_ = nullptr;
  size_t size_ = 0;
  int device_ = -1;
};

// Page-locked host memory (cudaHostAlloc, portable to every device): full-speed H2D/D2H copies
// that can run asynchronously on a stream.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static StatusOr<PinnedBuffer> allocate(size_t bytes);
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }

 private:
  void reset();
  void* data_ = nullptr;
  size_t size_ = 0;
};

// A non-blocking stream (no implicit ordering with the legacy default stream: work is ordered
// with events) on the current device. The name says what the stream is for, in logs and errors.
class Stream {
 public:
  Stream() = default;
  static StatusOr<Stream> create(std::string name, int priority = 0);
  Stream(Stream&& o) noexcept;
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  cudaStream_t get() const { return stream_; }
  const std::string& name() const { return name_; }

 private:
  void reset();
  cudaStream_t stream_ = nullptr;
  std::string name_;
};

// An event. Without timing (the default) it is only for ordering and completion queries, which
// is cheaper to record.
class Event {
 public:
  Event() = default;
  static StatusOr<Event> create(bool timing = false);
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  cudaEvent_t get() const { return event_; }

 private:
  void reset();
  cudaEvent_t event_ = nullptr;
};

}  // namespace hsdp::gpu
