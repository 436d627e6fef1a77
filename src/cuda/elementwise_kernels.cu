// Casts between fp32 and bf16 and in-place scaling on device buffers: grid-stride loops, each
// element independent, so any length and alignment work.
#include <cmath>

#include "collectives/nccl/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace hsdp::gpu {
namespace {

__global__ void toBf16Kernel(const float* __restrict__ in, unsigned short* __restrict__ out,
                             size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = detail::bf16Bits(in[i]);
}

__global__ void toFloatKernel(const unsigned short* __restrict__ in, float* __restrict__ out,
                              size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = detail::bf16ToFloat(in[i]);
}

__global__ void scaleFloatKernel(float* __restrict__ x, float factor, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = __fmul_rn(x[i], factor);
}

__global__ void scaleBf16Kernel(unsigned short* __restrict__ x, float factor, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = detail::bf16Bits(__fmul_rn(detail::bf16ToFloat(x[i]), factor));
}

Status nullArray(const char* what, size_t n) {
  return invalidArgument(what, ": null array with ", n, " elements");
}

}  // namespace

Status castToBf16(const float* in, bf16* out, size_t n, cudaStream_t stream) {
  if (n == 0) return okStatus();
  if (in == nullptr || out == nullptr) return nullArray("castToBf16", n);
  toBf16Kernel<<<detail::gridFor(n), detail::kThreads, 0, stream>>>(
      in, reinterpret_cast<unsigned short*>(out), n);
  HSDP_CUDA_CHECK(cudaGetLastError());
  return okStatus();
}

Status castToFloat(const bf16* in, float* out, size_t n, cudaStream_t stream) {
  if (n == 0) return okStatus();
  if (in == nullptr || out == nullptr) return nullArray("castToFloat", n);
  toFloatKernel<<<detail::gridFor(n), detail::kThreads, 0, stream>>>(
      reinterpret_cast<const unsigned short*>(in), out, n);
  HSDP_CUDA_CHECK(cudaGetLastError());
  return okStatus();
}

Status scale(void* x, size_t n, DType dtype, float factor, cudaStream_t stream) {
  if (!std::isfinite(factor)) return invalidArgument("scale: factor ", factor, " is not finite");
  if (n == 0) return okStatus();
  if (x == nullptr) return nullArray("scale", n);
  if (dtype == DType::kFloat32) {
    scaleFloatKernel<<<detail::gridFor(n), detail::kThreads, 0, stream>>>(static_cast<float*>(x),
                                                                          factor, n);
  } else if (dtype == DType::kBFloat16) {
    scaleBf16Kernel<<<detail::gridFor(n), detail::kThreads, 0, stream>>>(
        static_cast<unsigned short*>(x), factor, n);
  } else {
    return invalidArgument("scale: ", dtypeName(dtype), " is not a floating type");
  }
  HSDP_CUDA_CHECK(cudaGetLastError());
  return okStatus();
}

}  // namespace hsdp::gpu
