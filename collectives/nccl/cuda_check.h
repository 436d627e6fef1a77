// HSDP_CUDA_CHECK: the one way hsdp calls the CUDA runtime. A failing call becomes an INTERNAL
// Status carrying CUDA's error name and string, the call and file:line.
#pragma once

#include <cuda_runtime.h>

#include "core/api_check.h"
#include "hsdp/status.h"

namespace hsdp::gpu {

// The Status of a failed call. The error is also cleared from the thread's last-error state
// (cudaGetLastError): it is reported here, and left there a non-sticky error (a bad device
// ordinal, a failed cudaHostRegister) would resurface at the next launcher's
// HSDP_CUDA_CHECK(cudaGetLastError()) and fail an unrelated kernel. Sticky errors stay sticky.
Status cudaFailure(cudaError_t err, const char* call, const char* file, int line);

}  // namespace hsdp::gpu

// For calls that return cudaError_t.
#define HSDP_CUDA_CHECK(call) HSDP_API_CHECK(call, #call, cudaSuccess, ::hsdp::gpu::cudaFailure)
