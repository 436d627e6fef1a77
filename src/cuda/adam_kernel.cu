// Fused Adam/AdamW over a device shard: one pass per element reading param, grad and both
// moments and writing param, both moments and optionally the bf16 copy (28 or 30 bytes per
// element against ~15 flops: memory-bound, so the kernel is a grid-stride loop with 16-byte
// vector loads and stores, and its speed is judged against a device-to-device copy).
//
// Bitwise contract (kernels.h): each element goes through hsdp::adamUpdate (core/adam_coeffs.h,
// the loop body of hsdp::adamStep with the gradient scale applied first, the CPU kernels' one
// sequence) in the correctly rounded intrinsics (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn,
// __fsqrt_rn). Those are never contracted into FMAs, whatever the compiler flags; the file is
// also compiled with --fmad=false --prec-div=true --prec-sqrt=true --ftz=false
// (cuda/CMakeLists.txt) so nothing else rounds differently either.
#include <cstdint>

#include "collectives/nccl/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace hsdp::gpu {
namespace {

// The per-call constants: hsdp::AdamCoeffs, computed on the host by hsdp::adamCoefficients
// exactly as hsdp::adamStep and hsdp::CpuAdam take them.
using Coeffs = AdamCoeffs;

// A float whose operations are the correctly rounded intrinsics (__fmul_rn, __fadd_rn,
// __fsub_rn, __fdiv_rn, __fsqrt_rn): never contracted into FMAs, whatever the compiler flags.
// constexpr, as device code may call adamUpdate only when all it calls is (relaxed constexpr),
// and so device code only: the host pass, which compiles constexpr functions too, has no such
// intrinsics and never calls these.
struct Rn {
  float x;
  constexpr __device__ Rn(float v) : x(v) {}  // NOLINT: implicit, for the coefficients
#if defined(__CUDA_ARCH__)
  friend constexpr __device__ Rn operator*(Rn a, Rn b) { return __fmul_rn(a.x, b.x); }
  friend constexpr __device__ Rn operator+(Rn a, Rn b) { return __fadd_rn(a.x, b.x); }
  friend constexpr __device__ Rn operator-(Rn a, Rn b) { return __fsub_rn(a.x, b.x); }
  friend constexpr __device__ Rn operator/(Rn a, Rn b) { return __fdiv_rn(a.x, b.x); }
#endif
};
struct SqrtRn {
#if defined(__CUDA_ARCH__)
  constexpr __device__ Rn operator()(Rn a) const { return __fsqrt_rn(a.x); }
#endif
};

// hsdp::adamUpdate (core/adam_coeffs.h), the CPU kernels' sequence, in Rn.
template <bool kAdamW>
__device__ __forceinline__ void adamElement(const Coeffs& c, float& p, float g, float& m,
                                            float& v) {
  Rn rp = p, rm = m, rv = v;
  adamUpdate<kAdamW>(c, rp, Rn(g), rm, rv, SqrtRn{});
  p = rp.x;
  m = rm.x;
  v = rv.x;
}

// kVec: every array is 16-byte aligned (the bf16 copy 8-byte aligned), so groups of four
// elements move as float4 / one 8-byte store; the last n % 4 elements take the scalar loop.
template <bool kAdamW, bool kBf16, bool kVec>
__global__ void __launch_bounds__(detail::kThreads)
    adamKernel(Coeffs c, float* __restrict__ param, const float* __restrict__ grad,
               float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
               unsigned short* __restrict__ param_bf16, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  size_t scalar_begin = 0;
  if constexpr (kVec) {
    const size_t groups = n / 4;
    auto* p4 = reinterpret_cast<float4*>(param);
    auto* g4 = reinterpret_cast<const float4*>(grad);
    auto* m4 = reinterpret_cast<float4*>(exp_avg);
    auto* v4 = reinterpret_cast<float4*>(exp_avg_sq);
    for (size_t i = tid; i < groups; i += stride) {
      float4 p = p4[i], m = m4[i], v = v4[i];
      const float4 g = __ldcs(g4 + i);  // read once: stream it past the caches
      adamElement<kAdamW>(c, p.x, g.x, m.x, v.x);
      adamElement<kAdamW>(c, p.y, g.y, m.y, v.y);
      adamElement<kAdamW>(c, p.z, g.z, m.z, v.z);
      adamElement<kAdamW>(c, p.w, g.w, m.w, v.w);
      p4[i] = p;
      m4[i] = m;
      v4[i] = v;
      if constexpr (kBf16) {
        uint2 b;
        b.x = static_cast<unsigned>(detail::bf16Bits(p.x)) |
              (static_cast<unsigned>(detail::bf16Bits(p.y)) << 16);
        b.y = static_cast<unsigned>(detail::bf16Bits(p.z)) |
              (static_cast<unsigned>(detail::bf16Bits(p.w)) << 16);
        reinterpret_cast<uint2*>(param_bf16)[i] = b;
      }
    }
    scalar_begin = groups * 4;
  }
  for (size_t i = scalar_begin + tid; i < n; i += stride) {
    float p = param[i], m = exp_avg[i], v = exp_avg_sq[i];
    adamElement<kAdamW>(c, p, grad[i], m, v);
    param[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if constexpr (kBf16) param_bf16[i] = detail::bf16Bits(p);
  }
}

template <bool kAdamW, bool kBf16>
void launchAdam(const Coeffs& c, const AdamShard& s, cudaStream_t stream) {
  auto aligned = [](const void* p, uintptr_t a) {
    return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0;
  };
  const bool vec = aligned(s.param, 16) && aligned(s.grad, 16) && aligned(s.exp_avg, 16) &&
                   aligned(s.exp_avg_sq, 16) && (!kBf16 || aligned(s.param_bf16, 8));
  auto* bf = reinterpret_cast<unsigned short*>(s.param_bf16);
  if (vec) {
    adamKernel<kAdamW, kBf16, true>
        <<<detail::gridFor((s.n + 3) / 4), detail::kThreads, 0, stream>>>(
            c, s.param, s.grad, s.exp_avg, s.exp_avg_sq, bf, s.n);
  } else {
    adamKernel<kAdamW, kBf16, false><<<detail::gridFor(s.n), detail::kThreads, 0, stream>>>(
        c, s.param, s.grad, s.exp_avg, s.exp_avg_sq, bf, s.n);
  }
}

}  // namespace

Status adamStep(const AdamConfig& cfg, int64_t t, const AdamShard& shard, cudaStream_t stream,
                float grad_scale) {
  HSDP_RETURN_IF_ERROR(checkAdamStep(cfg, t, shard, grad_scale, "GPU Adam"));
  if (shard.n == 0) return okStatus();

  // Exactly as hsdp::adamStep takes them (bias corrections in double, rounded to float once).
  const Coeffs c = adamCoefficients(cfg, t, grad_scale);
  const bool adamw = c.adamw;
  const bool bf16_out = shard.param_bf16 != nullptr;
  if (adamw && bf16_out)
    launchAdam<true, true>(c, shard, stream);
  else if (adamw)
    launchAdam<true, false>(c, shard, stream);
  else if (bf16_out)
    launchAdam<false, true>(c, shard, stream);
  else
    launchAdam<false, false>(c, shard, stream);
  HSDP_CUDA_CHECK(cudaGetLastError());
  return okStatus();
}

}  // namespace hsdp::gpu
