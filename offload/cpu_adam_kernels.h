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

// Round to nearest even, NaN stays a (quiet) NaN, on a float's bit pattern u: the same function
// as hsdp::toBf16 (include/hsdp/dtype.h), restated here for the linkage reason above; the tests
// compare the two. One formula for a lane and for a vector of them: U is uint32_t or an unsigned
// 32-bit vector, I the signed integer of its width (GCC/Clang vector types: >>, &, +, | and > act
// lane-wise, and ?: selects lane-wise). Written as a select rather than an early return so that
// the compiler vectorises the scalar path's loop (the baseline build has SSE2).
template <typename U, typename I>
inline U bf16Round(U u) {
  const U hi = u >> 16;
  const U rounded = (u + ((hi & 1u) + 0x7fffu)) >> 16;
  const U quiet_nan = hi | 0x40u;
  return __builtin_bit_cast(I, u & 0x7fffffffu) > static_cast<int32_t>(0x7f800000) ? quiet_nan
                                                                                   : rounded;
}

inline uint16_t bf16Bits(float f) {
  return static_cast<uint16_t>(bf16Round<uint32_t, int32_t>(floatToBits(f)));
}

// A lane's sqrt: __builtin_sqrtf, not std::sqrt (see the linkage note at the top). With
// -fno-math-errno it is one correctly rounded sqrtss, like the vector kernels' sqrtps.
inline float sqrtLane(float x) { return __builtin_sqrtf(x); }

// The scalar loop, for the scalar path and the AVX2 path's unaligned head and tail.
template <bool kAdamW, bool kBf16>
inline void adamScalarRange(const AdamCoeffs& coeffs, const AdamSpan& s, size_t begin, size_t end) {
  // A local copy: the compiler cannot otherwise prove that the float stores to the arrays leave
  // the coefficients alone, and would reload them every element instead of vectorising.
  const AdamCoeffs c = coeffs;
  for (size_t i = begin; i < end; ++i) {
    adamUpdate<kAdamW>(c, s.param[i], s.grad[i], s.exp_avg[i], s.exp_avg_sq[i], sqrtLane);
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
    if (bf16)
      f.template operator()<true, true>();
    else
      f.template operator()<true, false>();
  } else {
    if (bf16)
      f.template operator()<false, true>();
    else
      f.template operator()<false, false>();
  }
}

// The vector kernels (cpu_adam_avx2.cc, cpu_adam_avx512.cc), written once over an ISA's traits
// V (core/simd_avx2.h, core/simd_avx512.h):
//   F               a register of floats (a GCC/Clang vector type: + - * / compile to the same
//                   add/sub/mul/div instructions as the ISA's intrinsics, which are defined that
//                   way);
//   set1, sqrt      broadcast a float; the correctly rounded lane-wise sqrt;
//   load, store     of a register of floats, storeBf16<kStream> of the low 16 bits of each lane
//                   of an IntLanes<sizeof(F)>::U (kStream: non-temporal, to a 2 * lanes-byte
//                   aligned address), each given AllLanes{} or, when kMasked, a Mask of the first
//                   count lanes (mask(count), count < lanes) whose loads suppress faults on the
//                   others;
//   kMasked         whether the unaligned head and the tail run as one masked vector each (masked
//                   stores are slower than plain ones on some cores, AMD Zen 4, so only there) or,
//                   for an ISA without cheap masked stores, the scalar loop (the same bits);
//   fence           orders streaming stores before the kernel returns.
using simd::AllLanes;

// The unsigned and signed 32-bit lanes of a register of kBytes (for bf16Round).
template <size_t kBytes>
struct IntLanes {
  typedef uint32_t U __attribute__((vector_size(kBytes)));
  typedef int32_t I __attribute__((vector_size(kBytes)));
};

template <typename V>
struct AdamLanes {
  using F = typename V::F;
  F beta1, beta2, one_minus_beta1, one_minus_beta2, step_size, inv_sqrt_bc2, eps, weight_decay,
      decay, grad_scale;
  explicit AdamLanes(const AdamCoeffs& c)
      : beta1(V::set1(c.beta1)),
        beta2(V::set1(c.beta2)),
        one_minus_beta1(V::set1(c.one_minus_beta1)),
        one_minus_beta2(V::set1(c.one_minus_beta2)),
        step_size(V::set1(c.step_size)),
        inv_sqrt_bc2(V::set1(c.inv_sqrt_bc2)),
        eps(V::set1(c.eps)),
        weight_decay(V::set1(c.weight_decay)),
        decay(V::set1(c.decay)),
        grad_scale(V::set1(c.grad_scale)) {}
};

// One register of elements from i: every lane (lanes: AllLanes) or the first few (a V::Mask).
template <typename V, bool kAdamW, bool kBf16, bool kStream, typename Lanes>
inline void adamVector(const AdamLanes<V>& k, const AdamSpan& s, size_t i, Lanes lanes) {
  using F = typename V::F;
  F p = V::load(s.param + i, lanes);
  F m = V::load(s.exp_avg + i, lanes);
  F v = V::load(s.exp_avg_sq + i, lanes);
  adamUpdate<kAdamW>(k, p, V::load(s.grad + i, lanes), m, v, [](F x) { return V::sqrt(x); });
  V::store(s.param + i, p, lanes);
  V::store(s.exp_avg + i, m, lanes);
  V::store(s.exp_avg_sq + i, v, lanes);
  if constexpr (kBf16) {
    using L = IntLanes<sizeof(F)>;
    const auto bits = bf16Round<typename L::U, typename L::I>(__builtin_bit_cast(typename L::U, p));
    V::template storeBf16<kStream>(s.param_bf16 + i, bits, lanes);
  }
}

// A head up to the first register-aligned param element, full registers (loads of the other
// arrays are unaligned when their alignment differs, which costs little), a tail.
template <typename V, bool kAdamW, bool kBf16>
void adamVectorRange(const AdamCoeffs& c, const AdamSpan& s) {
  constexpr size_t kLanes = sizeof(typename V::F) / sizeof(float);
  const AdamLanes<V> k(c);
  const size_t head = headElements(s.param, s.n, sizeof(typename V::F));
  if constexpr (V::kMasked) {
    if (head > 0) adamVector<V, kAdamW, kBf16, false>(k, s, 0, V::mask(head));
  } else {
    adamScalarRange<kAdamW, kBf16>(c, s, 0, head);
  }
  size_t i = head;
  const bool stream = kBf16 && c.stream_bf16 &&
                      reinterpret_cast<uintptr_t>(s.param_bf16 + head) % (2 * kLanes) == 0;
  if (stream) {
    for (; i + kLanes <= s.n; i += kLanes) adamVector<V, kAdamW, kBf16, true>(k, s, i, AllLanes{});
    V::fence();  // streaming stores are weakly ordered: publish them before returning
  } else {
    for (; i + kLanes <= s.n; i += kLanes) adamVector<V, kAdamW, kBf16, false>(k, s, i, AllLanes{});
  }
  if constexpr (V::kMasked) {
    if (i < s.n) adamVector<V, kAdamW, kBf16, false>(k, s, i, V::mask(s.n - i));
  } else {
    adamScalarRange<kAdamW, kBf16>(c, s, i, s.n);
  }
}

// An ISA's entry point: its traits' kernel for the runtime flags.
template <typename V>
inline void adamVectorKernel(const AdamCoeffs& c, const AdamSpan& s) {
  dispatchFlags(c, s, [&]<bool kAdamW, bool kBf16>() { adamVectorRange<V, kAdamW, kBf16>(c, s); });
}

}  // namespace
}  // namespace hsdp::cpu_adam_detail
