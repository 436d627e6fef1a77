// Block quantization of device buffers: the wire formats int8 and int4 of hsdp/quantize.h, the
// same bits as the host kernels (core/quantize_*.cc) on the same input, NaN payloads aside (a
// GPU multiply returns the canonical NaN). Per quantization block one CUDA block: the threads
// take the integer maximum of |x|'s bits (a warp shuffle, then shared memory), thread 0 forms
// scale = absmax / L and inv = L / absmax with IEEE division, and every thread encodes its
// elements with one rounded multiply and a round to nearest even (__float2int_rn); error
// feedback adds and subtracts with single roundings (__fadd_rn, __fsub_rn). Decoding is a
// grid-stride loop over elements. No FMA (the intrinsics, and --fmad=false for the module).
#include "collectives/nccl/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace hsdp::gpu {
namespace {

constexpr unsigned kAbsMask = 0x7fffffffu;
constexpr unsigned kInfBits = 0x7f800000u;
constexpr unsigned kMinAbsBits = 0x0d800000u;  // 2^-100, hsdp::kMinQuantAbsMax
constexpr unsigned kQuietNanBits = 0x7fc00000u;
constexpr int kWarps = detail::kThreads / 32;

enum Kind : int { kNormal = 0, kZero = 1, kNonFinite = 2 };

__device__ __forceinline__ int codeOf(float x, float inv, int levels) {
  const int q = __float2int_rn(__fmul_rn(x, inv));
  return max(-levels, min(levels, q));
}

// One thread's element: the value encoded and, with error feedback, its new residual.
template <bool kRes>
__device__ __forceinline__ float valueAt(const float* s, const float* r, size_t i) {
  return kRes ? __fadd_rn(s[i], r[i]) : s[i];
}

template <bool kRes, bool kInt4>
__global__ void encodeKernel(const float* __restrict__ src, float* __restrict__ res, size_t n,
                             unsigned block, size_t stride, unsigned char* __restrict__ dst) {
  __shared__ unsigned warp_max[kWarps];
  __shared__ float s_scale, s_inv;
  __shared__ int s_kind;
  const int levels = kInt4 ? 7 : 127;
  const size_t blocks = (n + block - 1) / block;
  for (size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const size_t off = b * block, len = min(static_cast<size_t>(block), n - off);
    const float* s = src + off;
    float* r = kRes ? res + off : nullptr;
    unsigned m = 0;
    for (size_t i = threadIdx.x; i < len; i += blockDim.x)
      m = max(m, __float_as_uint(valueAt<kRes>(s, r, i)) & kAbsMask);
    for (int d = 16; d > 0; d /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, d));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    unsigned char* out = dst + b * stride;
    if (threadIdx.x == 0) {
      unsigned amax = 0;
      for (int w = 0; w < kWarps; ++w) amax = max(amax, warp_max[w]);
      float scale = 0.0f, inv = 0.0f;
      int kind = kZero;
      if (amax >= kInfBits) {
        kind = kNonFinite;
        scale = __uint_as_float(kQuietNanBits);
      } else if (amax >= kMinAbsBits) {
        kind = kNormal;
        const float a = __uint_as_float(amax), l = static_cast<float>(levels);
        scale = __fdiv_rn(a, l);
        inv = __fdiv_rn(l, a);
      }
      s_scale = scale;
      s_inv = inv;
      s_kind = kind;
      const unsigned bits = __float_as_uint(scale);
      for (int k = 0; k < 4; ++k) out[k] = static_cast<unsigned char>(bits >> (8 * k));
    }
    __syncthreads();
    const float scale = s_scale, inv = s_inv;
    const int kind = s_kind;
    // The code of element i and its residual (zero blocks keep x, non-finite ones reset to 0).
    auto encode = [&](size_t i) {
      const float x = valueAt<kRes>(s, r, i);
      const int q = kind == kNormal ? codeOf(x, inv, levels) : 0;
      if (kRes)
        r[i] = kind == kNormal ? __fsub_rn(x, __fmul_rn(__int2float_rn(q), scale))
               : kind == kZero ? x
                               : 0.0f;
      return q;
    };
    if (kInt4) {
      for (size_t p = threadIdx.x; 2 * p < len; p += blockDim.x) {
        unsigned byte = static_cast<unsigned>(encode(2 * p) + 8);
        if (2 * p + 1 < len) byte |= static_cast<unsigned>(encode(2 * p + 1) + 8) << 4;
        out[4 + p] = static_cast<unsigned char>(byte);
      }
    } else {
      for (size_t i = threadIdx.x; i < len; i += blockDim.x)
        out[4 + i] = static_cast<unsigned char>(static_cast<signed char>(encode(i)));
    }
    __syncthreads();  // the shared parameters are rewritten for the next block
  }
}

template <bool kAcc, bool kInt4>
__global__ void decodeKernel(const unsigned char* __restrict__ src, size_t n, unsigned block,
                             size_t stride, float* __restrict__ dst) {
  const size_t step = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const size_t b = i / block, within = i - b * block;
    const unsigned char* in = src + b * stride;
    const float scale =
        __uint_as_float(static_cast<unsigned>(in[0]) | static_cast<unsigned>(in[1]) << 8 |
                        static_cast<unsigned>(in[2]) << 16 | static_cast<unsigned>(in[3]) << 24);
    const int q = kInt4 ? static_cast<int>((in[4 + within / 2] >> (4 * (within & 1))) & 15) - 8
                        : static_cast<int>(static_cast<signed char>(in[4 + within]));
    const float v = __fmul_rn(__int2float_rn(q), scale);
    dst[i] = kAcc ? __fadd_rn(dst[i], v) : v;
  }
}

Status checkArgs(const char* what, const WireFormat& f, const void* a, const void* b, size_t n) {
  if (!wireQuantized(f.wire))
    return invalidArgument(what, ": wire ", wireName(f.wire), " is not int8 or int4");
  HSDP_RETURN_IF_ERROR(validate(f));
  if (n > 0 && (a == nullptr || b == nullptr))
    return invalidArgument(what, ": null array with ", n, " elements");
  return okStatus();
}

size_t strideOf(const WireFormat& f) {
  return f.wire == Wire::kInt8 ? 4 + size_t{f.block} : 4 + size_t{f.block} / 2;
}

}  // namespace

Status quantize(const WireFormat& f, const float* src, size_t n, void* dst, float* residual,
                cudaStream_t stream) {
  HSDP_RETURN_IF_ERROR(checkArgs("quantize", f, src, dst, n));
  if (n == 0) return okStatus();
  const size_t blocks = (n + f.block - 1) / f.block;
  const unsigned grid = static_cast<unsigned>(std::min<size_t>(blocks, 65535));
  auto* out = static_cast<unsigned char*>(dst);
  const bool int4 = f.wire == Wire::kInt4;
  const size_t stride = strideOf(f);
  if (residual != nullptr && int4)
    encodeKernel<true, true>
        <<<grid, detail::kThreads, 0, stream>>>(src, residual, n, f.block, stride, out);
  else if (residual != nullptr)
    encodeKernel<true, false>
        <<<grid, detail::kThreads, 0, stream>>>(src, residual, n, f.block, stride, out);
  else if (int4)
    encodeKernel<false, true>
        <<<grid, detail::kThreads, 0, stream>>>(src, nullptr, n, f.block, stride, out);
  else
    encodeKernel<false, false>
        <<<grid, detail::kThreads, 0, stream>>>(src, nullptr, n, f.block, stride, out);
  HSDP_CUDA_CHECK(cudaGetLastError());
  return okStatus();
}

Status dequantize(const WireFormat& f, const void* src, size_t n, float* dst, bool accumulate,
                  cudaStream_t stream) {
  HSDP_RETURN_IF_ERROR(checkArgs("dequantize", f, src, dst, n));
  if (n == 0) return okStatus();
  const auto* in = static_cast<const unsigned char*>(src);
  const bool int4 = f.wire == Wire::kInt4;
  const size_t stride = strideOf(f);
  const unsigned grid = detail::gridFor(n);
  if (accumulate && int4)
    decodeKernel<true, true><<<grid, detail::kThreads, 0, stream>>>(in, n, f.block, stride, dst);
  else if (accumulate)
    decodeKernel<true, false><<<grid, detail::kThreads, 0, stream>>>(in, n, f.block, stride, dst);
  else if (int4)
    decodeKernel<false, true><<<grid, detail::kThreads, 0, stream>>>(in, n, f.block, stride, dst);
  else
    decodeKernel<false, false><<<grid, detail::kThreads, 0, stream>>>(in, n, f.block, stride, dst);
  HSDP_CUDA_CHECK(cudaGetLastError());
  return okStatus();
}

}  // namespace hsdp::gpu
