#include "collectives/nccl/cuda_check.h"

namespace hsdp::gpu {

Status cudaFailure(cudaError_t err, const char* call, const char* file, int line) {
  (void)cudaGetLastError();  // why: see cuda_check.h
  return apiCallError("CUDA", err, strCat(cudaGetErrorName(err), ": ", cudaGetErrorString(err)),
                      call, file, line);
}

}  // namespace hsdp::gpu
