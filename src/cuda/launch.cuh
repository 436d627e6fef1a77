// Private to cuda/: launch geometry shared by the kernels' translation units.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

namespace hsdp::gpu::detail {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over `work` items: enough to fill every SM several times over
// (memory-bound kernels need many loads in flight), never more than there are items.
inline unsigned gridFor(size_t work) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      sms <= 0)
    sms = 132;
  const size_t want = (work + kThreads - 1) / kThreads;
  const size_t cap = static_cast<size_t>(sms) * 8;
  return static_cast<unsigned>(std::max<size_t>(1, std::min(want, cap)));
}

// Round to nearest even; NaN becomes a quiet NaN with the same sign and top payload bits: the
// bit-level rule of hsdp::toBf16 (cuda_bf16.h's __float2bfloat16_rn returns a canonical NaN
// instead, which would break bitwise agreement with the CPU path).
__device__ __forceinline__ unsigned short bf16Bits(float f) {
  const unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((u >> 16) | 0x40u);
  return static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float bf16ToFloat(unsigned short b) {
  return __uint_as_float(static_cast<unsigned>(b) << 16);
}

}  // namespace hsdp::gpu::detail
