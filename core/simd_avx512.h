// Private to the SIMD kernels: the AVX-512 traits the vector kernels are written over (the CPU
// Adam's adamVectorKernel in offload/cpu_adam_kernels.h, the quantizers' kVectorKernels in
// core/quantize_kernels.h, which say what each operation must do). For translation units built
// with -mavx512f only (AVX512F instructions alone, so every AVX-512 CPU runs them); of internal
// linkage, as everything those units include (cpu_adam_kernels.h says why). Masked loads and
// stores (kMasked) run a span's head and tail as one register each; masked loads read zeros and
// suppress faults on the lanes outside the mask.
#pragma once

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_*
// (`__m512i __Y = __Y;`) once the conversions are inlined (GCC bug 105593, fixed in GCC 13): the
// warning is about the header, not the kernels, and is reported where the kernels inline.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "core/float_bits.h"

namespace hsdp::simd {
namespace {

struct Avx512 {
  using F = __m512;   // 16 floats
  using I = __m512i;  // 16 int32
  using Mask = __mmask16;
  static constexpr bool kMasked = true;

  static Mask mask(size_t count) { return static_cast<Mask>((1u << count) - 1u); }  // count < 16
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F load(const float* p, AllLanes) { return _mm512_loadu_ps(p); }
  static F load(const float* p, Mask k) { return _mm512_maskz_loadu_ps(k, p); }
  static void store(float* p, F x, AllLanes) { _mm512_storeu_ps(p, x); }
  static void store(float* p, F x, Mask k) { _mm512_mask_storeu_ps(p, k, x); }
  static F sqrt(F x) { return _mm512_sqrt_ps(x); }
  static void fence() { _mm_sfence(); }

  // The low 16 bits of each 32-bit lane of `bits`, to dst (kStream: non-temporal).
  template <bool kStream, class U>
  static void storeBf16(uint16_t* dst, U bits, AllLanes) {
    const __m256i h = _mm512_cvtepi32_epi16(__builtin_bit_cast(__m512i, bits));
    auto* d = reinterpret_cast<__m256i*>(dst);
    if constexpr (kStream)
      _mm256_stream_si256(d, h);
    else
      _mm256_storeu_si256(d, h);
  }
  template <bool kStream, class U>
  static void storeBf16(uint16_t* dst, U bits, Mask k) {
    _mm512_mask_cvtepi32_storeu_epi16(dst, k, __builtin_bit_cast(__m512i, bits));
  }

  static I absBits(F x) {
    return _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
  }
  static I zero() { return _mm512_setzero_si512(); }
  static I maxu(I a, I b) { return _mm512_max_epu32(a, b); }
  static uint32_t reduceMaxu(I m) { return static_cast<uint32_t>(_mm512_reduce_max_epu32(m)); }
  static I codes(F y) {
    const I q = _mm512_cvtps_epi32(y);
    return _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
  }
  static F toFloat(I q) { return _mm512_cvtepi32_ps(q); }
  static void storeCodes(signed char* dst, I a, I b) {
    storeCodes(dst, a, AllLanes{});
    storeCodes(dst + 16, b, AllLanes{});
  }
  static void storeCodes(signed char* dst, I q, AllLanes) { storeCodes(dst, q, Mask{0xffff}); }
  static void storeCodes(signed char* dst, I q, Mask k) {
    _mm512_mask_cvtsepi32_storeu_epi8(dst, k, q);
  }
  static I loadCodes(const signed char* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};

}  // namespace
}  // namespace hsdp::simd
