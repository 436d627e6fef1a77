// Sum of squares of a device shard (the engine's gradient norm for clipping), in double, with a
// fixed reduction order: every block writes its partial to scratch[block], then one block sums
// the partials. No atomics, so the result is the same bits every time for the same input (a
// global norm that wobbled between runs would make clipping irreproducible).
#include <algorithm>

#include "collectives/nccl/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace hsdp::gpu {
namespace {

// Tree sum of the block's values in shared memory; thread 0 gets the total.
__device__ double blockSum(double v) {
  __shared__ double s[detail::kThreads];
  s[threadIdx.x] = v;
  __syncthreads();
  for (unsigned w = detail::kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) s[threadIdx.x] = __dadd_rn(s[threadIdx.x], s[threadIdx.x + w]);
    __syncthreads();
  }
  return s[0];
}

__global__ void __launch_bounds__(detail::kThreads)
    partialSquaresKernel(const float* __restrict__ x, size_t n, double* __restrict__ partials) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  double sum = 0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double v = x[i];
    sum = __dadd_rn(sum, __dmul_rn(v, v));
  }
  const double total = blockSum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void __launch_bounds__(detail::kThreads)
    finishSquaresKernel(const double* __restrict__ partials, unsigned blocks, double* acc) {
  double sum = 0;
  for (unsigned i = threadIdx.x; i < blocks; i += blockDim.x) sum = __dadd_rn(sum, partials[i]);
  const double total = blockSum(sum);
  if (threadIdx.x == 0) *acc = __dadd_rn(*acc, total);
}

__global__ void doubleToFloatKernel(const double* __restrict__ in, float* __restrict__ out,
                                    size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __double2float_rn(in[i]);
}

}  // namespace

Status sumSquares(const float* x, size_t n, double* acc, double* scratch, cudaStream_t stream) {
  if (n == 0) return okStatus();
  if (x == nullptr || acc == nullptr || scratch == nullptr)
    return invalidArgument("sumSquares: null array (x ", x, ", acc ", acc, ", scratch ", scratch,
                           ") with ", n, " elements");
  const unsigned blocks =
      static_cast<unsigned>(std::min<size_t>(detail::gridFor(n), kSumSquaresScratch));
  partialSquaresKernel<<<blocks, detail::kThreads, 0, stream>>>(x, n, scratch);
  HSDP_CUDA_CHECK(cudaGetLastError());
  finishSquaresKernel<<<1, detail::kThreads, 0, stream>>>(scratch, blocks, acc);
  HSDP_CUDA_CHECK(cudaGetLastError());
  return okStatus();
}

Status castDoubleToFloat(const double* in, float* out, size_t n, cudaStream_t stream) {
  if (n == 0) return okStatus();
  if (in == nullptr || out == nullptr)
    return invalidArgument("castDoubleToFloat: null array with ", n, " elements");
  doubleToFloatKernel<<<detail::gridFor(n), detail::kThreads, 0, stream>>>(in, out, n);
  HSDP_CUDA_CHECK(cudaGetLastError());
  return okStatus();
}

}  // namespace hsdp::gpu
