// The few CUDA runtime owners train_mlp_gpu needs, on the CUDA runtime API and hsdp's public
// Status alone (no hsdp-private header), so the example builds against an installed hsdp
// (tests/consumer): a check macro that turns a failing call into a Status, device and pinned
// buffers, a stream, an event, and a guard of the current device. Each owner frees what it holds.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>

#include "hsdp/status.h"

namespace mlp::cuda {

// A failing CUDA call as an INTERNAL Status carrying CUDA's error name and string, the call and
// file:line. The error is also cleared from the thread's last-error state, so a non-sticky error
// does not resurface at an unrelated later check.
hsdp::Status cudaFailure(cudaError_t err, const char* call, const char* file, int line);

}  // namespace mlp::cuda

// A call of a GPU library that returns its error code: anything but `ok` returns
// failure(code, call, file, line), the library's Status (cudaFailure; cublasFailure in
// gpu/mlp_cuda.h).
#define MLP_GPU_CHECK(call, ok, failure)                                               \
  do {                                                                                 \
    const auto mlp_gpu_err_ = (call);                                                  \
    if (mlp_gpu_err_ != (ok)) return failure(mlp_gpu_err_, #call, __FILE__, __LINE__); \
  } while (0)
#define MLP_CUDA_CHECK(call) MLP_GPU_CHECK(call, cudaSuccess, ::mlp::cuda::cudaFailure)

namespace mlp::cuda {

// CUDA devices this process can use; 0 (with CUDA's reason in *why) when there is no driver, no
// device, or the runtime cannot start.
int deviceCount(std::string* why);

// Memory of `bytes` bytes: Device (cudaMalloc) or Pinned (cudaMallocHost: page-locked host
// memory, what an asynchronous copy needs).
struct DeviceMemory {
  static cudaError_t allocate(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
  void operator()(void* p) const { (void)cudaFree(p); }
};
struct PinnedMemory {
  static cudaError_t allocate(void** p, size_t bytes) { return cudaMallocHost(p, bytes); }
  void operator()(void* p) const { (void)cudaFreeHost(p); }
};
template <class Memory>
class Buffer {
 public:
  Buffer() = default;
  static hsdp::StatusOr<Buffer> allocate(size_t bytes) {
    void* p = nullptr;
    MLP_CUDA_CHECK(Memory::allocate(&p, bytes));
    Buffer b;
    b.data_.reset(p);
    b.size_ = bytes;
    return b;
  }
  void* data() const { return data_.get(); }
  size_t size() const { return size_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_.get());
  }

 private:
  std::unique_ptr<void, Memory> data_;
  size_t size_ = 0;
};
using DeviceBuffer = Buffer<DeviceMemory>;
using PinnedBuffer = Buffer<PinnedMemory>;

struct StreamDestroy {
  void operator()(cudaStream_t s) const { (void)cudaStreamDestroy(s); }
};
struct EventDestroy {
  void operator()(cudaEvent_t e) const { (void)cudaEventDestroy(e); }
};
using Stream = std::unique_ptr<CUstream_st, StreamDestroy>;
using Event = std::unique_ptr<CUevent_st, EventDestroy>;
// A non-blocking stream (it does not synchronise with the legacy default stream).
hsdp::StatusOr<Stream> createStream();
// An event without timing (the cheapest to record and wait on).
hsdp::StatusOr<Event> createEvent();

// Makes `device` current for the guard's lifetime and restores the previous one afterwards.
class DeviceGuard {
 public:
  static hsdp::StatusOr<DeviceGuard> set(int device);
  DeviceGuard(DeviceGuard&& o) noexcept : previous_(o.previous_) { o.previous_ = -1; }
  DeviceGuard& operator=(DeviceGuard&&) = delete;
  DeviceGuard(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }

 private:
  explicit DeviceGuard(int previous) : previous_(previous) {}
  int previous_;  // -1: nothing to restore
};

}  // namespace mlp::cuda
