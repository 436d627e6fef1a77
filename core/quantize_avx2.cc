// The AVX2 quantization kernels (int8): 16 elements per step as two 8-lane vectors; AVX2 has no
// cheap masked byte stores, so a block's last len % 16 elements run the scalar element functions
// compiled in this file (the same bits). Built with -mavx2 plus -ffp-contract=off; the dispatcher
// calls them only when __builtin_cpu_supports("avx2"). See quantize_kernels.h for the rules.
#include <immintrin.h>

#include "core/quantize_kernels.h"

namespace hsdp::quant_detail {
namespace {

template <bool kRes>
inline __m256 load(const float* s, const float* r, size_t i) {
  __m256 x = _mm256_loadu_ps(s + i);
  if constexpr (kRes) x = _mm256_add_ps(x, _mm256_loadu_ps(r + i));
  return x;
}

template <bool kRes>
uint32_t absMax(const float* s, const float* r, size_t len) {
  const __m256i abs_mask = _mm256_set1_epi32(static_cast<int>(kAbsMask));
  auto bits = [&](size_t at) {
    return _mm256_and_si256(_mm256_castps_si256(load<kRes>(s, r, at)), abs_mask);
  };
  // Four independent maxima per step, so the loads, not one max chain, set the pace.
  __m256i m = _mm256_setzero_si256(), m1 = m, m2 = m, m3 = m;
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    m = _mm256_max_epu32(m, bits(i));
    m1 = _mm256_max_epu32(m1, bits(i + 8));
    m2 = _mm256_max_epu32(m2, bits(i + 16));
    m3 = _mm256_max_epu32(m3, bits(i + 24));
  }
  m = _mm256_max_epu32(_mm256_max_epu32(m, m1), _mm256_max_epu32(m2, m3));
  for (; i + 8 <= len; i += 8) m = _mm256_max_epu32(m, bits(i));
  __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
  const uint32_t vec = static_cast<uint32_t>(_mm_cvtsi128_si32(h));
  const uint32_t tail = absMaxBits<kRes>(s + i, kRes ? r + i : nullptr, len - i);
  return vec > tail ? vec : tail;
}

// 8 codes of x * inv, clamped to [-127, 127]; with error feedback the residual is stored.
template <bool kRes>
inline __m256i codes8(const float* s, float* r, size_t i, __m256 inv, __m256 scale) {
  const __m256 x = load<kRes>(s, r, i);
  __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(x, inv));
  q = _mm256_max_epi32(_mm256_min_epi32(q, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
  if constexpr (kRes)
    _mm256_storeu_ps(r + i, _mm256_sub_ps(x, _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale)));
  return q;
}

// The block functions, for encodeAll8 / decodeAll8 (quantize_kernels.h).
struct Blocks {
  template <bool kRes>
  static void encode(const float* s, float* r, size_t len, unsigned char* out) {
    const BlockParams p = blockParams(absMax<kRes>(s, r, len), 127.0f);
    storeScale(out, p.scale);
    auto* codes = reinterpret_cast<signed char*>(out + 4);
    if (p.kind != BlockKind::kNormal) return encodeTail8(p, s, kRes ? r : nullptr, 0, len, codes);
    const __m256 inv = _mm256_set1_ps(p.inv), scale = _mm256_set1_ps(p.scale);
    size_t i = 0;
    for (; i + 16 <= len; i += 16) {
      const __m256i a = codes8<kRes>(s, r, i, inv, scale);
      const __m256i b = codes8<kRes>(s, r, i + 8, inv, scale);
      const __m128i wa = _mm_packs_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
      const __m128i wb = _mm_packs_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm_packs_epi16(wa, wb));
    }
    encodeTail8(p, s, kRes ? r : nullptr, i, len, codes);
  }

  template <bool kAcc>
  static void decode(float scale_value, const signed char* codes, size_t len, float* d) {
    const __m256 scale = _mm256_set1_ps(scale_value);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
      const __m256i q =
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
      __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale);
      if constexpr (kAcc) v = _mm256_add_ps(_mm256_loadu_ps(d + i), v);
      _mm256_storeu_ps(d + i, v);
    }
    decodeTail8(scale_value, codes, i, len, d, kAcc);
  }
};

constexpr Kernels kTable = {encodeAll8<Blocks>, decodeAll8<Blocks>, encode4All, decode4All};

}  // namespace

const Kernels& kernelsAvx2() { return kTable; }

}  // namespace hsdp::quant_detail
