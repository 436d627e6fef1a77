// The AVX-512 quantization kernels (int8): 16 elements per vector, masked loads and stores for a
// block's tail. Built with -mavx512f plus -ffp-contract=off; the dispatcher calls them only when
// __builtin_cpu_supports("avx512f"). cvtps2dq rounds to nearest even in the default MXCSR mode,
// as roundEven does. See quantize_kernels.h for the rules of this file.
// GCC 12 reports its own _mm512_undefined_* (`__m512i __Y = __Y;`) as maybe-uninitialized once
// the conversions are inlined (GCC PR 105593, fixed in 13): not a fault of this file.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "core/quantize_kernels.h"

namespace hsdp::quant_detail {
namespace {

template <bool kRes>
inline __m512 load(const float* s, const float* r, size_t i, __mmask16 k) {
  __m512 x = _mm512_maskz_loadu_ps(k, s + i);
  if constexpr (kRes) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(k, r + i));
  return x;
}

inline __mmask16 tailMask(size_t left) { return static_cast<__mmask16>((1u << left) - 1u); }

template <bool kRes>
uint32_t absMax(const float* s, const float* r, size_t len) {
  const __m512i abs_mask = _mm512_set1_epi32(static_cast<int>(kAbsMask));
  __m512i m = _mm512_setzero_si512();
  size_t i = 0;
  for (; i + 16 <= len; i += 16) {
    const __m512 x = load<kRes>(s, r, i, 0xffff);
    m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_castps_si512(x), abs_mask));
  }
  if (i < len) {
    const __m512 x = load<kRes>(s, r, i, tailMask(len - i));
    m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_castps_si512(x), abs_mask));
  }
  return static_cast<uint32_t>(_mm512_reduce_max_epu32(m));
}

template <bool kRes>
inline void encodeLanes(const float* s, float* r, size_t i, signed char* codes, __mmask16 k,
                        __m512 inv, __m512 scale) {
  const __m512 x = load<kRes>(s, r, i, k);
  __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(x, inv));
  q = _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
  _mm512_mask_cvtsepi32_storeu_epi8(codes + i, k, q);
  if constexpr (kRes) {
    const __m512 d = _mm512_mul_ps(_mm512_cvtepi32_ps(q), scale);
    _mm512_mask_storeu_ps(r + i, k, _mm512_sub_ps(x, d));
  }
}

// The block functions, for encodeAll8 / decodeAll8 (quantize_kernels.h).
struct Blocks {
  template <bool kRes>
  static void encode(const float* s, float* r, size_t len, unsigned char* out) {
    const BlockParams p = blockParams(absMax<kRes>(s, r, len), 127.0f);
    storeScale(out, p.scale);
    auto* codes = reinterpret_cast<signed char*>(out + 4);
    if (p.kind != BlockKind::kNormal) return encodeTail8(p, s, kRes ? r : nullptr, 0, len, codes);
    const __m512 inv = _mm512_set1_ps(p.inv), scale = _mm512_set1_ps(p.scale);
    size_t i = 0;
    for (; i + 16 <= len; i += 16) encodeLanes<kRes>(s, r, i, codes, 0xffff, inv, scale);
    if (i < len) encodeLanes<kRes>(s, r, i, codes, tailMask(len - i), inv, scale);
  }

  template <bool kAcc>
  static void decode(float scale_value, const signed char* codes, size_t len, float* d) {
    const __m512 scale = _mm512_set1_ps(scale_value);
    size_t i = 0;
    for (; i + 16 <= len; i += 16) {
      const __m512i q =
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)));
      __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(q), scale);
      if constexpr (kAcc) v = _mm512_add_ps(_mm512_loadu_ps(d + i), v);
      _mm512_storeu_ps(d + i, v);
    }
    decodeTail8(scale_value, codes, i, len, d, kAcc);
  }
};

constexpr Kernels kTable = {encodeAll8<Blocks>, decodeAll8<Blocks>, encode4All, decode4All};

}  // namespace

const Kernels& kernelsAvx512() { return kTable; }

}  // namespace hsdp::quant_detail
