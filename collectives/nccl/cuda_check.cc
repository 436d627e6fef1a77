#include "collectives/nccl/cuda_check.h"

namespace hsdp::gpu {

Status cudaFailure(cudaError_t err, const char* call, const char* file, int line) {
  return internalError("CUDA error ", static_cast<int>(err), " (", cudaGetErrorName(err), ": ",
                       cudaGetErrorString(err), ") in ", call, " at ", file, ":", line);
}

}  // namespace hsdp::gpu
