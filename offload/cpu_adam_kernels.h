// Private to offload/: the per-ISA CPU Adam kernels and what they share.
//
// The kernels live in one translation unit per ISA (cpu_adam_scalar.cc, cpu_adam_avx2.cc,
// cpu_adam_avx512.cc), each compiled with its own -m flags (offload/CMakeLists.txt). Such a
// translation unit must not emit any function with external or vague (inline/template) linkage
// other than its kernel entry point: the linker keeps one copy of each inline function for the
// whole program, and if it kept the AVX-512 copy of, say, an inline helper from a shared header,
// the scalar path would execute AVX-512 instructions on a CPU without them (SIGILL). Hence:
//  - everything in this header except the entry points has internal linkage (anonymous
//    namespace), so each translation unit gets its own copy built with its own flags;
//  - this header includes only freestanding headers (no <cmath>, no hsdp/dtype.h: their inline
//    functions would be emitted with the ISA's flags);
//  - the test cpu_adam_isa_symbols checks the object files for stray weak symbols.
//
// Bitwise contract: every path computes each element with the same IEEE-754 single-precision
// operations in the same order as hsdp::adamStep (core/optimizer.cc), all correctly rounded
// (+, -, *, / and sqrt are, in scalar SSE and in AVX/AVX-512 alike), with no FMA contraction
// (-ffp-contract=off, and no FMA intrinsics). So the ISAs and any thread count give bitwise
// identical results, and a training run does not depend on which machine ran the optimizer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/adam_coeffs.h"
#include "core/float_bits.h"

namespace hsdp::cpu_adam_detail {

// The per-call constants: hsdp::AdamCoeffs (core/adam_coeffs.h, freestanding), computed once by
// the dispatcher (cpu_adam.cc) with hsdp::adamCoefficients, as adamStep does.
using hsdp::AdamCoeffs;

// One contiguous range of a shard. param_bf16 may be null (no copy-out).
struct AdamSpan {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  uint16_t* param_bf16 = nullptr;
  size_t n = 0;
};

using KernelFn = void (*)(const AdamCoeffs&, const AdamSpan&);

// Entry points, one per translation unit. The AVX ones exist only in x86-64 builds
// (HSDP_CPU_ADAM_X86) and may only be called when the CPU supports their ISA.
void adamKernelScalar(const AdamCoeffs& c, const AdamSpan& s);
#if defined(HSDP_CPU_ADAM_X86)
void adamKernelAvx2(const AdamCoeffs& c, const AdamSpan& s);
void adamKernelAvx512(const AdamCoeffs& c, const AdamSpan& s);
#endif

// Splits [0, n) into `parts` ranges for the worker threads; returns parts + 1 boundaries, the
// first 0 and the last n. Interior boundaries fall on elements whose param address is a
// multiple of 64 bytes and are a multiple of kChunkGranule elements apart, so two threads never
// write the same cache line of param, exp_avg, exp_avg_sq (when those share param's alignment
// modulo 64, as page-aligned shard buffers do) nor of the bf16 copy (32 elements = 64 bytes).
// Ranges may be empty when n is small.
constexpr size_t kChunkGranule = 32;
void chunkBoundaries(const float* param, size_t n, int parts, size_t* out);

namespace {

using simd::bitsToFloat;
using simd::floatToBits;

// Round to nearest even, NaN stays a (quiet) NaN: the same function as hsdp::toBf16
// (include/hsdp/dtype.h), restated here for the linkage reason above; the tests compare the two.
// Written as a select rather than an early return so that the compiler vectorises the scalar
// path's loop (the baseline build has SSE2).
inline uint16_t bf16Bits(float f) {
  const uint32_t u = floatToBits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// One element, operation for operation the loop body of hsdp::adamStep with the gradient scale
// applied first (multiplying by 1 is exact, so grad_scale = 1 is adamStep bit for bit). The
// vector kernels restate this sequence lane-wise; keep them in step with it.
template <bool kAdamW>
inline void adamElement(const AdamCoeffs& c, float& p, float g, float& m, float& v) {
  float gi = g * c.grad_scale;
  float pi = p;
  if constexpr (kAdamW) pi = pi * c.decay;
  else gi = gi + c.weight_decay * pi;
  const float mi = c.beta1 * m + c.one_minus_beta1 * gi;
  const float vi = c.beta2 * v + c.one_minus_beta2 * gi * gi;
  m = mi;
  v = vi;
  // __builtin_sqrtf, not std::sqrt: see the linkage note at the top. With -fno-math-errno it is
  // one correctly rounded sqrtss, like the vector kernels' sqrtps.
  p = pi - c.step_size * mi / (__builtin_sqrtf(vi) * c.inv_sqrt_bc2 + c.eps);
}

// The scalar loop, for the scalar path and the AVX2 path's unaligned head and tail.
template <bool kAdamW, bool kBf16>
inline void adamScalarRange(const AdamCoeffs& coeffs, const AdamSpan& s, size_t begin,
                            size_t end) {
  // A local copy: the compiler cannot otherwise prove that the float stores to the arrays leave
  // the coefficients alone, and would reload them every element instead of vectorising.
  const AdamCoeffs c = coeffs;
  for (size_t i = begin; i < end; ++i) {
    adamElement<kAdamW>(c, s.param[i], s.grad[i], s.exp_avg[i], s.exp_avg_sq[i]);
    if constexpr (kBf16) s.param_bf16[i] = bf16Bits(s.param[i]);
  }
}

// Elements before the first `align`-byte-aligned param address (all of them if n is smaller).
inline size_t headElements(const float* p, size_t n, size_t align) {
  const size_t mis = reinterpret_cast<uintptr_t>(p) % align;
  size_t head = mis == 0 ? 0 : (align - mis) / sizeof(float);
  if (mis % sizeof(float) != 0) head = 0;  // not even float-aligned: no alignment is reachable
  return head < n ? head : n;
}

// Calls f.template operator()<kAdamW, kBf16>() for the runtime flags: the kernels are
// instantiated per combination so the inner loops carry no per-element branches.
template <typename F>
inline void dispatchFlags(const AdamCoeffs& c, const AdamSpan& s, F&& f) {
  const bool bf16 = s.param_bf16 != nullptr;
  if (c.adamw) {
    if (bf16) f.template operator()<true, true>();
    else f.template operator()<true, false>();
  } else {
    if (bf16) f.template operator()<false, true>();
    else f.template operator()<false, false>();
  }
}

}  // namespace
}  // namespace hsdp::cpu_adam_detail
