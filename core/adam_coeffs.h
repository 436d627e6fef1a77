// The per-call constants of one Adam/AdamW step: what every implementation of the step reads
// (hsdp::adamStep, the CPU Adam's scalar / AVX2 / AVX-512 kernels, the CUDA kernel), computed once
// on the host by hsdp::adamCoefficients (core/adam.h): the bias corrections in double, each
// rounded to float once. That one computation is half of why the implementations agree bit for
// bit (the other half: the same float operations per element).
//
// Beside them, adamUpdate: the per-element operations themselves, written once for the CPU Adam's
// scalar and vector kernels and the CUDA kernel.
//
// Freestanding on purpose (no includes) and of internal linkage: the CPU Adam's per-ISA
// translation units include it, and they may not emit inline functions of shared headers
// (offload/cpu_adam_kernels.h).
#pragma once

namespace hsdp {

struct AdamCoeffs {
  float beta1 = 0, beta2 = 0;
  float one_minus_beta1 = 0, one_minus_beta2 = 0;
  float step_size = 0;     // lr / (1 - beta1^t), rounded from double
  float inv_sqrt_bc2 = 0;  // 1 / sqrt(1 - beta2^t), likewise
  float eps = 0;
  float weight_decay = 0;  // Adam: g += wd * p
  float decay = 1;         // AdamW: p *= 1 - lr * wd
  float grad_scale = 1;    // g *= grad_scale first (1/loss scale, clip coefficient, or both)
  bool adamw = true;
  // CPU only: write the bf16 copy with non-temporal (streaming) stores where aligned. A plain
  // store to a line not in cache first reads the line (read-for-ownership), so the 2-byte copy
  // would move 4 bytes; streaming moves 2. Worth it only when the copy would leave the cache
  // before the all-gather reads it anyway (offload/cpu_adam.cc decides). The GPU ignores it.
  bool stream_bf16 = false;
};

namespace {

// One element of the step, operation for operation the loop body of hsdp::adamStep
// (core/optimizer.cc) with the gradient scale applied first (multiplying by 1 is exact, so
// grad_scale = 1 is adamStep bit for bit). T is whatever each implementation computes in, each
// operation correctly rounded and none fused: a float (compiled with -ffp-contract=off), a SIMD
// register of floats (c: the coefficients broadcast under the same names), the CUDA kernel's
// wrapper of the _rn intrinsics. sqrt is the implementation's correctly rounded square root.
// constexpr so that device code may call it (nvcc --expt-relaxed-constexpr).
template <bool kAdamW, typename K, typename T, typename Sqrt>
constexpr void adamUpdate(const K& c, T& p, T g, T& m, T& v, Sqrt sqrt) {
  T gi = g * c.grad_scale;
  T pi = p;
  if constexpr (kAdamW)
    pi = pi * c.decay;
  else
    gi = gi + c.weight_decay * pi;
  const T mi = c.beta1 * m + c.one_minus_beta1 * gi;
  const T vi = c.beta2 * v + c.one_minus_beta2 * gi * gi;
  m = mi;
  v = vi;
  p = pi - c.step_size * mi / (sqrt(vi) * c.inv_sqrt_bc2 + c.eps);
}

}  // namespace

}  // namespace hsdp
