// Private to the SIMD kernels: the AVX2 traits the vector kernels are written over (the CPU
// Adam's adamVectorKernel in offload/cpu_adam_kernels.h, the quantizers' kVectorKernels in
// core/quantize_kernels.h, which say what each operation must do). For translation units built
// with -mavx2 only; of internal linkage, as everything those units include (cpu_adam_kernels.h
// says why). AVX2 has no cheap masked stores, so kMasked is false: the kernels run a span's
// unaligned head and tail with their scalar element functions.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "core/float_bits.h"

namespace hsdp::simd {
namespace {

struct Avx2 {
  using F = __m256;   // 8 floats
  using I = __m256i;  // 8 int32
  static constexpr bool kMasked = false;

  static F set1(float x) { return _mm256_set1_ps(x); }
  static F load(const float* p, AllLanes) { return _mm256_loadu_ps(p); }
  static void store(float* p, F x, AllLanes) { _mm256_storeu_ps(p, x); }
  static F sqrt(F x) { return _mm256_sqrt_ps(x); }
  static void fence() { _mm_sfence(); }

  // The low 16 bits of each 32-bit lane of `bits`, to dst (kStream: non-temporal).
  template <bool kStream, class U>
  static void storeBf16(uint16_t* dst, U bits, AllLanes) {
    const __m256i r = __builtin_bit_cast(__m256i, bits);
    // Every lane is <= 0xffff, so the unsigned-saturating pack is exact.
    const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    auto* d = reinterpret_cast<__m128i*>(dst);
    if constexpr (kStream)
      _mm_stream_si128(d, h);
    else
      _mm_storeu_si128(d, h);
  }

  static I absBits(F x) {
    return _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fffffff));
  }
  static I zero() { return _mm256_setzero_si256(); }
  static I maxu(I a, I b) { return _mm256_max_epu32(a, b); }
  static uint32_t reduceMaxu(I m) {
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
    return static_cast<uint32_t>(_mm_cvtsi128_si32(h));
  }
  static I codes(F y) {
    const I q = _mm256_cvtps_epi32(y);
    return _mm256_max_epi32(_mm256_min_epi32(q, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
  }
  static F toFloat(I q) { return _mm256_cvtepi32_ps(q); }
  // Codes in [-127, 127] as int8: the signed-saturating packs are exact.
  static __m128i packCodes16(I q) {
    return _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
  }
  static void storeCodes(signed char* dst, I a, I b) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst),
                     _mm_packs_epi16(packCodes16(a), packCodes16(b)));
  }
  static void storeCodes(signed char* dst, I q, AllLanes) {
    const __m128i w = packCodes16(q);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm_packs_epi16(w, w));
  }
  static I loadCodes(const signed char* p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
};

}  // namespace
}  // namespace hsdp::simd
