#include "gpu/cuda_owners.h"

namespace mlp::cuda {

hsdp::Status cudaFailure(cudaError_t err, const char* call, const char* file, int line) {
  (void)cudaGetLastError();
  return hsdp::internalError("CUDA error ", static_cast<int>(err), " (", cudaGetErrorName(err),
                             ": ", cudaGetErrorString(err), ") in ", call, " at ", file, ":", line);
}

int deviceCount(std::string* why) {
  int n = 0;
  if (cudaError_t err = cudaGetDeviceCount(&n); err != cudaSuccess) {
    if (why)
      *why = hsdp::strCat("cudaGetDeviceCount: ", cudaGetErrorName(err), " (",
                          cudaGetErrorString(err), ")");
    (void)cudaGetLastError();  // not sticky; keep it from surfacing in a later check
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount: 0 devices";
  return n;
}

hsdp::StatusOr<Stream> createStream() {
  cudaStream_t s = nullptr;
  MLP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream(s);
}

hsdp::StatusOr<Event> createEvent() {
  cudaEvent_t e = nullptr;
  MLP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return Event(e);
}

hsdp::StatusOr<DeviceGuard> DeviceGuard::set(int device) {
  int previous = -1;
  MLP_CUDA_CHECK(cudaGetDevice(&previous));
  MLP_CUDA_CHECK(cudaSetDevice(device));
  return DeviceGuard(previous);
}

}  // namespace mlp::cuda
